"""Two nodes as users launch them (``NNODES=2 NODE_RANK=<0|1> MASTER_ADDR=… bash scripts/run_rl.sh`` on
each), both on this machine: the trainer group spans the two launches, and the weight group is formed
by global rank 0 under a multi-node torchrun (each node's agent its own store)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    from paravt.models.parallel import free_port

    return free_port()


def _two_nodes(cmd: list[str], env: dict, timeout: int = 900) -> list[subprocess.CompletedProcess]:
    port = _free_port()
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **env, "NNODES": "2", "NODE_RANK": str(n), "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
             for n in (0, 1)]
    out = []
    for p in procs:
        so, se = p.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(cmd, p.returncode, so, se))
    return out


@pytest.mark.launcher
def test_rl_across_two_nodes_through_run_rl_sh(world, tiny_dir, tmp_path):
    out = tmp_path / "rl"
    cmd = ["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={out}",
           f"train_data=[{world}/local/paravt_rl_synth.parquet]", "hierarchical_agent.max_new_tokens=16",
           "hierarchical_agent.crop.subagent_max_tokens=8", "grpo.prompts_per_step=2", "grpo.n_samples=2",
           "logging.wandb_project=null", "logging.progress=false", "max_steps=2", "save_every=2"]
    r0, r1 = _two_nodes(cmd, {"NPROC": "1", "MAX_RESTARTS": "0"})
    assert (r0.returncode, r1.returncode) == (0, 0), r0.stderr[-3000:] + r1.stderr[-3000:]
    assert (out / "final/config.json").is_file()
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [s["step"] for s in steps if "step" in s][-1] == 2


@pytest.mark.launcher
def test_the_weight_group_forms_under_a_two_node_torchrun(tiny_dir, tmp_path):
    """push_fault_script.py's ``push`` (FSDP2 shards on both nodes, global rank 0 serving the weight
    group's store to two receivers) under torchrun's multi-node launch, as run_rl.sh starts it."""
    res_file = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--max-restarts=0"]
    port = _free_port()
    procs = [subprocess.Popen([*cmd, f"--node_rank={n}", "--master_addr=127.0.0.1", f"--master_port={port}",
                               str(ROOT / "tests/rl/push_fault_script.py"), str(tiny_dir), str(res_file), "push"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}) for n in (0, 1)]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs[0][-3000:] + errs[1][-3000:]
    res = json.loads(res_file.read_text())
    assert res["exact"] == [True, True] and res["dtypes"] == ["torch.bfloat16"], res
