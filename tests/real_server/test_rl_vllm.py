"""PARA-GRPO against REAL vLLM rollout servers (CPU build): the trainer and the servers exchange
weights (``broadcast``: buckets over a gloo group joined by our worker extension; ``disk``: a
save_pretrained export per step, reloaded by the server) and tokens (the tokens endpoint: our ids in,
the server's ids and processed logprobs out).

* seeded requests under load (64-frame prompts, more than one step's token budget) leave the server
  alive (the CPU build's seeded generators cannot rewind a partly prefilled request);
* A -> B -> A on a server, by reload and by broadcast, on one server and on two: under B its
  logprobs are B's (a re-score of B within 1e-4: a load that left some layers as they were would
  still give A back exactly after A -> B -> A), then A's exactly again;
* a push while requests are in flight: every output's logprobs are those of the version it carries;
* a server killed mid-broadcast: the push fails with one error within the timeout;
* the server's logprobs equal the trainer's recomputation within 1e-4 at T = 1 and T = 0.7;
* RL steps at staleness 0 (broadcast and disk): after every push the gap stays below 1e-4 and each
  turn's version is the step's; at staleness 2 rollouts really overlap training (turns generated
  under an older policy than the step that trains on them) and stay within the bound;
* the recipe configs/rl/tiny_vllm.yaml with its own settings for 5 steps;
* kill -9 of the server mid-run: one line, exit 3, a resumable checkpoint, the server's engine processes
  ended with it; never a run that trains on nothing and exits 0;
* two servers: both serve, both hold every pushed version;
* a server given by URL (not launched by the run) gets the run's weights before the first rollout.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_server

ROOT = Path(__file__).resolve().parents[2]
PY = os.environ.get("PARAVT_VLLM_PYTHON", str(ROOT / ".venv-vllm/bin/python"))


def _rl_args(world: Path, model: Path, out: Path, *extra: str) -> list[str]:
    return [str(ROOT / "configs/rl/tiny_vllm.yaml"), f"model_path={model}", f"output_dir={out}",
            f"train_data=[{world}/local/paravt_rl_synth.parquet]", "grpo.prompts_per_step=2", "grpo.n_samples=2",
            "hierarchical_agent.max_new_tokens=64", "hierarchical_agent.crop.subagent_max_tokens=24",
            "logging.wandb_project=null", "logging.progress=false", f"rollout.vllm.python={PY}",
            "rollout.vllm.port=0", "trainer.strategy=none", *extra]


def _metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def prompt(sft_world, sft_checkpoint):
    """An overview prompt with 4 frames as images: (ids, images, processor)."""
    from paravt.agent.episode import EpisodeConfig, EpisodeSample, build_overview
    from paravt.data.tool_specs import CROP_VIDEO_SCHEMA
    from paravt.eval.splits import load_split
    from paravt.models.loading import load_processor

    proc = load_processor(sft_checkpoint)
    s = load_split("synthetic", "", str(sft_world / "local"))[0]
    ov = build_overview(EpisodeSample(s.id, s.question, s.video, s.duration), 4, EpisodeConfig(), proc, [CROP_VIDEO_SCHEMA])
    return ov.prompt_ids, ov.images, proc


def _engine(srv, proc):
    from paravt.engines.vllm import VLLMEngine
    from paravt.models.tokenize import image_pad_id, vision_token_ids

    return VLLMEngine(srv.cfg.url, model="paravt-tiny", banned_token_ids=vision_token_ids(proc.tokenizer),
                      image_token_id=image_pad_id(proc.tokenizer))


def _sample(srv, prompt, temperature: float, seed: int = 3, n: int = 24):
    from paravt.engines.base import SamplingParams

    ids, images, proc = prompt

    async def go():
        eng = _engine(srv, proc)
        try:
            return await eng.generate(ids, images, SamplingParams(temperature=temperature, max_new_tokens=n, seed=seed))
        finally:
            await eng.close()

    out = asyncio.run(go())
    assert out.error is None, out.error
    assert out.prompt_token_ids == list(ids)  # the server expanded one pad per image exactly as we did
    return out


def _push(srv, proc, path, version):
    async def go():
        eng = _engine(srv, proc)
        try:
            await eng.update_weights(str(path), version)
            return await eng.server_version()
        finally:
            await eng.close()

    return asyncio.run(go())


def _handle(servers, proc, timeout_s: float = 60.0):
    """An EngineHandle over running servers with the broadcast transport (as the trainer builds it)."""
    from paravt.engines.factory import EngineHandle
    from paravt.engines.weight_update import WeightUpdate
    from paravt.models.tokenize import image_pad_id

    urls = [s.cfg.url for s in servers]
    h = EngineHandle("vllm", None, urls[0], [], image_pad_id(proc.tokenizer), urls=urls, model_name="paravt-tiny",
                     weight_update=WeightUpdate.broadcast("gloo", timeout_s=timeout_s, join_timeout_s=timeout_s))
    h.load_timeout_s = timeout_s
    return h


def _broadcast(handle, model_dir, version, bucket_bytes=1 << 20, gather_hook=None):
    """Push the weights of ``model_dir`` (loaded in fp32, as the CPU trainer holds them) as buckets."""
    import torch

    from paravt.models import parallel
    from paravt.models.loading import load_model

    m = load_model(str(model_dir), dtype="float32")
    b = parallel.weight_buckets(m, torch.float32, bucket_bytes, True)
    if gather_hook is not None:
        b._gather = gather_hook(b._gather)
    t0 = time.perf_counter()
    handle.push_weights(b, version)
    return time.perf_counter() - t0


def _versions(srv, proc):
    async def go():
        eng = _engine(srv, proc)
        try:
            return await eng.server_version()
        finally:
            await eng.close()

    return asyncio.run(go())


def _rescore_gap(model_dir, prompt, out, temperature: float) -> float:
    """max |server logprob - fp32 re-score under ``model_dir``| (vision tokens banned, / T)."""
    import torch

    from paravt.models.loading import load_model
    from paravt.models.tokenize import image_pad_id, vision_token_ids

    ids, images, proc = prompt
    m = load_model(str(model_dir), dtype="float32").eval()
    full = torch.tensor([list(ids) + out.token_ids])
    pv, grid = images.tensors(proc)
    pad = image_pad_id(proc.tokenizer)
    with torch.no_grad():
        lg = m(input_ids=full, attention_mask=torch.ones_like(full), mm_token_type_ids=(full == pad).long(),
               pixel_values=pv, image_grid_thw=grid).logits[0, :-1].float() / temperature
    lg = lg.index_fill(1, torch.tensor(vision_token_ids(proc.tokenizer)), float("-inf"))
    lp = torch.log_softmax(lg, -1).gather(1, full[0, 1:, None]).squeeze(1)[-len(out.token_ids):]
    return (lp - torch.tensor(out.logprobs)).abs().max().item()


def test_reload_a_b_a_returns_a_exactly(rollout_server, prompt, sft_checkpoint, tmp_path):
    from paravt.models.tiny import build_tiny

    proc = prompt[2]
    other = tmp_path / "b"
    build_tiny(other, seed=1)  # B: another model of the same shape
    a = _sample(rollout_server, prompt, 0.7)
    assert _rescore_gap(sft_checkpoint, prompt, a, 0.7) < 1e-4
    assert _push(rollout_server, proc, other, 1) == 1
    b = _sample(rollout_server, prompt, 0.7)
    assert b.weight_version == 1 and (b.token_ids != a.token_ids or b.logprobs != a.logprobs)
    assert _rescore_gap(other, prompt, b, 0.7) < 1e-4  # every layer holds B (vision tower, packed linears)
    t0 = time.perf_counter()
    assert _push(rollout_server, proc, sft_checkpoint, 2) == 2
    sync_s = time.perf_counter() - t0
    a2 = _sample(rollout_server, prompt, 0.7)
    assert a2.weight_version == 2 and a2.token_ids == a.token_ids and a2.logprobs == a.logprobs
    print(f"\nreload A->B->A: push {sync_s:.3f} s")


def test_seeded_requests_under_load_keep_the_server_alive(rollout_server, sft_world, sft_checkpoint):
    """32 seeded requests at once, each a 64-frame prompt: together far more than one scheduler step's
    token budget. With chunked prefill, the CPU build crashed here (a partly prefilled seeded request
    rewinds its generator, which CPU generators cannot do); the launcher turns it off on CPU."""
    from paravt.agent.episode import EpisodeConfig, EpisodeSample, build_overview
    from paravt.data.tool_specs import CROP_VIDEO_SCHEMA
    from paravt.engines.base import SamplingParams
    from paravt.eval.splits import load_split
    from paravt.models.loading import load_processor

    proc = load_processor(sft_checkpoint)
    rows = load_split("synthetic", "", str(sft_world / "local"))
    prompts = []
    for s in rows[:4]:
        ov = build_overview(EpisodeSample(s.id, s.question, s.video, s.duration), 64, EpisodeConfig(), proc,
                            [CROP_VIDEO_SCHEMA])
        prompts.append((ov.prompt_ids, ov.images))
    assert "--no-enable-chunked-prefill" in rollout_server.command()[0]

    async def go():
        eng = _engine(rollout_server, proc)
        try:
            return await asyncio.gather(*(eng.generate(*prompts[i % len(prompts)], SamplingParams(
                temperature=1.0, max_new_tokens=48, seed=100 + i)) for i in range(32)))
        finally:
            await eng.close()

    outs = asyncio.run(go())
    errors = [o.error for o in outs if o.error]
    assert not errors, errors[:2]
    assert rollout_server.proc.poll() is None
    again = asyncio.run(go())  # the same seeds give the same tokens (per-request seeds stay honoured)
    assert [o.token_ids for o in again] == [o.token_ids for o in outs]


def test_broadcast_a_b_a_returns_a_exactly(rollout_server, prompt, sft_checkpoint, tmp_path):
    from paravt.models.tiny import build_tiny

    proc = prompt[2]
    other = tmp_path / "b"
    build_tiny(other, seed=1)
    h = _handle([rollout_server], proc)
    try:
        a = _sample(rollout_server, prompt, 0.7)
        _broadcast(h, other, 11)
        assert _versions(rollout_server, proc) == 11
        b = _sample(rollout_server, prompt, 0.7)
        assert b.weight_version == 11 and (b.token_ids != a.token_ids or b.logprobs != a.logprobs)
        assert _rescore_gap(other, prompt, b, 0.7) < 1e-4  # every layer holds B (vision tower, packed linears)
        sync_s = _broadcast(h, sft_checkpoint, 12)
        a2 = _sample(rollout_server, prompt, 0.7)
        assert a2.weight_version == 12 and a2.token_ids == a.token_ids and a2.logprobs == a.logprobs
        print(f"\nbroadcast A->B->A: push {sync_s:.3f} s")
    finally:
        h.stop()


def test_broadcast_reaches_every_server(rollout_server, spare, prompt, sft_checkpoint, tmp_path):
    """Two servers in one group (ranks 1 and 2): both hold B after one push, then A again."""
    from paravt.models.tiny import build_tiny

    proc = prompt[2]
    other = tmp_path / "b"
    build_tiny(other, seed=1)
    second = spare.get()
    h = _handle([rollout_server, second], proc)
    try:
        a = _sample(rollout_server, prompt, 0.7)
        _broadcast(h, other, 21)
        for srv in (rollout_server, second):
            assert _versions(srv, proc) == 21
            b = _sample(srv, prompt, 0.7)
            assert b.weight_version == 21 and _rescore_gap(other, prompt, b, 0.7) < 1e-4
        _broadcast(h, sft_checkpoint, 22)
        for srv in (rollout_server, second):
            a2 = _sample(srv, prompt, 0.7)
            assert a2.weight_version == 22 and a2.token_ids == a.token_ids and a2.logprobs == a.logprobs
    finally:
        h.stop()


async def _until(check, what: str, timeout_s: float = 300.0) -> None:
    """Poll ``check()`` (a coroutine function) until it is true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s:.0f} s for {what}")
        await asyncio.sleep(0.05)


