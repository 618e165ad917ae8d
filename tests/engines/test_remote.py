"""Remote engines over real HTTP on localhost: the SGLang-API client and the OpenAI client
against ``paravt.engines.hf_server`` serving the tiny model in another process."""

import asyncio
import socket
import subprocess
import sys
import time

import pytest
import requests

from paravt.models.tokenize import encode_prompt
from paravt.agent.episode import EpisodeConfig, EpisodeSample, run_episode
from paravt.agent.tools import CropConfig
from paravt.core.prompts import THINK_PREFIX, build_messages
from paravt.core.video import sample_overview
from paravt.data.schema import load_rl_rows
from paravt.engines.base import SamplingParams
from paravt.engines.hf import HFEngine
from paravt.engines.openai import OpenAIEngine
from paravt.engines.sglang import SGLangEngine, SGLangServer, SGLangServerConfig
from paravt.data.tool_specs import DATA_TOOL_SCHEMAS


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_dir):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "paravt.engines.hf_server", "--model", str(tiny_dir), "--port",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("hf_server did not start")
    yield url, proc
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def rows(world):
    return load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])[0]


@pytest.mark.parametrize("penalty", [0.0, 0.8])
def test_sglang_client_matches_in_process_engine(server, tiny, rows, penalty):
    url, _ = server
    model, proc = tiny
    frames = sample_overview(rows[0].video, 4)
    ids, imgs = encode_prompt(proc, build_messages("agentic_minimal", rows[0].question, frames, "v.mp4", 60.0, tool_schemas=DATA_TOOL_SCHEMAS),
                              THINK_PREFIX)
    p = SamplingParams(temperature=0.9, max_new_tokens=12, seed=11, frequency_penalty=penalty)

    pad = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")

    async def go():
        eng = SGLangEngine(url, image_token_id=pad)
        try:
            assert await eng.health()
            return await eng.generate(ids, imgs, p)
        finally:
            await eng.close()
    remote = asyncio.run(go())
    local = asyncio.run(HFEngine(model, proc).generate(ids, imgs, p))
    assert remote.error is None
    assert remote.token_ids == local.token_ids  # one pad per image, expanded by the server == local ids
    assert remote.logprobs == pytest.approx(local.logprobs, abs=1e-5)


def test_server_rejects_expanded_pads_like_sglang_and_checks_prompt_length(server, tiny, rows):
    """SGLang's processor expects one <|image_pad|> per image: pre-expanded ids are an error (400
    here, 500 there); a client without the pad id refuses to send images at all."""
    url, _ = server
    _, proc = tiny
    ids, imgs = encode_prompt(proc, build_messages("agentic_minimal", rows[0].question,
                                                   sample_overview(rows[0].video, 2), "v.mp4", 60.0, tool_schemas=DATA_TOOL_SCHEMAS), THINK_PREFIX)
    body = {"input_ids": list(ids), "image_data": imgs.data_urls(), "sampling_params": {"max_new_tokens": 2}}
    r = requests.post(url + "/generate", json=body, timeout=60)
    assert r.status_code == 400 and "one per image" in r.text

    async def go():
        eng = SGLangEngine(url)  # no image_token_id
        try:
            return await eng.generate(ids, imgs, SamplingParams(max_new_tokens=2))
        finally:
            await eng.close()
    out = asyncio.run(go())
    assert out.finish_reason == "error" and "image_token_id is required" in out.error


def test_sglang_client_weight_update_from_disk(server, tiny_dir, tmp_path, rows):
    url, _ = server
    from paravt.models.tiny import build_tiny
    build_tiny(tmp_path / "v2", seed=9)

    async def go():
        eng = SGLangEngine(url)
        try:
            p = SamplingParams(temperature=0, max_new_tokens=6)
            a = await eng.generate([1, 2, 3], None, p)
            await eng.update_weights(str(tmp_path / "v2"), version=3)
            b = await eng.generate([1, 2, 3], None, p)
            await eng.update_weights(str(tiny_dir), version=4)
            c = await eng.generate([1, 2, 3], None, p)
            return a, b, c, eng.weight_version
        finally:
            await eng.close()
    a, b, c, v = asyncio.run(go())
    assert b.weight_version == 3 and v == 4
    assert (a.token_ids, a.logprobs) != (b.token_ids, b.logprobs)  # greedy argmax may coincide, logprobs cannot
    assert c.token_ids == a.token_ids and c.logprobs == pytest.approx(a.logprobs, abs=1e-5)


def test_openai_client_runs_an_eval_style_episode(server, tiny, rows):
    url, _ = server
    _, proc = tiny

    async def go():
        eng = OpenAIEngine(url, model="paravt")
        try:
            assert await eng.health()
            cfg = EpisodeConfig(max_new_tokens=24, temperature=0.0, crop=CropConfig(mode="frames"))
            return await run_episode(EpisodeSample.from_row(rows[0]), eng, proc, cfg, k=4)
        finally:
            await eng.close()
    traj = asyncio.run(go())
    assert traj.error is None and traj.turns and traj.turns[0].text.startswith("<think>\n")
    # token ids and logprobs came back from the server for every generated token
    assert sum(traj.main.loss_mask) == sum(t.n_generated for t in traj.turns) > 0
    assert all(lp <= 0 for lp in traj.main.logprobs)


def test_openai_client_uses_the_served_name_and_asks_for_token_ids(server):
    url, _ = server
    msgs = [{"role": "user", "content": "Say something."}]
    p = SamplingParams(temperature=0.0, max_new_tokens=4)

    async def go(model):
        eng = OpenAIEngine(url, model=model)
        try:
            return await eng.chat(msgs, p), eng.model
        finally:
            await eng.close()
    out, name = asyncio.run(go(None))  # read from /v1/models
    assert name == "paravt" and out.error is None and len(out.token_ids) == len(out.logprobs) > 0
    out, _ = asyncio.run(go("default"))  # a name the server does not serve: 404, no retry
    assert out.finish_reason == "error" and "HTTP 404" in out.error
    r = requests.post(url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 2}, timeout=60)
    assert "token_ids" not in r.json()["choices"][0]  # only when asked (return_token_ids), as vLLM


def test_prune_weight_dirs(tmp_path):
    from paravt.rl.engine_sync import prune_weight_dirs
    for v in range(1, 6):
        (tmp_path / f"v{v:06d}").mkdir()
    gone = prune_weight_dirs(tmp_path, keep=3)
    assert [p.name for p in gone] == ["v000001", "v000002"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000003", "v000004", "v000005"]


def test_dead_server_gives_a_clear_error():
    async def go():
        eng = SGLangEngine(f"http://127.0.0.1:{_free_port()}", max_retries=1)
        try:
            return await eng.generate([1, 2], None, SamplingParams(max_new_tokens=2))
        finally:
            await eng.close()
    out = asyncio.run(go())
    assert out.finish_reason == "error" and "failed after 2 attempts" in out.error


def test_launcher_reports_a_server_that_exits(tmp_path):
    cfg = SGLangServerConfig(model_path="m", python="false", port=_free_port(), startup_timeout_s=30,
                             log_file=str(tmp_path / "srv.log"))
    with pytest.raises(Exception, match="exited with code 1"):
        SGLangServer(cfg).start()
