"""Several nodes as users start them (``NNODES=2 NODE_RANK=<0|1> MASTER_ADDR=… bash scripts/run_sft.sh`` on
each), both on this machine: torchrun's c10d rendezvous joins them, the run folder is checked to be
shared, and a node that is lost ends the other within RDZV_TIMEOUT with one line naming it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paravt.models.parallel import free_port

ROOT = Path(__file__).resolve().parents[2]


def _sft(world, tiny_dir, out: Path, steps: int) -> list[str]:
    return ["bash", "scripts/run_sft.sh", "configs/sft/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={out}",
            f"data.0.path={world}/local/paravt_sft_synth.parquet", f"max_steps={steps}", "save_every=2",
            "max_length=1024", "logging.wandb_project=null", "logging.progress=false"]


def _node(cmd: list[str], n: int, port: int, **env: str) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            env={**os.environ, "NPROC": "1", "NNODES": "2", "NODE_RANK": str(n),
                                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **env})


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else ""


def _procs_mentioning(needle: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if needle in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@pytest.mark.launcher
def test_a_node_whose_run_folder_is_not_shared_ends_the_run_with_exit_2_naming_it(world, tiny_dir, tmp_path):
    port = free_port()
    t0 = time.monotonic()
    procs = [_node(_sft(world, tiny_dir, tmp_path / f"own{n}", 4), n, port, FS_CHECK_TIMEOUT="3") for n in (0, 1)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    took = time.monotonic() - t0
    assert [p.returncode for p in procs] == [2, 2], errs[0][-3000:] + errs[1][-3000:]
    for e in errs:
        line = _last_line(e)
        print(f"{took:.1f} s: {line}")
        # torch numbers the nodes by address, then pid: global rank 0 is on either launcher, the other is named
        m = re.match(r"run_sft\.sh: node (\d) \(.*\) does not see the token file that global rank 0 on node (\d) ", line)
        assert m and {m.group(1), m.group(2)} == {"0", "1"} and "shares" in line, e[-3000:]
        assert line == _last_line(errs[0])  # the same line from both launchers
    assert not (tmp_path / "own0/checkpoints").exists()  # nothing trained
    assert took < 120, took  # the 3 s bound and two start-ups, not a collective's timeout


@pytest.mark.launcher
def test_the_check_passes_on_a_shared_folder_under_a_two_node_torchrun(tmp_path):
    """The check's own module under torchrun's c10d rendezvous, as the launchers start it, with a
    trivial stage (``python -m platform``) after it."""
    port, out = free_port(), tmp_path / "shared"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--max-restarts=0",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=fs-check"]
    procs = [subprocess.Popen([*cmd, f"--rdzv-conf=join_timeout=60,is_host={int(n == 0)}", "-m",
                               "paravt.core.shared_fs", "check", "--output-dir", str(out), "--prog", "t", "--timeout",
                               "10", "platform"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "NNODES": "2", "NODE_RANK": str(n), "OMP_NUM_THREADS": "1"})
             for n in (0, 1)]
    res = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], res[0][1][-3000:] + res[1][1][-3000:]
    assert all("Linux" in so for so, _ in res)  # the stage ran after the check, on both nodes
    assert list((out / ".paravt/fs").iterdir()) == []  # the token is removed once every node saw it


@pytest.mark.launcher
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux")
def test_a_lost_node_ends_the_other_within_the_bound_and_the_run_resumes(world, tiny_dir, tmp_path):
    out, port = tmp_path / "run", free_port()
    env = {"RDZV_TIMEOUT": "10", "HEARTBEAT_S": "1", "MAX_RESTARTS": "1"}
    procs = [_node(_sft(world, tiny_dir, out, 400), n, port, **env) for n in (0, 1)]
    try:
        deadline = time.time() + 400
        while time.time() < deadline and not (out / "checkpoints/step_000002/COMPLETE").exists():
            assert all(p.poll() is None for p in procs), "the run ended before its first checkpoint"
            time.sleep(0.3)
        os.killpg(procs[1].pid, signal.SIGKILL)  # node 1's launcher and everything it started
        t0 = time.monotonic()
        err = procs[0].communicate(timeout=120)[1]
        took = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    line = _last_line(err)
    print(f"node 0 ended {took:.1f} s after node 1 was killed: {line}")
    assert procs[0].returncode == 3, err[-3000:]
    assert line.startswith("run_sft.sh: node 1 (") and "resume" in line, err[-3000:]
    assert took < 10 + 30, took  # RDZV_TIMEOUT plus a heartbeat and the shutdown
    deadline = time.time() + 30
    while time.time() < deadline and _procs_mentioning(str(out)):
        time.sleep(0.5)
    assert _procs_mentioning(str(out)) == []
    # both launchers again: the run continues from the newest complete checkpoint
    done = max(int(c.name.split("_")[1]) for c in (out / "checkpoints").glob("step_*") if (c / "COMPLETE").exists())
    port = free_port()
    procs = [_node(_sft(world, tiny_dir, out, done + 1), n, port, **env) for n in (0, 1)]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs[0][-3000:] + errs[1][-3000:]
    assert (out / f"checkpoints/step_{done + 1:06d}/COMPLETE").exists() or (out / "final").exists()


def _stub_torchrun(tmp_path: Path) -> dict[str, str]:
    """A ``torchrun`` on PATH that records the weight group's NCCL setting, the node count and the layout's
    servers its workers see, and its arguments, then exits 0."""
    b = tmp_path / "bin"
    b.mkdir()
    (b / "torchrun").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "NCCL_CUMEM_ENABLE=${NCCL_CUMEM_ENABLE:-unset}" '
                                '"NNODES=${NNODES:-unset}" "SERVERS=${PARAVT_SERVERS_NODES-unset}" "$@" '
                                f'> {tmp_path}/torchrun.$NODE_RANK.txt\n')
    (b / "torchrun").chmod(0o755)
    venv = ROOT / ".venv-cpu"  # the launcher activates no venv of its own then, so the stub stays first on PATH
    return {"PATH": f"{b}:{venv}/bin:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}


@pytest.mark.launcher
@pytest.mark.parametrize("nnodes", [1, 2])
def test_run_rl_sh_starts_torchrun_with_c10d_on_several_nodes_and_the_weight_groups_nccl_setting(
        nnodes, world, tiny_dir, tmp_path):
    cmd = ["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={tmp_path / 'o'}",
           f"train_data=[{world}/local/paravt_rl_synth.parquet]", "grpo.prompts_per_step=2"]
    env = {**os.environ, **_stub_torchrun(tmp_path), "NPROC": "1", "NNODES": str(nnodes), "NODE_RANK": "0",
           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29123", "RDZV_TIMEOUT": "42"}
    env.pop("NCCL_CUMEM_ENABLE", None)
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    args = (tmp_path / "torchrun.0.txt").read_text().splitlines()
    assert args[0] == "NCCL_CUMEM_ENABLE=0"  # the trainers' (and the servers they launch) NCCL setting
    if nnodes == 1:  # one node: as before, no rendezvous across nodes, no check
        assert "--standalone" in args and args[args.index("-m") + 1] == "paravt.rl.train"
        return
    assert {"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29123", "--rdzv-id=paravt-29123",
            "--rdzv-conf=join_timeout=42,is_host=1", "--max-restarts=3"} <= set(args), args
    i = args.index("-m")
    assert args[i + 1:i + 3] == ["paravt.core.shared_fs", "check"] and "paravt.rl.train" in args


@pytest.mark.launcher
@pytest.mark.parametrize("env, fragment", [({"NODE_RANK": "2"}, "NODE_RANK=2 must be one of 0..1"),
                                           ({"NODE_RANK": ""}, "NODE_RANK= must be one of 0..1"),
                                           ({"MASTER_ADDR": ""}, "set MASTER_ADDR to node 0's address")])
def test_a_bad_node_setting_is_one_line_before_torchrun(env, fragment, world, tiny_dir, tmp_path):
    cmd = ["bash", "scripts/run_sft.sh", "configs/sft/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={tmp_path / 'o'}",
           f"data.0.path={world}/local/paravt_sft_synth.parquet"]
    full = {**os.environ, **_stub_torchrun(tmp_path), "NPROC": "1", "NNODES": "2", "NODE_RANK": "1",
            "MASTER_ADDR": "127.0.0.1", **env}
    r = subprocess.run(cmd, cwd=ROOT, env=full, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and fragment in _last_line(r.stderr), r.stderr[-2000:]
    assert not list(tmp_path.glob("torchrun.*.txt"))  # torchrun never started