async def _get(url: str) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
        return await r.text()


async def _running(url: str) -> bool:
    for line in (await _get(url + "/metrics")).splitlines():
        if line.startswith("vllm:num_requests_running") and float(line.rsplit(" ", 1)[1]) >= 1:
            return True
    return False


async def _paused(url: str, push: asyncio.Future) -> bool:
    return push.done() or json.loads(await _get(url + "/is_paused")).get("is_paused") is True


def test_a_push_during_generation_keeps_each_output_on_its_own_version(rollout_server, prompt, sft_checkpoint,
                                                                        tmp_path):
    """Requests in flight when a push starts finish on the weights they started with; requests sent
    during the push wait for the new ones. Every output's logprobs are those of the version it
    carries (re-scored with that version's weights).

    Ordered by the server's own state, never by sleeps (a slow machine must not change what is
    tested): the push starts once vLLM's /metrics shows early requests running; the late requests
    are sent once /is_paused says the push paused the server (or the push already ended)."""
    from paravt.engines.base import SamplingParams
    from paravt.models.tiny import build_tiny

    ids, images, proc = prompt
    other = tmp_path / "b"
    build_tiny(other, seed=1)
    h = _handle([rollout_server], proc)
    url = rollout_server.cfg.url
    weights = {31: sft_checkpoint, 32: other}
    try:
        _broadcast(h, sft_checkpoint, 31)

        async def go():
            eng = _engine(rollout_server, proc)
            eng.weight_version = 31
            try:
                early: list[asyncio.Future] = []

                async def early_running() -> bool:
                    """True once /metrics shows early requests running; a batch that ended unseen (short
                    answers, a slow /metrics) is followed by another, so no machine speed skips the case."""
                    if early and await _running(url):
                        return True
                    if all(f.done() for f in early):
                        early.extend(asyncio.ensure_future(eng.generate(ids, images, SamplingParams(
                            temperature=0.7, max_new_tokens=96, seed=len(early) + i))) for i in range(6))
                    return False

                await _until(early_running, "early requests running (vllm:num_requests_running)")
                push = asyncio.ensure_future(asyncio.to_thread(_broadcast, h, other, 32))
                await _until(lambda: _paused(url, push), "the push pausing the server (/is_paused)")
                late = [asyncio.ensure_future(eng.generate(ids, images, SamplingParams(
                    temperature=0.7, max_new_tokens=24, seed=50 + i))) for i in range(4)]
                await push
                return await asyncio.gather(*early), await asyncio.gather(*late)
            finally:
                await eng.close()

        early_outs, late_outs = asyncio.run(go())
        outs = early_outs + late_outs
        assert not [o.error for o in outs if o.error]
        # early requests were running on 31 when the push began; late ones were sent once it had paused
        early_v, late_v = [o.weight_version for o in early_outs], [o.weight_version for o in late_outs]
        assert 31 in early_v and set(late_v) == {32}, (early_v, late_v)
        for o in outs:
            assert _rescore_gap(weights[o.weight_version], prompt, o, 0.7) < 1e-4, o.weight_version
    finally:
        _broadcast(h, sft_checkpoint, 33)  # the module's server holds A again for the tests after this one
        h.stop()


