"""SGLang's router (:class:`paravt.engines.sglang_router.SGLangRouter`, the real ``sglang-router`` of
requirements/cpu.txt) in front of SGLang-API servers on CPU:

* what RL sends crosses it: recorded by two stand-in servers that log what reaches them
  (``tests/engines/sglang_recorder.py``), the router forwards ``input_ids``, ``image_data``,
  ``return_logprob``, ``logprob_start_len``, the sampling parameters and ``custom_logit_processor`` (the
  vision-token ban, byte for byte) and drops ``sampling_params.logit_bias`` and
  ``spaces_between_special_tokens``; the forwarded body is kept in ``tests/conformance/sglang_router_generate.json``,
  which the conformance group decodes with SGLang's own request type and whose processor it runs through
  SGLang's own sampler code;
* every request of an episode (its sub-agents' too) reaches one server, new episodes spread over both, and the
  router's per-server counts are the pool's metric; a dead server is evicted with one line, removed from the
  router, and its episode's next request is served by the other;
* the router is ready only with every server healthy and dies with the process that started it;
* in front of two real ``hf_server`` processes serving the tiny model (started with
  ``--enable-custom-logit-processor``), RL's request through the router equals the direct request, and a server
  started without the flag refuses the processor with SGLang's own words.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from PIL import Image

from paravt.engines.base import EngineError, SamplingParams
from paravt.engines.router import RoutedPool, RouterConfig
from paravt.engines.sglang import SGLangEngine
from paravt.engines.sglang_logit_processor import processor_string
from paravt.engines.sglang_protocol import generate_payload
from paravt.engines.sglang_router import SGLangRouter
from paravt.models.images import ImageInputs
from paravt.models.parallel import free_port
from tests.engines.test_router import _gone

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/conformance/sglang_router_generate.json"
PAD, BANNED = 5, [5, 6, 3, 4]  # the tiny tokenizer's <|image_pad|> and vision ids (any ids would do here)
# RL's request as the fixture holds it: a prompt with one image (one pad: SGLang expands it), a seed, stops
IDS = [1, 2, PAD, 7, 8]
PARAMS = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=16, stop=["</answer>"], stop_token_ids=[9],
                        seed=12345, frequency_penalty=0.3, presence_penalty=0.2)
# fields of our body the router does not forward (its SamplingParams has no such fields) ...
DROPPED = {"sampling_params.logit_bias", "sampling_params.spaces_between_special_tokens"}
# ... and the defaults its GenerateRequest writes out
ADDED = {"model", "return_text_in_logprobs", "log_metrics", "return_hidden_states", "background", "no_logs",
         "return_bytes", "return_entropy"}


def _image() -> ImageInputs:
    return ImageInputs([Image.new("RGB", (8, 8), (200, 40, 40))])


def _wait(url: str, what: str, procs=()) -> None:
    for _ in range(600):
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            time.sleep(0.25)
    for p in procs:
        p.kill()
    pytest.fail(f"{what} at {url} did not start")


def _recorder(log: Path, delay_s: float = 0.0) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.engines.sglang_recorder", "--port", str(port),
                             "--log", str(log), "--delay", str(delay_s)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    _wait(url, "the recorder", [proc])
    return proc, url


def _generates(log: Path) -> list[dict]:
    """The ``/generate`` requests a recorder received: headers (lower-cased) and the parsed body."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        r = json.loads(line)
        if r["path"] == "/generate":
            out.append({"headers": {k.lower(): v for k, v in r["headers"].items()}, "body": json.loads(r["body"])})
    return out


def _flat(body: dict) -> dict:
    """``sampling_params`` spread as ``sampling_params.<key>``, beside the top-level keys."""
    out = {k: v for k, v in body.items() if k != "sampling_params"}
    out.update({f"sampling_params.{k}": v for k, v in (body.get("sampling_params") or {}).items()})
    return out


def _clients(urls: list[str]) -> list[SGLangEngine]:
    return [SGLangEngine(u, banned_token_ids=BANNED, image_token_id=PAD, max_retries=0, request_timeout_s=60)
            for u in urls]


