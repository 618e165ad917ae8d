"""PARA-GRPO against REAL vLLM rollout servers (CPU build): the trainer and the servers exchange
weights (a save_pretrained export per step, reloaded by the server) and tokens (the tokens endpoint:
our ids in, the server's ids and processed logprobs out).

* reload A -> B -> A on a server: under B its logprobs are B's (a re-score of B within 1e-4: a reload
  that left some layers as they were would still give A back exactly after A -> B -> A), then A's
  exactly again;
* the server's logprobs equal the trainer's recomputation (the trainer's own ``_forward_logps``)
  within 1e-4 at T = 1 and T = 0.7, with images;
* 6 RL steps at staleness 0 (T = 0.7): after every push the gap stays below 1e-4, each turn's version
  is the step's; at staleness 2 every turn's version is within the bound and ``rollout/staleness`` is
  what the server reported;
* kill -9 of the server mid-run: one line, exit 3, a resumable checkpoint; never a run that trains on
  nothing and exits 0;
* two servers: both serve, both hold every pushed version.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
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
def rollout_server(sft_checkpoint, tmp_path_factory):
    from paravt.engines.vllm import VLLMServer, VLLMServerConfig
    from paravt.models.parallel import free_port

    cfg = VLLMServerConfig(model_path=str(sft_checkpoint), python=PY, port=free_port(), dtype="float32",
                           enforce_eager=True, cpu_kvcache_space_gb=1, served_model_name="paravt-tiny", rollout=True,
                           log_file=str(tmp_path_factory.mktemp("rl_logs") / "vllm.log"))
    srv = VLLMServer(cfg).start()
    yield srv
    srv.stop()


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


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_server_logprobs_equal_the_trainers(temperature, rollout_server, prompt, sft_world, sft_checkpoint, tmp_path):
    """The trainer's own re-score (RLTrainer._forward_logps: fp32, vision tokens banned, / T) of the
    server's tokens, on the overview prompt with its images."""
    from paravt.core.config import load_config
    from paravt.rl.config import RLConfig
    from paravt.rl.rollout import Sample
    from paravt.rl.train import RLTrainer

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


def _run_rl(args: list[str], timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paravt.rl.train", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("staleness,temperature", [(0, 0.7), (2, 1.0)])
def test_rl_steps_against_a_vllm_server(staleness, temperature, sft_world, sft_checkpoint, tmp_path):
    out = tmp_path / f"rl_s{staleness}"
    r = _run_rl(_rl_args(sft_world, sft_checkpoint, out, "max_steps=6", "save_every=6",
                         f"grpo.max_staleness={staleness}", f"grpo.temperature={temperature}"))
    assert r.returncode == 0, r.stderr[-3000:]
    rec = _metrics(out)
    assert [m["step"] for m in rec] == list(range(1, 7))
    for i, m in enumerate(rec):  # step i+1 trains on rollout batch i
        assert m["rollout/skipped_prompts"] == 0 and m["rollout/samples"] > 0
        assert m["rollout/staleness"] == i - m["rollout/version_min"]  # from the versions the server reported
        assert 0 <= m["rollout/staleness"] <= staleness and i - m["rollout/version_max"] >= 0
        if staleness == 0:
            assert m["rollout/version_min"] == m["rollout/version_max"] == i
            # after every push the server holds exactly the trainer's weights
            assert m["rollout/logprob_gap_max"] < 1e-4, (i, m["rollout/logprob_gap_max"])
        assert m["time/sync"] > 0
    trajs = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    for t in trajs:
        for turn in t["turns"]:
            assert 0 <= t["step"] - turn["weight_version"] <= staleness
    print(f"\nstaleness {staleness}: " + ", ".join(f"{k} {sum(m[k] for m in rec) / len(rec):.2f} s" for k in
                                           ("time/rollout", "time/sync", "time/train", "time/step")))
    print("logprob gap max per step:", [f"{m['rollout/logprob_gap_max']:.1e}" for m in rec])


def test_killing_the_server_stops_the_run_with_a_checkpoint(sft_world, sft_checkpoint, tmp_path):
    out = tmp_path / "rl_kill"
    args = _rl_args(sft_world, sft_checkpoint, out, "max_steps=40", "save_every=40", "grpo.max_staleness=0",
                    "rollout.max_bad_steps=2")
    p = subprocess.Popen([sys.executable, "-m", "paravt.rl.train", *args], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 900
        while time.time() < deadline and not ((out / "metrics.jsonl").exists() and _metrics(out)):
            assert p.poll() is None, p.stderr.read()[-3000:]
            time.sleep(0.5)
        log = (out / "rollout_vllm.log")
        assert log.exists()
        # the run's own server (a child of the trainer) and its engine process, killed as an OOM killer would
        servers = [int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid), "-f", "vllm"], capture_output=True,
                                                  text=True).stdout.split()]
        assert servers
        for pid in servers:
            kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
            for k in [pid, *map(int, kids)]:
                os.kill(k, signal.SIGKILL)
        _, err = p.communicate(timeout=900)
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
    out = tmp_path / "rl_two"
    r = _run_rl(_rl_args(sft_world, sft_checkpoint, out, "max_steps=2", "save_every=2", "grpo.max_staleness=0",
                         "rollout.replicas=2"))
    assert r.returncode == 0, r.stderr[-3000:]
    rec = _metrics(out)
    # both servers answered requests in every step (the pool sends each to the least loaded one) ...
    for m in rec:
        assert m["rollout/requests_server0"] > 0 and m["rollout/requests_server1"] > 0
        # ... and after each push both said they hold the pushed version (the push checks /weight_info)
        assert m["rollout/version_min"] == m["rollout/version_max"] == m["step"] - 1