def test_a_queue_of_requests_across_several_pushes_loses_none(rollout_server, prompt, sft_checkpoint, tmp_path):
    """Rollouts keep arriving while the trainer pushes three versions in a row (B, A, B): a feeder keeps
    four requests in flight the whole time and two more are sent while each push holds the server
    paused. Every request ends with tokens (none refused, none retried into a failure), none carries a
    version older than the last push that had finished when it was sent, every pushed version serves
    at least one request, and one output per version re-scores under that version's weights.

    Ordered by the server's state (/metrics, /is_paused), never by sleeps."""
    from paravt.engines.base import SamplingParams
    from paravt.models.tiny import build_tiny

    ids, images, proc = prompt
    other = tmp_path / "b"
    build_tiny(other, seed=1)
    h = _handle([rollout_server], proc)
    url = rollout_server.cfg.url
    pushes = [(41, other), (42, sft_checkpoint), (43, other)]
    weights = {v: d for v, d in pushes}
    try:
        _broadcast(h, sft_checkpoint, 40)
        weights[40] = sft_checkpoint

        async def go():
            eng = _engine(rollout_server, proc)
            eng.weight_version = 40
            sent: list[tuple[int, asyncio.Future]] = []  # (newest version live when sent, request)
            live = [40]
            done = asyncio.Event()

            def send(seed: int, n: int) -> asyncio.Future:
                f = asyncio.ensure_future(eng.generate(ids, images, SamplingParams(
                    temperature=0.7, max_new_tokens=n, seed=seed)))
                sent.append((live[0], f))
                return f

            async def feeder():
                while not done.is_set():
                    if sum(not f.done() for _, f in sent) < 4:
                        send(len(sent), 32)
                    await asyncio.sleep(0.01)

            feed = asyncio.ensure_future(feeder())
            try:
                for version, model_dir in pushes:
                    await _until(lambda: _running(url), f"requests running before push {version}")
                    push = asyncio.ensure_future(asyncio.to_thread(_broadcast, h, model_dir, version))
                    await _until(lambda: _paused(url, push), f"push {version} pausing the server (/is_paused)")
                    late = [send(1000 + 10 * version + i, 16) for i in range(2)]
                    await push
                    live[0] = version
                    await asyncio.gather(*late)
                done.set()
                await feed
                return [(v, await f) for v, f in sent]
            finally:
                done.set()
                await eng.close()

        outs = asyncio.run(go())
        errors = [o.error for _, o in outs if o.error or not o.token_ids]
        assert not errors, f"{len(errors)} of {len(outs)} requests lost: {errors[:3]}"
        stale = [(v, o.weight_version) for v, o in outs if o.weight_version < v]
        assert not stale, f"outputs older than the version live when they were sent: {stale}"
        served = {o.weight_version for _, o in outs}
        assert {41, 42, 43} <= served <= {40, 41, 42, 43}, served
        for v in sorted(served):
            o = min((o for _, o in outs if o.weight_version == v), key=lambda o: len(o.token_ids))
            assert _rescore_gap(weights[v], prompt, o, 0.7) < 1e-4, v
        print(f"{len(outs)} requests across 3 pushes, none lost; served versions {sorted(served)}")
    finally:
        _broadcast(h, sft_checkpoint, 44)  # the module's server holds A again for the tests after this one
        h.stop()


