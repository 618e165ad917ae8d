"""``rollout.layout`` through ``scripts/run_rl.sh`` on two nodes, both on this machine (two launchers,
``NNODES=2``, one shared ``output_dir``): each node's launcher starts its own rollout servers (the
repository's ``hf_server``, on CPU), trainer rank 0 finds every node's through the run folder, and a node
with no trainer rank serves until the run ends."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from paravt.models.parallel import free_port
from tests.faults.test_nodes import ROOT, _last_line, _node, _stub_torchrun

pytestmark = pytest.mark.launcher


def _rl(world, tiny_dir, out: Path, layout: str, steps: int = 2) -> list[str]:
    return ["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={out}",
            f"train_data=[{world}/local/paravt_rl_synth.parquet]", "hierarchical_agent.max_new_tokens=16",
            "hierarchical_agent.crop.subagent_max_tokens=8", "grpo.prompts_per_step=2", "grpo.n_samples=2",
            "grpo.max_staleness=0", "rollout.engine=hf_server", f"rollout.layout={layout}",
            "logging.wandb_project=null", "logging.progress=false", f"max_steps={steps}", f"save_every={steps}"]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_each_node_starts_its_servers_and_rank_0_finds_them_all(world, tiny_dir, tmp_path):
    """Node 0 trains and serves, node 1 only serves: 2 steps over both servers, exit 0 on both."""
    out, port = tmp_path / "rl", free_port()
    env = {"NPROC": "", "RDZV_TIMEOUT": "60", "HEARTBEAT_S": "1", "MAX_RESTARTS": "0", "NCCL_CUMEM_ENABLE": ""}
    t0 = time.monotonic()
    procs = [_node(_rl(world, tiny_dir, out, "train:1+rollout:1,rollout:1"), n, port, **env) for n in (0, 1)]
    published: dict[int, dict] = {}
    try:
        folder = out / ".paravt/servers" / f"paravt-{port}"
        deadline = time.time() + 300
        while len(published) < 2 and time.time() < deadline and all(p.poll() is None for p in procs):
            for n in (0, 1):
                try:
                    published.setdefault(n, json.loads((folder / f"node{n}.json").read_text()))
                except (OSError, ValueError):
                    pass
            time.sleep(0.3)
        # the servers a node's launcher starts get the weight group's NCCL setting, as rank 0's would
        envs = [Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") for r in published.values() for pid in r["pids"]]
        errs = [p.communicate(timeout=600)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    took = time.monotonic() - t0
    print(f"two nodes, 2 steps: {took:.0f} s")
    assert [p.returncode for p in procs] == [0, 0], errs[0][-3000:] + "\n----\n" + errs[1][-3000:]
    assert sorted(published) == [0, 1] and all(len(r["urls"]) == 1 for r in published.values()), published
    assert len(envs) == 2 and all(b"NCCL_CUMEM_ENABLE=0" in e for e in envs)
    assert "node 1 (" in errs[1] and f"serves {published[1]['urls'][0]} (rollout.layout)" in errs[1]
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [s for s in steps if "step" in s]
    assert [s["step"] for s in steps] == [1, 2]
    # rank 0 sent requests to both nodes' servers (node order: node 0's is server 0)
    assert sum(s["rollout/requests_server0"] for s in steps) > 0 and sum(s["rollout/requests_server1"] for s in steps) > 0
    assert (out / "final/config.json").is_file()
    time.sleep(2)
    assert not [pid for r in published.values() for pid in r["pids"] if _alive(pid)]  # no server outlives its node
    assert not list(folder.glob("node*.json"))  # each node withdrew its servers
    assert took < 400, took


def test_a_node_whose_servers_never_appear_ends_the_run_with_one_line_naming_it(world, tiny_dir, tmp_path):
    """Only node 0's launcher (node 1 would only serve): rank 0 waits SERVERS_TIMEOUT, then exit 3."""
    out = tmp_path / "rl"
    p = _node(_rl(world, tiny_dir, out, "train:1,rollout:1"), 0, free_port(), NPROC="", SERVERS_TIMEOUT="5",
              MAX_RESTARTS="1")
    err = p.communicate(timeout=300)[1]
    line = _last_line(err)
    print(line)
    assert p.returncode == 3, err[-3000:]
    assert "the rollout engine did not start: EngineError: rollout.layout: no rollout server answers (node 1 (no " in line
    assert "(SERVERS_TIMEOUT=5)" in line and "NODE_RANK" in line, line
    assert err.count("no rollout server answers") <= 2  # one line, not once per restart


def _rank0_node(out: Path) -> str | None:
    """NODE_RANK of the launcher whose torchrun runs global rank 0 of the run writing to ``out`` (read from the
    worker's environment; other tests' trainers running beside this one are not this run's)."""
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes() if d.name.isdigit() else b""
            if b"paravt.rl.train" in cmd and f"output_dir={out}".encode() in cmd.split(b"\0"):
                env = dict(x.split(b"=", 1) for x in (d / "environ").read_bytes().split(b"\0") if b"=" in x)
                if env.get(b"RANK") == b"0" and b"LOCAL_RANK" in env:
                    return env[b"NODE_RANK"].decode()
        except OSError:
            pass
    return None


