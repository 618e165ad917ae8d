"""PARA-GRPO through ``run_rl.sh`` against two rollout servers (``hf_server`` processes speaking SGLang's
API, weights by disk): one killed mid-run, or frozen while it holds its port (SIGSTOP), is evicted and
the run goes on to exit 0; every step's requests after that go to the live one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.engines.test_pool import _start

ROOT = Path(__file__).resolve().parents[2]


def _run(world, tiny_dir, tmp_path, kill: list[int], sig: int = signal.SIGKILL):
    """The run, with the servers ``kill`` sent ``sig`` once step 1 is logged; also the seconds from then to
    the run's end."""
    urls, procs = _start(tiny_dir, 2)
    out = tmp_path / "rl"
    cmd = ["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={out}",
           f"train_data=[{world}/local/paravt_rl_synth.parquet]", "hierarchical_agent.max_new_tokens=16",
           "hierarchical_agent.crop.subagent_max_tokens=8", "grpo.prompts_per_step=2", "grpo.n_samples=2",
           "grpo.max_staleness=0", "rollout.engine=sglang", "rollout.replicas=0", f"rollout.urls=[{','.join(urls)}]",
           "rollout.router=false",  # the pool's own eviction (sglang-router in front: tests/engines/test_sglang_router.py)
           "rollout.weight_sync=disk", "logging.wandb_project=null", "logging.progress=false", "max_steps=4",
           "save_every=4"]
    try:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "NPROC": "1", "MAX_RESTARTS": "0", "OMP_NUM_THREADS": "1"})
        metrics = out / "metrics.jsonl"
        deadline = time.time() + 600
        while time.time() < deadline and not (metrics.exists() and '"step": 1' in metrics.read_text()):
            assert p.poll() is None, p.stderr.read()[-3000:]
            time.sleep(0.3)
        t_fault = time.monotonic()
        for i in kill:
            procs[i].send_signal(sig)
            if sig == signal.SIGKILL:
                procs[i].wait(timeout=30)
        err = p.communicate(timeout=900)[1]
        after = time.monotonic() - t_fault
    finally:
        for q in procs:
            q.kill()
            q.wait(timeout=30)
    return p.returncode, err, urls, out, after


@pytest.mark.launcher
def test_a_rollout_server_killed_mid_run_is_evicted_and_the_run_goes_on(world, tiny_dir, tmp_path):
    rc, err, urls, out, _ = _run(world, tiny_dir, tmp_path, [1])
    metrics = out / "metrics.jsonl"
    assert rc == 0, err[-3000:]
    assert (out / "final/config.json").is_file()
    evicted = [x for x in err.splitlines() if "evicted" in x]
    assert len(evicted) == 1 and urls[1] in evicted[0], err[-3000:]
    steps = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    steps = [s for s in steps if "step" in s]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(s["rollout/skipped_prompts"] == 0 for s in steps)  # no prompt lost to the dead server
    assert steps[-1]["rollout/requests_server1"] == 0 and steps[-1]["rollout/requests_server0"] > 0


@pytest.mark.launcher
def test_a_rollout_server_frozen_mid_run_is_evicted_in_seconds_and_the_run_goes_on(world, tiny_dir, tmp_path):
    """SIGSTOP: the server keeps its port and answers nothing. Its requests in flight and the next weight push
    fail after rollout.health_misses probes without an answer (3 x (5 + 5) s at most, each), it is evicted with
    one line, and steps 2-4 run on the live server: without the probes each waited its own timeout (the push
    600 s twice, a request 900 s)."""
    rc, err, urls, out, after = _run(world, tiny_dir, tmp_path, [1], signal.SIGSTOP)
    print(f"from the freeze to the end of step 4: {after:.0f} s")
    assert rc == 0, err[-3000:]
    evicted = [x for x in err.splitlines() if "evicted" in x]
    lines = "\n".join(x for x in err.splitlines() if "it/s]" not in x)
    assert len(evicted) == 1 and urls[1] in evicted[0] and "did not answer /health" in evicted[0], lines[-3000:]
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [s for s in steps if "step" in s]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(s["rollout/skipped_prompts"] == 0 for s in steps)
    assert steps[-1]["rollout/requests_server1"] == 0


@pytest.mark.launcher
def test_with_no_rollout_server_left_the_run_ends_with_exit_3_and_a_checkpoint(world, tiny_dir, tmp_path):
    rc, err, urls, out, _ = _run(world, tiny_dir, tmp_path, [0, 1])
    line = err.strip().splitlines()[-1]
    assert rc == 3, err[-3000:]
    assert "no rollout server left" in line and urls[0] in line and urls[1] in line and "resume=auto" in line, line
    assert not (out / "final").exists() and list((out / "checkpoints").glob("step_*/COMPLETE"))
    # torchrun's own traceback and failure report: in the log the launcher names above the line, not on the terminal
    log = out / "logs/torchrun_node0.log"
    assert "ChildFailedError" not in err and "Root Cause" not in err, err[-3000:]
    assert err.strip().splitlines()[-2] == f"(torchrun's whole output, with its traceback and failure report: {log})"
    assert "ChildFailedError" in log.read_text() and "no rollout server left" in log.read_text()