def test_a_version_missing_a_parameter_is_refused_naming_it(spare, prompt, sft_checkpoint, tmp_path):
    """A push whose buckets lack one of the served model's parameters would leave the server serving a
    mix of two policies: the worker applies vLLM's own checkpoint rule (every parameter written) and
    the push fails naming it. Not the module's server: the refused version leaves it half-written."""
    import torch

    from paravt.core.weight_sync import TensorMeta, WeightBuckets, plan_buckets
    from paravt.engines.base import EngineError
    from paravt.models.loading import load_model

    m = load_model(str(sft_checkpoint), dtype="float32")
    named = [(n, p.detach()) for n, p in m.named_parameters()]
    drop = next(n for n, _ in named if "layers.0.mlp.down_proj" in n)
    kept = [(n, t) for n, t in named if n != drop]
    plan = plan_buckets([TensorMeta(n, "float32", tuple(t.shape)) for n, t in kept], 1 << 20)
    tensors = iter(kept)
    buckets = WeightBuckets(plan, lambda i: [next(tensors)[1] for _ in plan[i]])
    srv = spare.get()
    h = _handle([srv], prompt[2])
    try:
        with pytest.raises(EngineError) as e:
            h.push_weights(buckets, 23)
        assert "unwritten" in str(e.value) and "down_proj" in str(e.value), str(e.value)[:500]
        assert torch.is_tensor(kept[0][1])
    finally:
        h.stop()