def test_the_ban_is_a_class_named_by_its_ids_and_sglang_rollout_servers_read_it(tmp_path):
    """Without SGLang in this environment: the string names the class (ids sorted), reads back as an instance that
    bans exactly those ids, and SGLang rollout servers start with the flag and this repository importable."""
    import pickle

    import torch

    from paravt.engines import sglang_logit_processor as slp
    from paravt.engines.registry import get_backend
    from paravt.engines.sglang import SGLangServerConfig, launch_command

    s = processor_string([6, 3, 5, 4, 5])
    assert s == processor_string(BANNED) and json.loads(s).keys() == {"callable"}
    assert b"VisionTokenBan_3_4_5_6" in bytes.fromhex(json.loads(s)["callable"])
    assert pickle.loads(bytes.fromhex(json.loads(s)["callable"])) is slp.VisionTokenBan_3_4_5_6
    out = slp.load_processor(s)(torch.zeros(2, 8), [None, None])
    assert torch.isneginf(out[:, 3:7]).all() and not torch.isinf(out[:, [0, 1, 2, 7]]).any()
    with pytest.raises(AttributeError):
        slp.VisionTokenBan_x  # noqa: B018 - only ids name a class
    with pytest.raises(ValueError):
        processor_string([])
    cfg = SGLangServerConfig(model_path="m", **get_backend("sglang").rollout_settings)
    argv, env = launch_command(cfg)
    assert "--enable-custom-logit-processor" in argv and env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
    assert "--enable-custom-logit-processor" not in launch_command(SGLangServerConfig(model_path="m"))[0]


@pytest.fixture
def recorders(tmp_path):
    """Two recording servers (requests held 0.3 s, so an episode's burst is in flight together) and their logs."""
    logs = [tmp_path / "rec0.jsonl", tmp_path / "rec1.jsonl"]
    started = [_recorder(log, 0.3) for log in logs]
    yield [u for _, u in started], logs, [p for p, _ in started]
    for p, _ in started:
        p.kill()
        p.wait(timeout=30)


def test_rl_request_crosses_the_router_with_the_ban_as_a_processor(recorders, tmp_path):
    urls, logs, _ = recorders
    pool = RoutedPool.start(_clients(urls), RouterConfig(log_file=str(tmp_path / "router.log")), router=SGLangRouter)

    async def go():
        try:
            return await pool.for_episode("sample7/3").generate(IDS, _image(), PARAMS)
        finally:
            await pool.close()
    try:
        out = asyncio.run(go())
    finally:
        pool.router.stop()
    assert out.error is None and out.token_ids == [11, 12] and out.logprobs == [-0.5, -0.25]
    got = [r for log in logs for r in _generates(log)]
    assert len(got) == 1 and got[0]["headers"]["x-smg-routing-key"] == "sample7/3"
    forwarded = got[0]["body"]
    sent = generate_payload(IDS, _image(), PARAMS, BANNED, PAD, processor_string(BANNED))
    sent_flat, fwd_flat = _flat(sent), _flat(forwarded)
    assert {k for k in sent_flat if k not in fwd_flat} == DROPPED
    assert {k for k in fwd_flat if k not in sent_flat} == ADDED
    kept = {k: v for k, v in sent_flat.items() if k not in DROPPED}
    assert {k: v for k, v in fwd_flat.items() if k in sent_flat} == kept  # the rest arrives as sent
    assert forwarded["custom_logit_processor"] == processor_string(BANNED)  # the ban, byte for byte
    assert forwarded["input_ids"].count(PAD) == len(forwarded["image_data"]) == 1
    record = {"sent": sent, "forwarded": forwarded, "banned_token_ids": BANNED}
    if os.environ.get("PARAVT_WRITE_ROUTER_FIXTURE") == "1":
        FIXTURE.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")

    def shape(r: dict) -> dict:  # the image's PNG bytes may differ with the PIL/zlib build: its count is the shape
        return {k: {**v, "image_data": len(v["image_data"])} if isinstance(v, dict) else v for k, v in r.items()}
    assert shape(json.loads(FIXTURE.read_text())) == shape(record), (
        f"{FIXTURE.name} is not what sglang-router forwards of our request now: "
        "PARAVT_WRITE_ROUTER_FIXTURE=1 pytest tests/engines/test_sglang_router.py -k crosses rewrites it")


