"""Two nodes on one machine through ``scripts/run_rl.sh`` with REAL vLLM rollout servers (CPU build): two
launchers (``NNODES=2``, ``NODE_RANK`` 0 and 1, ``MASTER_ADDR=127.0.0.1``, one shared ``output_dir``) and
``rollout.layout=train:1+rollout:1,rollout:1``: each node's launcher starts one vLLM server from
``.venv-vllm``, trainer rank 0 (a gloo trainer on node 0) finds both through the run folder, sends every
request through one ``vllm-router`` in front of them (``rollout.router``, on for vLLM with two or more
servers) and streams each policy version to both over one broadcast weight group.

three steps at staleness 0: both servers behind the router answer requests in the first step and receive its
version, and the trainer's recomputation of what they generated matches their logprobs within 1e-4 at every
version (so each server held exactly the weights pushed); node 1's server is then killed with -9: rank 0's pool
evicts it with one warning line, the router and the weight group go on with node 0's server alone, the run still
finishes its three steps, node 1's launcher says its server exited and ends with the run, exit 0, and nothing
the launchers started outlives them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import requests

from paravt.models.parallel import free_port
from tests.faults.test_nodes import _node, _procs_mentioning
from tests.real_server.test_rl_vllm import _cmdline, _descendants, _metrics, _rl_args

pytestmark = pytest.mark.real_server

LAYOUT = "train:1+rollout:1,rollout:1"
# the layout sets each node's trainer ranks (NPROC unset); no restart hides a crash; a heartbeat a second
ENV = {"NPROC": "", "RDZV_TIMEOUT": "120", "HEARTBEAT_S": "1", "MAX_RESTARTS": "0", "NCCL_CUMEM_ENABLE": ""}


class _Nodes:
    """Both nodes' launchers as users start them, their stderr read as it comes (a full pipe would stall a
    launcher mid-run), and the servers each node published under the run folder (``node<N>.json``)."""

    def __init__(self, world: Path, model: Path, out: Path):
        self.out, port = out, free_port()
        cmd = ["bash", "scripts/run_rl.sh", *_rl_args(world, model, out, "max_steps=3", "save_every=3",
                                                      "grpo.max_staleness=0", "rollout.weight_sync=broadcast",
                                                      f"rollout.layout={LAYOUT}")]
        self.folder = out / ".paravt/servers" / f"paravt-{port}"
        self.published: dict[int, dict] = {}
        self.groups: list[int] = []  # more process groups of the run to see gone (the router's)
        self.procs = [_node(cmd, n, port, **ENV) for n in (0, 1)]
        self._err: list[list[str]] = [[], []]
        self._readers = [threading.Thread(target=buf.extend, args=(p.stderr,), daemon=True)
                         for buf, p in zip(self._err, self.procs)]
        for t in self._readers:
            t.start()

    def _until(self, done, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            ended = [n for n, p in enumerate(self.procs) if p.poll() is not None]
            if ended or time.monotonic() > deadline:
                why = f"node {ended[0]}'s launcher exited" if ended else f"{timeout_s:.0f} s passed"
                self.keep_stderr()
                pytest.fail(f"{why} before {what}:\n{self.stderr(0)[-3000:]}\n----\n{self.stderr(1)[-3000:]}")
            time.sleep(0.2)

    def wait_published(self, timeout_s: float = 900) -> dict[int, dict]:
        def both() -> bool:
            for n in (0, 1):
                try:
                    self.published.setdefault(n, json.loads((self.folder / f"node{n}.json").read_text()))
                except (OSError, ValueError):
                    pass
            return len(self.published) == 2

        self._until(both, "both nodes published their servers", timeout_s)
        return self.published

    def wait_step(self, step: int, timeout_s: float = 900) -> None:
        def logged() -> bool:
            try:
                return any(m.get("step", 0) >= step for m in _metrics(self.out))
            except (OSError, ValueError):
                return False

        self._until(logged, f"step {step} was in metrics.jsonl", timeout_s)

    def finish(self, timeout_s: float = 900) -> list[int]:
        codes = [p.wait(timeout=timeout_s) for p in self.procs]
        for t in self._readers:
            t.join(timeout=30)
        self.keep_stderr()
        return codes

    def stderr(self, n: int) -> str:
        return "".join(self._err[n])

    def keep_stderr(self) -> None:
        """Each launcher's whole stderr beside the run folder (``node<N>.stderr``), for a failure's reader."""
        for n in (0, 1):
            (self.out.parent / f"node{n}.stderr").write_text(self.stderr(n))

    def urls(self) -> list[str]:
        return [self.published[n]["urls"][0] for n in (0, 1)]

    def server_pids(self) -> list[int]:
        return [pid for n in sorted(self.published) for pid in self.published[n]["pids"]]

    def router(self) -> tuple[int, str]:
        """(pid, URL) of the vllm-router trainer rank 0 started (it renames itself ``vllm::router``, so it is
        found among node 0's processes; its port is in rank 0's log line that starts it)."""
        pids = [d for d in _descendants(self.procs[0].pid) if _cmdline(d).startswith("vllm::router")]
        lines = [ln for ln in self.stderr(0).splitlines() if "starting vllm-router:" in ln]
        assert len(pids) == 1 and len(lines) == 1, (pids, lines)
        argv = lines[0].split()
        self.groups.append(pids[0])
        return pids[0], f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"

    def left_behind(self) -> list[str]:
        """What still runs of this run: a process in a launcher's group, a server's or the router's (each its
        own; a server's engine processes included), their reapers, anything naming the run folder (torchrun,
        the trainer, node_servers, the heartbeat watchers)."""
        left = []
        for pgid in [p.pid for p in self.procs] + self.server_pids() + self.groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, 0)
                left.append(f"process group {pgid}")
        needles = [str(self.out), *(f"--pgid {pid}" for pid in self.server_pids() + self.groups)]
        return left + [f"{pid}: {_cmdline(pid)[:120]}" for x in needles for pid in _procs_mentioning(x)]

    def assert_nothing_left(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while self.left_behind() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not self.left_behind(), self.left_behind()

    def kill(self) -> None:
        """Every launcher still running and every published server, with their groups (a failed test)."""
        for pgid in [p.pid for p in self.procs if p.poll() is None] + self.server_pids() + self.groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


@contextlib.contextmanager
def _two_nodes(world: Path, model: Path, out: Path):
    run = _Nodes(world, model, out)
    try:
        yield run
    finally:
        run.kill()


def _served(out: Path, node: int, route: str) -> int:
    """Requests to ``route`` that node ``node``'s vLLM server answered with 200, as its access log has them."""
    log = (out / f"rollout_vllm_node{node}.log").read_text(errors="replace")
    return log.count(f'"POST {route} HTTP/1.1" 200')