def test_servers_given_by_url_get_this_runs_weights_first(spare, prompt, sft_world, sft_checkpoint, tmp_path):
    """A server this run did not launch (rollout.urls, replicas=0) holds other weights (B, pushed here
    first); the run broadcasts its own before the first rollout, so step 1 trains on its own policy's
    tokens (after every push the server's logprobs are the trainer's within 1e-4)."""
    from paravt.models.tiny import build_tiny

    other = tmp_path / "b"
    build_tiny(other, seed=1)
    srv = spare.get()
    h = _handle([srv], prompt[2])
    try:
        _broadcast(h, other, 30)
        assert _rescore_gap(other, prompt, _sample(srv, prompt, 0.7), 0.7) < 1e-4  # it serves B
    finally:
        h.stop()
    out = tmp_path / "rl_urls"
    r = _run_rl(_rl_args(sft_world, sft_checkpoint, out, "max_steps=2", "save_every=2", "grpo.max_staleness=0",
                         "rollout.replicas=0", f"rollout.urls=[{srv.cfg.url}]"))
    assert r.returncode == 0, r.stderr[-3000:]
    rec = _metrics(out)
    assert [m["step"] for m in rec] == [1, 2]
    assert all(m["rollout/logprob_gap_max"] < 1e-4 for m in rec), [m["rollout/logprob_gap_max"] for m in rec]


