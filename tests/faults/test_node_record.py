"""A node's launcher keeps its record of servers true (``paravt.rl.node_servers``): a server that exits is
one line and moves to the record's ``dead`` list at once, the others keep serving, so trainer rank 0 (and a
torchrun restart's discovery) never waits for it (``paravt.rl.layout.discover``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paravt.rl.layout import discover

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.launcher


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_a_server_that_exits_leaves_the_record_and_rank_0_starts_without_it(tiny_dir, tmp_path):
    folder, out = tmp_path / "servers", tmp_path / "rl"
    env = {**os.environ, "PARAVT_SERVERS_DIR": str(folder), "OMP_NUM_THREADS": "1", "NNODES": "1"}
    p = subprocess.Popen([sys.executable, "-m", "paravt.rl.node_servers", "--ngpu", "0", "configs/rl/tiny.yaml",
                          f"model_path={tiny_dir}", f"output_dir={out}", "rollout.engine=hf_server",
                          "rollout.layout=train:1+rollout:2"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        rec, deadline = None, time.time() + 240
        while time.time() < deadline and p.poll() is None:
            rec = _read(folder / "node0.json")
            if rec and len(rec.get("urls", [])) == 2:
                break
            time.sleep(0.3)
        assert rec and len(rec["urls"]) == 2 and rec["dead"] == [], (rec, p.poll())
        gone_url, gone_pid = rec["urls"][1], rec["pids"][1]
        os.kill(gone_pid, signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            rec = _read(folder / "node0.json")
            if rec and rec.get("dead"):
                break
            time.sleep(0.2)
        took = time.monotonic() - t0
        assert rec["urls"] == [rec["urls"][0]] and rec["dead"] == [gone_url] and rec["errors"] == ["exited (code -9)"]
        assert took < 10, took
        # rank 0's discovery (a restart's too): the live server at once, the dead one named, not waited for
        t0 = time.monotonic()
        assert discover(folder, {0: 2}, 600, poll_s=0.1) == rec["urls"]
        assert time.monotonic() - t0 < 10
    finally:
        p.send_signal(signal.SIGTERM)
        err = p.communicate(timeout=120)[1]
    lines = [x for x in err.splitlines() if "exited (code" in x]
    assert len(lines) == 1 and gone_url in lines[0] and "lists it as dead" in lines[0], err[-3000:]
    assert not (folder / "node0.json").exists()  # withdrawn when the node ends