def test_without_a_layout_rank_0_finds_node_0s_servers_on_whichever_node_torch_puts_it(world, tiny_dir, tmp_path):
    """torch's c10d rendezvous orders the nodes by address string: 127.0.0.10 (node 1) before 127.0.0.9 (node 0),
    so global rank 0 runs on node 1; node 0's launcher starts the server and rank 0 finds it: 2 steps, exit 0."""
    out, port = tmp_path / "rl", free_port()
    cmd = [a for a in _rl(world, tiny_dir, out, "-") if not a.startswith("rollout.layout=")] + ["rollout.replicas=1"]
    env = {"NPROC": "1", "RDZV_TIMEOUT": "60", "HEARTBEAT_S": "1", "MAX_RESTARTS": "0"}
    procs = [_node(cmd, n, port, LOCAL_ADDR=addr, **env) for n, addr in ((0, "127.0.0.9"), (1, "127.0.0.10"))]
    rank0, record = None, None
    try:
        deadline = time.time() + 300
        while time.time() < deadline and all(p.poll() is None for p in procs) and (rank0 is None or record is None):
            rank0 = rank0 or _rank0_node(out)
            try:
                record = record or json.loads((out / ".paravt/servers" / f"paravt-{port}" / "node0.json").read_text())
            except (OSError, ValueError):
                pass
            time.sleep(0.3)
        errs = [p.communicate(timeout=600)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    assert [p.returncode for p in procs] == [0, 0], errs[0][-3000:] + "\n----\n" + errs[1][-3000:]
    assert rank0 == "1"  # the order torch chose, not NODE_RANK's
    assert record is not None and record["urls"] == [record["urls"][0]] and "127.0.0.9" in record["urls"][0]
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [s["step"] for s in steps if "step" in s] == [1, 2]


def test_a_serving_only_node_with_its_own_folder_stops_both_nodes_with_exit_2_naming_it(world, tiny_dir, tmp_path):
    """Node 1 only serves (no torchrun of its own): it checks the folder before it starts servers, and node 0's
    watcher ends node 0's run with its line, in seconds (not rank 0's SERVERS_TIMEOUT)."""
    port, t0 = free_port(), time.monotonic()
    env = {"NPROC": "", "RDZV_TIMEOUT": "60", "HEARTBEAT_S": "1", "MAX_RESTARTS": "0", "FS_CHECK_TIMEOUT": "3",
           "SERVERS_TIMEOUT": "600"}
    procs = [_node(_rl(world, tiny_dir, tmp_path / f"own{n}", "train:1,rollout:1"), n, port, **env) for n in (0, 1)]
    try:
        errs = [p.communicate(timeout=300)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    took = time.monotonic() - t0
    lines = [_last_line(e) for e in errs]
    print(f"{took:.1f} s: {lines[1]}")
    assert [p.returncode for p in procs] == [2, 2], errs[0][-3000:] + "\n----\n" + errs[1][-3000:]
    assert lines[1].startswith("run_rl.sh: node 1 (") and "does not see node 0's heartbeat move under " in lines[1]
    assert "within 3 s (FS_CHECK_TIMEOUT)" in lines[1] and "shares" in lines[1], lines[1]
    assert lines[0] == lines[1]  # node 0 ends with node 1's line
    assert not list((tmp_path / "own1").glob("rollout_server*.log"))  # no server started on node 1
    assert took < 120, took


def _launch(world, tiny_dir, tmp_path, layout: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **_stub_torchrun(tmp_path), "NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29124", "NPROC": "", **env}
    return subprocess.run(_rl(world, tiny_dir, tmp_path / "o", layout), cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=300)


def test_torchrun_joins_only_the_nodes_that_train(world, tiny_dir, tmp_path):
    """Node 0 of ``train:2,rollout:1``: a rendezvous of one node, two ranks, and node 1's server expected."""
    r = _launch(world, tiny_dir, tmp_path, "train:2,rollout:1")
    assert r.returncode == 0, r.stderr[-3000:]
    args = (tmp_path / "torchrun.0.txt").read_text().splitlines()
    assert args[:3] == ["NCCL_CUMEM_ENABLE=0", "NNODES=1", "SERVERS=1:1"], args
    assert {"--nnodes=1", "--nproc_per_node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29124"} <= set(args)


@pytest.mark.parametrize("layout, env, fragment", [
    ("train:1,serve:1", {}, "run_rl.sh: rollout.layout='train:1,serve:1': 'serve:1' in the entry 'serve:1' is not"),
    ("train:1+rollout:1", {}, "run_rl.sh: rollout.layout='train:1+rollout:1': 1 node entry for NNODES=2"),
    ("train:1,rollout:1", {"NPROC": "1", "NODE_RANK": "1"}, "run_rl.sh: NPROC=1, but rollout.layout="),
    ("train:9,rollout:1", {}, "run_rl.sh: grpo.prompts_per_step=2"),  # 9 trainer ranks for 2 x 2 samples
])
def test_a_bad_layout_stops_in_the_preflight_with_one_line(layout, env, fragment, world, tiny_dir, tmp_path):
    r = _launch(world, tiny_dir, tmp_path, layout, **env)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(fragment), r.stderr[-2000:]
    assert not list(tmp_path.glob("torchrun.*.txt")) and not (tmp_path / "o").exists()