def test_a_server_killed_mid_broadcast_fails_the_push_within_the_timeout(spare, prompt, sft_checkpoint, tmp_path):
    from paravt.engines.base import EngineError

    proc = prompt[2]
    srv = spare.get()  # it ends dead: the next user of the spare (the router module) starts it again
    h = _handle([srv], proc, timeout_s=60.0)

    def kill_after_first(gather):
        def g(i):
            if i == 1:  # the first bucket was sent: kill the server and its engine (an OOM kill)
                kids = subprocess.run(["pgrep", "-g", str(srv.proc.pid)], capture_output=True, text=True).stdout.split()
                for k in map(int, kids):
                    os.kill(k, signal.SIGKILL)
            return gather(i)
        return g

    try:
        t0 = time.perf_counter()
        with pytest.raises(EngineError) as e:
            _broadcast(h, sft_checkpoint, 41, bucket_bytes=256 << 10, gather_hook=kill_after_first)
        took = time.perf_counter() - t0
        msg = str(e.value)
        assert "\n" not in msg.strip() or "died" in msg, msg
        print(f"\nkilled mid-broadcast: push failed after {took:.1f} s: {msg[:200]}")
        assert took < 60 + 30  # the sync timeout plus the health probes' margin: never the NCCL watchdog's 30 min
    finally:
        h.stop()
        srv.stop()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_server_logprobs_equal_the_trainers(temperature, rollout_server, prompt, sft_world, sft_checkpoint, tmp_path):
    """The trainer's own re-score (RLTrainer._forward_logps: fp32, vision tokens banned, / T) of the
    server's tokens, on the overview prompt with its images."""
    from paravt.core.config import load_config
    from paravt.rl.config import RLConfig
    from paravt.rl.rollout import Sample
    from paravt.rl.trainer import RLTrainer

    ids, images, _ = prompt
    out = _sample(rollout_server, prompt, temperature, n=32)
    cfg = load_config(RLConfig, str(ROOT / "configs/rl/tiny.yaml"), [
        f"model_path={sft_checkpoint}", f"output_dir={tmp_path}", f"train_data=[{sft_world}/local/paravt_rl_synth.parquet]",
        f"grpo.temperature={temperature}", "grpo.kl_coef=0", "trainer.strategy=none", "logging.wandb_project=null"])
    tr = RLTrainer(cfg)
    seq = list(ids) + out.token_ids
    s = Sample(seq, [0] * len(ids) + [1] * len(out.token_ids), [0.0] * len(seq), images, 0.0)
    import torch
    with torch.no_grad():
        logp, _ = tr._forward_logps(tr.actor, s)
    mine = logp[-len(out.token_ids):]
    gap = (mine - torch.tensor(out.logprobs)).abs().max().item()
    print(f"\nT={temperature}: max |server - trainer| = {gap:.2e} over {len(out.token_ids)} tokens")
    assert gap < 1e-4