def test_an_episode_stays_on_one_server_new_ones_spread_and_a_dead_server_is_evicted(recorders, tmp_path, caplog):
    urls, logs, procs = recorders
    pool = RoutedPool.start(_clients(urls), RouterConfig(log_file=str(tmp_path / "router.log")), router=SGLangRouter)
    p = SamplingParams(max_new_tokens=2, seed=1)

    async def episode(key: str) -> int:
        """Three turns, the second with three sub-agent requests at once, on the episode's view."""
        view = pool.for_episode(key)
        for turn in range(3):
            outs = await asyncio.gather(*(view.generate(IDS, _image(), p) for _ in range(3 if turn == 1 else 1)))
            assert all(o.error is None for o in outs), [o.error for o in outs]
        return 5

    def keys_on(i: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in _generates(logs[i]):
            k = r["headers"].get("x-smg-routing-key")
            out[k] = out.get(k, 0) + 1
        return out

    async def go():
        try:
            assert await asyncio.gather(*(episode(f"s{i}") for i in range(6))) == [5] * 6
            on = [keys_on(0), keys_on(1)]
            assert not set(on[0]) & set(on[1]), on  # every key on one server
            assert {k: n for d in on for k, n in d.items()} == {f"s{i}": 5 for i in range(6)}
            assert min(len(on[0]), len(on[1])) >= 2, on  # new keys go to the server with fewer requests in flight
            assert pool.take_served() == [sum(on[0].values()), sum(on[1].values())]  # the router's own counts
            # a key's server dies: its next request fails, the server is probed, evicted and removed from the
            # router, and the request is sent again; the router gives the key the live server
            key = next(iter(on[0]))
            procs[0].kill()
            procs[0].wait(timeout=30)
            with caplog.at_level(logging.WARNING):
                out = await pool.for_episode(key).generate(IDS, _image(), p)
            assert out.error is None and pool.evicted and 0 in pool.evicted
            assert keys_on(1).get(key) == 1
            assert pool.router.workers() == [urls[1]]
        finally:
            await pool.close()
    try:
        asyncio.run(go())
    finally:
        pool.router.stop()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and urls[0] in lines[0] and "evicted" in lines[0], lines


def test_rl_builds_sglang_servers_behind_the_router_and_the_pool_without_it(recorders, tiny, tiny_dir, tmp_path):
    """``build_engine("sglang", urls=…, router=…)``, as RL's EngineSync calls it with ``rollout.router`` on (the
    default) and off: the router and its client with the tiny model's ban, or the plain pool."""
    from paravt.engines.factory import build_engine
    from paravt.engines.pool import EnginePool
    from paravt.models.tokenize import vision_token_ids

    urls, logs, _ = recorders
    _, proc = tiny
    handle = build_engine("sglang", str(tiny_dir), proc, urls=urls, replicas=0, max_retries=0,
                          router=RouterConfig(log_file=str(tmp_path / "router.log")))
    try:
        assert isinstance(handle.engine, RoutedPool) and isinstance(handle.engine.router, SGLangRouter)
        assert handle.processes == [handle.engine.router] and handle.urls == urls
        async def one():
            try:
                return await handle.engine.for_episode("k").generate([1, 2, 3], None, SamplingParams(max_new_tokens=2))
            finally:
                await handle.aclose()
        assert asyncio.run(one()).error is None
        body = next(r for log in logs for r in _generates(log))["body"]
        assert body["custom_logit_processor"] == processor_string(vision_token_ids(proc.tokenizer))
    finally:
        handle.stop()
    assert handle.engine.router.proc.poll() is not None
    plain = build_engine("sglang", str(tiny_dir), proc, urls=urls, replicas=0)
    assert type(plain.engine) is EnginePool and not plain.processes
    assert all(e.logit_processor is None for e in plain.engine.engines)  # direct requests keep logit_bias only


def test_the_router_is_ready_with_every_server_and_dies_with_the_process_that_started_it(recorders, tmp_path, caplog):
    urls, _, _ = recorders
    router = SGLangRouter(RouterConfig(log_file=str(tmp_path / "router.log")), urls).start()
    try:
        assert requests.get(router.cfg.url + "/readiness", timeout=5).json()["healthy_workers"] == 2
        assert sorted(router.workers()) == sorted(urls)
        unknown = f"http://127.0.0.1:{free_port()}"
        with caplog.at_level(logging.WARNING, logger="paravt.engines.router"):
            assert router.remove(unknown) is False
        assert [r.getMessage() for r in caplog.records if unknown in r.getMessage()] and len(caplog.records) == 1
        assert router.remove(urls[1]) and router.workers() == [urls[0]]
    finally:
        router.stop()
    assert router.proc.poll() is not None

    silent = f"http://127.0.0.1:{free_port()}"  # nothing listens there: one error, with the router's log tail
    t0 = time.monotonic()
    lone = SGLangRouter(RouterConfig(startup_timeout_s=5, log_file=str(tmp_path / "r1.log")), [silent])
    with pytest.raises(EngineError, match="sglang-router .* did not report the 1 rollout server") as err:
        lone.start()
    assert time.monotonic() - t0 < 60 and silent in str(err.value) and lone.proc.poll() is not None

    code = ("import time; from paravt.engines.router import RouterConfig; "
            "from paravt.engines.sglang_router import SGLangRouter; "
            f"r = SGLangRouter(RouterConfig(log_file={str(tmp_path / 'r2.log')!r}), {urls!r}).start(); "
            "print(r.proc.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        assert not _gone(pid, 0.5)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
    assert _gone(pid, 30), f"the router (pid {pid}) outlived the process that started it"


# ------------------------------------------------------------------------------------ real hf_server processes
@pytest.fixture(scope="module")
def hf_servers(tiny_dir):
    """Two hf_server processes serving the tiny model with ``--enable-custom-logit-processor``."""
    procs, urls = [], []
    for _ in range(2):
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "paravt.engines.hf_server", "--model", str(tiny_dir),
                                       "--port", str(port), "--enable-custom-logit-processor"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{port}")
    for u in urls:
        _wait(u, "hf_server", procs)
    yield urls
    for p in procs:
        p.kill()
        p.wait(timeout=30)


@pytest.fixture(scope="module")
def prompt(tiny):
    """A prompt of the tiny model with one image: (ids with the image's pads expanded, images, processor)."""
    from paravt.models.tokenize import encode_prompt, image_pad_id, vision_token_ids

    _, proc = tiny
    img = Image.new("RGB", (64, 64), (30, 160, 90))
    ids, images = encode_prompt(proc, [{"role": "user", "content": [{"type": "image", "image": img},
                                                                     {"type": "text", "text": "What colour?"}]}])
    return ids, images, image_pad_id(proc.tokenizer), vision_token_ids(proc.tokenizer)


@pytest.mark.slow  # two hf_server processes load the tiny model (~20 s on 2 cores)
def test_through_the_router_an_hf_server_answers_as_directly(hf_servers, prompt, tmp_path):
    ids, images, pad, banned = prompt
    engines = [SGLangEngine(u, banned_token_ids=banned, image_token_id=pad, max_retries=0, request_timeout_s=120)
               for u in hf_servers]
    pool = RoutedPool.start(engines, RouterConfig(log_file=str(tmp_path / "router.log")), router=SGLangRouter)
    p = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)

    async def go():
        try:
            routed = await pool.for_episode("same").generate(ids, images, p)
            server = next(i for i, n in enumerate(pool.take_served()) if n)
            direct = await pool.engines[server].generate(ids, images, p)
            return routed, direct
        finally:
            await pool.close()
    try:
        routed, direct = asyncio.run(go())
    finally:
        pool.router.stop()
    assert routed.error is None and direct.error is None, (routed.error, direct.error)
    assert routed.token_ids == direct.token_ids and routed.token_ids
    assert max(abs(a - b) for a, b in zip(routed.logprobs, direct.logprobs)) < 1e-6
    assert not set(routed.token_ids) & set(banned)


def test_hf_server_takes_the_processor_only_with_the_flag_and_only_the_ban(tiny):
    """SGLang's rule (a processor needs ``--enable-custom-logit-processor``) and the stand-in's own: it serves only
    the ban its engine applies."""
    from aiohttp.test_utils import TestClient, TestServer

    from paravt.engines.hf import HFEngine
    from paravt.engines.hf_server import PROCESSOR_OFF, build_app
    from paravt.models.tokenize import image_pad_id, vision_token_ids

    model, proc = tiny
    banned = vision_token_ids(proc.tokenizer)
    body = generate_payload([1, 2, 3 + 10], None, SamplingParams(max_new_tokens=2, seed=1), banned,
                            image_pad_id(proc.tokenizer), processor_string(banned))

    async def post(enabled: bool, processor: str) -> tuple[int, dict]:
        async with TestClient(TestServer(build_app(HFEngine(model, proc), enable_custom_logit_processor=enabled))) as c:
            r = await c.post("/generate", json={**body, "custom_logit_processor": processor})
            return r.status, await r.json()

    status, out = asyncio.run(post(False, processor_string(banned)))
    assert status == 400 and out["error"]["message"] == PROCESSOR_OFF
    status, out = asyncio.run(post(True, processor_string(banned)))
    assert status == 200 and len(out["output_ids"]) == 2
    status, out = asyncio.run(post(True, processor_string(banned[:2])))
    assert status == 400 and "applies no other processor" in out["error"]["message"]
    status, out = asyncio.run(post(True, json.dumps({"callable": "00"})))
    assert status == 400 and "could not be read" in out["error"]["message"]
