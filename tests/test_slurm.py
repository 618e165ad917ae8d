"""scripts/slurm: the launcher variables derived from Slurm's (fake SLURM_* variables and a stand-in
``scontrol`` on PATH), and an sbatch file run end to end with a stand-in ``srun`` that starts its step
once per node on this machine, as Slurm's would on two."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from paravt.models.parallel import free_port
from tests.faults.test_nodes import _stub_torchrun

ROOT = Path(__file__).resolve().parents[1]

SCONTROL = """#!/usr/bin/env bash
# scontrol stand-in: only 'show hostnames LIST', answered from $FAKE_HOSTS (one per line)
[[ "$1 $2" == "show hostnames" && "$3" == "$SLURM_JOB_NODELIST" ]] || { echo "unexpected: $*" >&2; exit 1; }
printf '%s\\n' $FAKE_HOSTS
"""
SRUN = """#!/usr/bin/env bash
# srun stand-in: the step once per node of the job, all at once, SLURM_NODEID set; the highest exit code
while [[ "$1" == --* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" & pids+=($!); done
rc=0
for p in "${pids[@]}"; do wait "$p" || { r=$?; (( r > rc )) && rc=$r; }; done
exit $rc
"""


def _bin(tmp_path: Path) -> Path:
    b = tmp_path / "bin"
    b.mkdir(exist_ok=True)
    for name, text in (("scontrol", SCONTROL), ("srun", SRUN)):
        (b / name).write_text(text)
        (b / name).chmod(0o755)
    return b


def _slurm_env(tmp_path: Path, **kw: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in
           ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RDZV_ID")}
    env.update({"PATH": f"{_bin(tmp_path)}:{env['PATH']}", "SLURM_JOB_ID": "81234", "SLURM_NNODES": "2",
                "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu-a[17-18]", "FAKE_HOSTS": "gpu-a17 gpu-a18"})
    env.update(kw)
    return {k: v for k, v in env.items() if v is not None}


def _derive(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", "set -euo pipefail; source scripts/slurm/env.sh; "
                           "echo $NNODES $NODE_RANK $MASTER_ADDR $MASTER_PORT $RDZV_ID"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_the_launcher_variables_come_from_slurms(tmp_path):
    r = _derive(_slurm_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "1", "gpu-a17", str(20000 + 81234 % 10000), "slurm-81234-0"]
    # a requeued job rendezvouses under a new id; an explicit MASTER_ADDR / MASTER_PORT wins
    r = _derive(_slurm_env(tmp_path, SLURM_RESTART_COUNT="2", MASTER_ADDR="10.1.2.3", MASTER_PORT="29999",
                           SLURM_NODEID="0"))
    assert r.stdout.split() == ["2", "0", "10.1.2.3", "29999", "slurm-81234-2"], r.stderr


@pytest.mark.parametrize("missing", ["SLURM_NODEID", "SLURM_JOB_NODELIST"])
def test_outside_a_job_step_is_one_line_naming_the_variable(tmp_path, missing):
    env = _slurm_env(tmp_path)
    del env[missing]
    r = _derive(env)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"scripts/slurm: {missing} is not set: run this inside a Slurm job step (srun), one task per node"]


def test_a_nodelist_scontrol_cannot_expand_is_one_line(tmp_path):
    r = _derive(_slurm_env(tmp_path, FAKE_HOSTS=""))
    assert r.returncode == 2 and "named no host" in r.stderr.strip().splitlines()[-1]


@pytest.mark.launcher
def test_the_sft_sbatch_file_runs_one_launcher_per_node_and_a_requeue_resumes(world, tiny_dir, tmp_path):
    out = tmp_path / "sft"
    args = ["bash", str(ROOT / "scripts/slurm/sft.sbatch"), "configs/sft/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={out}",
            f"data.0.path={world}/local/paravt_sft_synth.parquet", "save_every=2", "max_length=1024",
            "logging.wandb_project=null", "logging.progress=false"]
    env = _slurm_env(tmp_path, SLURM_NODEID=None, SLURM_JOB_NODELIST="localhost[0-1]", FAKE_HOSTS="127.0.0.1 127.0.0.2",
                     SLURM_SUBMIT_DIR=str(ROOT), NPROC="1", OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()))
    r = subprocess.run([*args, "max_steps=2"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    for n in (0, 1):
        assert f"scripts/slurm: node {n} of 2 (" in r.stderr and "rendezvous at 127.0.0.1:" in r.stderr
    # requeued (Slurm counts the restart): both nodes start again and the run continues from step 2
    env.update(SLURM_RESTART_COUNT="1", MASTER_PORT=str(free_port()))
    r = subprocess.run([*args, "max_steps=3"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert steps == [1, 2, 3]


@pytest.mark.launcher
def test_the_rl_sbatch_file_gives_each_node_its_share_of_the_layout(world, tiny_dir, tmp_path):
    """``rl.sbatch`` with ``rollout.layout=train:2,train:1`` (stand-in srun and torchrun): SLURM_NODEID picks the
    entry, so node 0 starts two trainer ranks and node 1 one, in one rendezvous of both nodes."""
    stub = _stub_torchrun(tmp_path)  # its bin folder is the one _slurm_env puts srun and scontrol in
    env = _slurm_env(tmp_path, SLURM_NODEID=None, SLURM_JOB_NODELIST="localhost[0-1]", FAKE_HOSTS="127.0.0.1 127.0.0.2",
                     SLURM_SUBMIT_DIR=str(ROOT), OMP_NUM_THREADS="1", NPROC=None, **stub)
    r = subprocess.run(["bash", str(ROOT / "scripts/slurm/rl.sbatch"), "configs/rl/tiny.yaml", f"model_path={tiny_dir}",
                        f"output_dir={tmp_path / 'rl'}", f"train_data=[{world}/local/paravt_rl_synth.parquet]",
                        "rollout.layout=train:2,train:1", "grpo.prompts_per_step=3"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    for node, ranks in ((0, 2), (1, 1)):
        args = (tmp_path / f"torchrun.{node}.txt").read_text().splitlines()
        assert f"--nproc_per_node={ranks}" in args and "--nnodes=2" in args and "NNODES=2" in args, args
        assert "--rdzv-endpoint=127.0.0.1:" + str(20000 + 81234 % 10000) in args and "--rdzv-id=slurm-81234-0" in args


def _gpus(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", "set -euo pipefail; source scripts/slurm/env.sh; echo \"${NODE_GPUS:-unset}\""],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("slurm,gpus", [({"SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_NODE": "8"}, "4"),
                                        ({"SLURM_GPUS_PER_NODE": "h100:4"}, "4"), ({"SLURM_GPUS_PER_NODE": "6"}, "6"),
                                        ({"SLURM_GPUS_PER_NODE": "a100:2,v100:2"}, "4"),
                                        ({"SLURM_GPUS_ON_NODE": "4", "NODE_GPUS": "2"}, "2"), ({}, "unset")])
def test_a_nodes_gpus_come_from_slurms_grant(tmp_path, slurm, gpus):
    env = {k: v for k, v in _slurm_env(tmp_path).items() if k != "NODE_GPUS"}
    r = _gpus({**env, **slurm})
    assert r.returncode == 0 and r.stdout.split() == [gpus], r.stderr


def test_the_launchers_run_on_the_granted_gpus_and_refuse_more_than_cuda_sees():
    from paravt.core.cluster import node_gpus
    assert node_gpus(8, {"NODE_GPUS": "4"}) == 4 and node_gpus(8, {}) == 8 and node_gpus(0, {"NODE_GPUS": "8"}) == 0
    with pytest.raises(ValueError, match="NODE_GPUS=8 .* but CUDA sees 4"):
        node_gpus(4, {"NODE_GPUS": "8"})
    for f in ("sft.sbatch", "rl.sbatch", "eval.sbatch"):
        lines = (ROOT / "scripts/slurm" / f).read_text().splitlines()
        assert "#SBATCH --mem=0" in lines, f  # the whole node's memory, not Slurm's per-CPU default
        at = lines.index("#SBATCH --mem=0")
        assert lines[at - 1].startswith("#") and "memory" in " ".join(lines[at - 2:at])  # said why
        assert "NODE_GPUS" in (ROOT / "scripts/slurm/env.sh").read_text()
