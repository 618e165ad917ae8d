"""PARA-GRPO through ``run_rl.sh`` against two rollout servers (``hf_server`` processes speaking SGLang's
API, weights by disk): one killed mid-run is evicted and the run goes on to exit 0; every step's
requests after that go to the live one."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.engines.test_pool import _start

ROOT = Path(__file__).resolve().parents[2]


def _run(world, tiny_dir, tmp_path, kill: list[int]):
    """The run, with the servers ``kill`` killed once step 1 is logged."""
    urls, procs = _start(tiny_dir, 2)
    out = tmp_path / "rl"
    cmd = ["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={out}",
           f"train_data=[{world}/local/paravt_rl_synth.parquet]", "hierarchical_agent.max_new_tokens=16",
           "hierarchical_agent.crop.subagent_max_tokens=8", "grpo.prompts_per_step=2", "grpo.n_samples=2",
           "grpo.max_staleness=0", "rollout.engine=sglang", "rollout.replicas=0", f"rollout.urls=[{','.join(urls)}]",
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
        for i in kill:
            procs[i].kill()
            procs[i].wait(timeout=30)
        err = p.communicate(timeout=900)[1]
    finally:
        for q in procs:
            q.kill()
            q.wait(timeout=30)
    return p.returncode, err, urls, out


@pytest.mark.launcher
def test_a_rollout_server_killed_mid_run_is_evicted_and_the_run_goes_on(world, tiny_dir, tmp_path):
    rc, err, urls, out = _run(world, tiny_dir, tmp_path, [1])
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
def test_with_no_rollout_server_left_the_run_ends_with_exit_3_and_a_checkpoint(world, tiny_dir, tmp_path):
    rc, err, urls, out = _run(world, tiny_dir, tmp_path, [0, 1])
    line = err.strip().splitlines()[-1]
    assert rc == 3, err[-3000:]
    assert "no rollout server left" in line and urls[0] in line and urls[1] in line and "resume=auto" in line, line
    assert not (out / "final").exists() and list((out / "checkpoints").glob("step_*/COMPLETE"))
