"""kill -9 and broken media: no orphan workers, one run per output directory, a corrupt video costs
one prompt (counted), never the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _procs_mentioning(text: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                out.append(int(d.name))
    return out


def _kill_group_and_expect_no_survivors(p: subprocess.Popen, out: Path) -> None:
    """kill -9 the launcher's whole process group (as a user or a scheduler would); within 30 s no
    process may still mention ``out`` (the workers must die with their launcher)."""
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    deadline = time.time() + 30
    while time.time() < deadline and _procs_mentioning(str(out)):
        time.sleep(0.5)
    assert _procs_mentioning(str(out)) == [], "workers outlived their launcher"


def _newest_complete_step(out: Path) -> int:
    return max(int(c.name.split("_")[1]) for c in (out / "checkpoints").glob("step_*") if (c / "COMPLETE").exists())


@pytest.mark.launcher
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux")
def test_killing_the_launcher_group_leaves_no_workers_and_the_lock_refuses_a_second_run(world, tiny_dir, tmp_path):
    out = tmp_path / "sft_kill"
    args = ["bash", "scripts/run_sft.sh", "configs/sft/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={out}",
            f"data.0.path={world}/local/paravt_sft_synth.parquet", "max_steps=400", "save_every=2",
            "max_length=1024", "logging.wandb_project=null", "logging.progress=false"]
    env = {**os.environ, "NPROC": "2"}
    p = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not (out / "checkpoints/step_000002/COMPLETE").exists():
            assert p.poll() is None, "the run ended before its first checkpoint"
            time.sleep(0.3)
        assert len(_procs_mentioning(str(out))) >= 3  # bash -> torchrun -> 2 workers
        # a second run on the same output directory refuses: one line naming the holder
        r = subprocess.run(args, cwd=ROOT, env={**os.environ, "NPROC": "1"}, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and "in use by another run (pid" in r.stderr and "Traceback" not in r.stderr
        _kill_group_and_expect_no_survivors(p, out)
    finally:
        for pid in _procs_mentioning(str(out)):
            os.kill(pid, signal.SIGKILL)
    # resumable: the next run continues from the newest complete checkpoint, each step logged once
    done = _newest_complete_step(out)
    r = subprocess.run([*args[:-6], f"data.0.path={world}/local/paravt_sft_synth.parquet",
                        f"max_steps={done + 1}", "save_every=2", "max_length=1024", "logging.wandb_project=null",
                        "logging.progress=false"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "NPROC": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, done + 2))


def test_a_corrupt_video_skips_its_prompt_not_the_run(world, tiny_dir, tmp_path):
    import shutil

    import pyarrow.parquet as pq

    from paravt.core.config import load_config
    from paravt.rl.config import RLConfig
    from paravt.rl.trainer import RLTrainer

    # a copy of the RL rows whose every other video is a zero-byte or garbage file
    rows = pq.read_table(world / "local/paravt_rl_synth.parquet").to_pylist()
    media = tmp_path / "media"
    media.mkdir()
    for i, r in enumerate(rows):
        src = r["videos"][0]["video"].removeprefix("file://")
        dst = media / f"{i}_{Path(src).name}"
        if i % 2:
            dst.write_bytes(b"" if i % 4 == 1 else b"\x00garbage" * 100)
        else:
            shutil.copy(src, dst)
        r["videos"] = [{"video": "file://" + str(dst)}]
    import pyarrow as pa
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rl.parquet")
    out = tmp_path / "rl"
    cfg = load_config(RLConfig, str(ROOT / "configs/rl/tiny.yaml"), [
        f"model_path={tiny_dir}", f"output_dir={out}", f"train_data=[{tmp_path / 'rl.parquet'}]",
        "hierarchical_agent.max_new_tokens=24", "hierarchical_agent.crop.subagent_max_tokens=8",
        "grpo.prompts_per_step=2", "grpo.n_samples=2", "logging.wandb_project=null", "logging.progress=false",
        "max_steps=3", "save_every=3"])
    RLTrainer(cfg).train()
    rec = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rec] == [1, 2, 3]
    assert sum(r["rollout/skipped_prompts"] for r in rec) > 0
    assert (out / "checkpoints/step_000003/COMPLETE").exists()


@pytest.mark.launcher
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux")
def test_killing_run_rl_during_saves_leaves_no_workers_and_resumes(world, tiny_dir, tmp_path):
    """run_rl.sh with two gloo trainer ranks, a checkpoint every step (so the kill lands in or near a
    save); kill -9 of the launcher's group; no worker survives; the rerun resumes from the newest
    complete checkpoint with each step's metrics and trajectories once."""
    from collections import Counter

    out = tmp_path / "rl_kill"
    args = ["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={out}",
            f"train_data=[{world}/local/paravt_rl_synth.parquet]", "hierarchical_agent.max_new_tokens=24",
            "hierarchical_agent.crop.subagent_max_tokens=8", "grpo.prompts_per_step=2", "grpo.n_samples=2",
            "logging.wandb_project=null", "logging.progress=false", "save_every=1", "keep_last=2"]
    env = {**os.environ, "NPROC": "2", "MAX_RESTARTS": "0"}
    p = subprocess.Popen(args + ["max_steps=40"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 400
        while time.time() < deadline and not (out / "checkpoints/step_000002/COMPLETE").exists():
            assert p.poll() is None, "the run ended before its second checkpoint"
            time.sleep(0.2)
        _kill_group_and_expect_no_survivors(p, out)
    finally:
        for pid in _procs_mentioning(str(out)):
            os.kill(pid, signal.SIGKILL)
    done = _newest_complete_step(out)
    r = subprocess.run(args + [f"max_steps={done + 1}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, done + 2))
    trajs = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(Counter(t["step"] for t in trajs)) == list(range(done + 1))
    assert len(set(Counter(t["step"] for t in trajs).values())) == 1


@pytest.mark.launcher
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_launcher_alone_killed_or_stopped_takes_torchrun_and_its_workers(sig, world, tiny_dir, tmp_path):
    """Only the launcher's own pid gets the signal: kill -9 (torchrun, its child, follows by
    PR_SET_PDEATHSIG) or SIGTERM (what `docker stop` sends a container's PID 1: passed on to torchrun).
    No worker survives; after SIGTERM the launcher itself exits non-zero."""
    out = tmp_path / f"rl_sig{int(sig)}"
    args = ["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={out}",
            f"train_data=[{world}/local/paravt_rl_synth.parquet]", "hierarchical_agent.max_new_tokens=16",
            "hierarchical_agent.crop.subagent_max_tokens=8", "grpo.prompts_per_step=2", "grpo.n_samples=2",
            "logging.wandb_project=null", "logging.progress=false", "save_every=100", "max_steps=100"]
    p = subprocess.Popen(args, cwd=ROOT, env={**os.environ, "NPROC": "2"}, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 400
        while time.time() < deadline and not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text()):
            assert p.poll() is None, "the run ended before its first step"
            time.sleep(0.3)
        assert len(_procs_mentioning(str(out))) >= 4  # bash -> torchrun -> 2 workers
        os.kill(p.pid, sig)
        rc = p.wait(timeout=120)
        assert rc != 0
        deadline = time.time() + 60
        while time.time() < deadline and _procs_mentioning(str(out)):
            time.sleep(0.5)
        assert _procs_mentioning(str(out)) == [], "workers outlived their launcher"
    finally:
        for pid in _procs_mentioning(str(out)):
            os.kill(pid, signal.SIGKILL)