def _check_steps(rec: list[dict]) -> None:
    """Three steps, each trained on rollouts of the version just pushed, whose logprobs the trainer's own
    re-score matches within 1e-4 (a server holding other weights, or a part of them, would not)."""
    assert [m["step"] for m in rec] == [1, 2, 3]
    for m in rec:
        assert m["rollout/skipped_prompts"] == 0 and m["rollout/samples"] > 0, m
        assert m["rollout/version_min"] == m["rollout/version_max"] == m["step"] - 1, m
        assert m["rollout/logprob_gap_max"] < 1e-4, (m["step"], m["rollout/logprob_gap_max"])


@pytest.mark.timeout(2400)
def test_two_nodes_serve_behind_rank_0s_router_and_a_killed_node_is_evicted(sft_world, sft_checkpoint, tmp_path):
    """The cluster's shape at CPU size, then a node lost. Node 0 trains and serves, node 1 only serves: rank 0
    finds both servers through the run folder and routes every request through one router listing both; the
    first step is served by both, and both receive its version over one broadcast group (the gloo trainer and
    each node's worker), what they generate the trainer's policy within 1e-4. Then kill -9 of node 1's API
    server (as an OOM killer would): its requests fail, rank 0's pool finds it dead (one warning line, the only
    eviction of the run), the router stops sending to it, the next broadcast re-forms the weight group with
    node 0's server only, and the run ends normally. Node 1's launcher, whose only job is serving, says its
    server exited and stays until the run is over, then ends with the run's code (0); nothing of the run
    (servers' engines, the router, reapers) outlives it and each node withdraws its server file. (One run for
    both halves: each two-node run starts two vLLM servers, the real-server group's largest cost.)"""
    out = tmp_path / "rl_kill"
    with _two_nodes(sft_world, sft_checkpoint, out) as run:
        published = run.wait_published()
        urls = run.urls()
        run.wait_step(1)
        # rank 0 put both nodes' servers behind one router
        _, router = run.router()  # its group is checked gone at the end
        assert sorted(requests.get(router + "/list_workers", timeout=10).json()["urls"]) == sorted(urls)
        os.kill(run.published[1]["pids"][0], signal.SIGKILL)
        killed = time.monotonic()
        codes = run.finish()
        after = time.monotonic() - killed
        err0, err1 = run.stderr(0), run.stderr(1)
        print(f"\nthe run ended {after:.0f} s after node 1's server was killed")
        assert codes == [0, 0], err0[-3000:] + "\n----\n" + err1[-3000:]
        evicted = [ln for ln in err0.splitlines() if "evicted" in ln]
        assert len(evicted) == 1 and f"rollout server {urls[1]} evicted" in evicted[0], evicted
        assert "re-formed with 1 live server(s)" in err0  # the next push went to node 0's server alone
        gone = [ln for ln in err1.splitlines() if f"the rollout server {urls[1]} on node 1 (" in ln]
        assert len(gone) == 1 and "exited (code -9)" in gone[0], err1[-3000:]
        rec = _metrics(out)
        _check_steps(rec)  # node 0's server held every version pushed after the group re-formed
        assert rec[0]["rollout/requests_server0"] > 0 and rec[0]["rollout/requests_server1"] > 0  # both served step 1
        # node 1 served until it was killed ...
        assert rec[-1]["rollout/requests_server1"] == 0 and rec[-1]["rollout/requests_server0"] > 0  # ... then no more
        # node 0's server answered every request the router counted for it, as its own log has them
        assert _served(out, 0, "/inference/v1/generate") == sum(m["rollout/requests_server0"] for m in rec)
        assert _served(out, 0, "/update_weight_version") == 1 + len(rec)  # node 0's server got every version ...
        assert _served(out, 1, "/update_weight_version") == 2  # ... node 1's the first two, before it was killed
        assert sorted(published) == [0, 1] and all(len(r["urls"]) == len(r["pids"]) == 1 for r in published.values())
        assert urls[0] != urls[1]
        assert "node 1 (" in err1 and f"serves {urls[1]} (rollout.layout)" in err1
        # the weight group: first the gloo trainer and the worker of each node's server, then re-formed without node 1
        group = [ln for ln in err0.splitlines() if "weight group" in ln and " ranks " in ln]
        assert len(group) == 2 and all(ln.endswith("over gloo") for ln in group), group
        assert "3 ranks (trainer + 1+1 workers)" in group[0] and "2 ranks (trainer + 1 workers)" in group[1], group
        assert (out / "final/config.json").is_file()
        run.assert_nothing_left()
        assert not list(run.folder.glob("node*.json"))  # each node withdrew its server
    print("requests per server per step:", [(m["rollout/requests_server0"], m["rollout/requests_server1"]) for m in rec])
    print("logprob gap max per step:", [f"{m['rollout/logprob_gap_max']:.1e}" for m in rec])