def _launch_env(nproc: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MAX_RESTARTS", "NPROC")}
    return {**env, "NPROC": str(nproc)}


def _run_rl(args: list[str], timeout: int = 1500, nproc: int = 1) -> subprocess.CompletedProcess:
    """The run as users start it: scripts/run_rl.sh (torchrun, ``nproc`` trainer ranks)."""
    return subprocess.run(["bash", "scripts/run_rl.sh", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=_launch_env(nproc))


def _descendants(pid: int) -> list[int]:
    kids = [int(x) for x in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]
    return kids + [d for k in kids for d in _descendants(k)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# Staleness 0 with broadcast at T = 0.7 is test_two_servers_serve_and_hold_every_version's (two ranks, two servers).
# These runs take the module's rollout server by URL (the run pushes its own weights first, as tested above):
# the launch of a run's own server is what the recipe, kill and two-server tests below go through.
@pytest.mark.parametrize("staleness,temperature,sync", [(0, 0.7, "disk"), (2, 1.0, "broadcast")])
def test_rl_steps_against_a_vllm_server(staleness, temperature, sync, rollout_server, sft_world, sft_checkpoint,
                                        tmp_path):
    out = tmp_path / f"rl_s{staleness}_{sync}"
    r = _run_rl(_rl_args(sft_world, sft_checkpoint, out, "max_steps=6", "save_every=6",
                         f"grpo.max_staleness={staleness}", f"grpo.temperature={temperature}",
                         f"rollout.weight_sync={sync}", "rollout.replicas=0", f"rollout.urls=[{rollout_server.cfg.url}]"))
    assert r.returncode == 0, r.stderr[-3000:]
    rec = _metrics(out)
    assert [m["step"] for m in rec] == list(range(1, 7))
    for i, m in enumerate(rec):  # step i+1 trains on rollout batch i, the producer ran under versions <= i
        assert m["rollout/skipped_prompts"] == 0 and m["rollout/samples"] > 0
        assert 0 <= m["rollout/version_min"] <= m["rollout/version_max"] <= i
        assert 0 <= m["rollout/staleness"] <= staleness
        if staleness == 0:
            assert m["rollout/version_min"] == m["rollout/version_max"] == i
            # after every push the server holds exactly the trainer's weights
            assert m["rollout/logprob_gap_max"] < 1e-4, (i, m["rollout/logprob_gap_max"])
    assert (out / "weights").exists() == (sync == "disk")  # broadcast writes nothing to disk
    trajs = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    for t in trajs:
        for turn in t["turns"]:
            assert 0 <= t["step"] - turn["weight_version"] <= staleness
    if staleness:
        # rollouts really ran ahead of training: some step trained on turns an older policy generated
        assert max(m["rollout/staleness"] for m in rec) >= 1, [m["rollout/staleness"] for m in rec]
    print(f"\nstaleness {staleness} ({sync}): " + ", ".join(f"{k} {sum(m[k] for m in rec) / len(rec):.2f} s" for k in
                                                     ("time/rollout", "time/sync", "time/train", "time/step")))
    print("logprob gap max per step:", [f"{m['rollout/logprob_gap_max']:.1e}" for m in rec])


@pytest.mark.timeout(2500)
def test_the_vllm_recipe_runs_with_its_own_settings(sft_world, sft_checkpoint, tmp_path):
    """configs/rl/tiny_vllm.yaml as the README runs it: only the data, model, output, port and vLLM's
    environment are set here; batch, lengths, staleness and K draws are the recipe's. Five steps: past the
    recipe's staleness window several times (a server crash under seeded load has a test of its own)."""
    out = tmp_path / "recipe"
    r = _run_rl([str(ROOT / "configs/rl/tiny_vllm.yaml"), f"model_path={sft_checkpoint}", f"output_dir={out}",
                 f"train_data=[{sft_world}/local/paravt_rl_synth.parquet]", "max_steps=5", "logging.wandb_project=null",
                 "logging.progress=false", f"rollout.vllm.python={PY}", "rollout.vllm.port=0"], timeout=2400)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = _metrics(out)
    assert [m["step"] for m in rec] == list(range(1, 6))
    assert sum(m["rollout/skipped_prompts"] for m in rec) == 0
    assert all(m["rollout/samples"] > 0 for m in rec)
    # the server never failed while serving (vLLM's own shutdown at the end force-kills its engine and logs that)
    serving = (out / "rollout_vllm.log").read_text().split("shutdown triggered")[0]
    assert "Traceback" not in serving and "EngineDeadError" not in serving
    print("\nrecipe: " + ", ".join(f"{k} {sum(m[k] for m in rec) / len(rec):.2f} s" for k in
                                   ("time/rollout", "time/sync", "time/train", "time/step")))


def test_killing_the_server_stops_the_run_with_a_checkpoint(sft_world, sft_checkpoint, tmp_path):
    out = tmp_path / "rl_kill"
    # the CPU build's own layout (the recipe runs the worker inside the engine core): three processes to end
    args = _rl_args(sft_world, sft_checkpoint, out, "max_steps=40", "save_every=40", "grpo.max_staleness=0",
                    "rollout.max_bad_steps=2", "rollout.vllm.cpu_worker_process=true")
    p = subprocess.Popen(["bash", "scripts/run_rl.sh", *args], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_launch_env(1))
    try:
        deadline = time.time() + 900
        while time.time() < deadline and not ((out / "metrics.jsonl").exists() and _metrics(out)):
            assert p.poll() is None, p.stderr.read()[-3000:]
            time.sleep(0.5)
        log = (out / "rollout_vllm.log")
        assert log.exists()
        # the run's own API server (launched by trainer rank 0), killed as an OOM killer would: its engine
        # core and worker (process titles VLLM::EngineCore, VLLM::Worker) stay behind in its group
        servers = [d for d in _descendants(p.pid) if "vllm.entrypoints" in _cmdline(d)]
        assert len(servers) == 1, [_cmdline(d)[:80] for d in _descendants(p.pid)]
        group = os.getpgid(servers[0])
        os.kill(servers[0], signal.SIGKILL)
        killed = time.monotonic()
        _, err = p.communicate(timeout=900)
        took = time.monotonic() - killed
        # the push fails at once (the server is known dead) and what it left is ended, not waited on for
        # the 60 s an orderly shutdown gets
        assert took < 60, f"the run took {took:.0f} s to end after its server was killed"
        try:
            os.killpg(group, 0)
            left = True
        except ProcessLookupError:
            left = False
        assert not left, f"the dead server's engine processes (group {group}) outlived the run"
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 3, err[-3000:]
    line = [ln for ln in err.strip().splitlines() if ln.strip()][-1]
    assert "Traceback" not in err and ("rollouts lost work" in line or "weight push" in line), line
    assert "resume=auto continues" in line and not (out / "final").exists()
    done = sorted(c for c in (out / "checkpoints").glob("step_*") if (c / "COMPLETE").exists())
    assert done, "no resumable checkpoint"


def test_two_servers_serve_and_hold_every_version(sft_world, sft_checkpoint, tmp_path):
    """A cluster's shape at CPU size: two FSDP2 trainer ranks under torchrun (``run_rl.sh``, NPROC=2),
    two rollout servers; the weight group (trainer rank 0 + both servers) forms under torchrun, every
    push reaches both, and after each push the servers' logprobs at T = 0.7 are the trainer's (within 1e-4)."""
    out = tmp_path / "rl_two"
    r = _run_rl(_rl_args(sft_world, sft_checkpoint, out, "max_steps=3", "save_every=3", "grpo.max_staleness=0",
                         "grpo.temperature=0.7", "rollout.replicas=2", "trainer.strategy=fsdp2",
                         "rollout.weight_sync=broadcast"), nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = _metrics(out)
    assert [m["step"] for m in rec] == [1, 2, 3]
    # both servers answered requests in every step (the pool sends each to the least loaded one) ...
    for m in rec:
        assert m["rollout/requests_server0"] > 0 and m["rollout/requests_server1"] > 0
        # ... after each push both said they hold the pushed version (the push checks /weight_info) ...
        assert m["rollout/version_min"] == m["rollout/version_max"] == m["step"] - 1
        # ... and generated with exactly the weights pushed (every parameter arrived, in the right place)
        assert m["rollout/logprob_gap_max"] < 1e-4, (m["step"], m["rollout/logprob_gap_max"])
    share = [m["time/sync"] / m["time/step"] for m in rec if m.get("time/step")]
    print("sync share of the step, two trainer ranks:", [f"{100 * x:.1f}%" for x in share])
