"""The node watcher beside torchrun (``python -m paravt.core.shared_fs watch``): a node that stops beating
without an exit of its own ends this node's run (exit 3, one line in the abort file); a node that finished
with exit 0 does not (rank 0 may still be writing the last checkpoint). A line this node's workers wrote
first stays: it names the cause."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from paravt.core.shared_fs import beat


@pytest.mark.parametrize("other_exit,prior", [(None, None), ("0", None), (None, "2\trun_sft.sh: the worker's own line\n")])
def test_the_watcher_ends_the_run_for_a_silent_node_but_not_for_one_that_finished(tmp_path, other_exit, prior):
    folder, abort = tmp_path / "nodes", tmp_path / "abort"
    if prior is not None:
        abort.write_text(prior)
    torchrun = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(6)"])  # stands in for torchrun's pid
    threading.Thread(target=torchrun.wait, daemon=True).start()  # reaped when it ends, as the launcher's wait does
    watcher = subprocess.Popen(
        [sys.executable, "-m", "paravt.core.shared_fs", "watch", "--dir", str(folder), "--node", "0", "--nnodes", "2",
         "--prog", "run_sft.sh", "--interval", "0.2", "--timeout", "1.5", "--pid", str(torchrun.pid)],
        env={**os.environ, "PARAVT_ABORT_FILE": str(abort)})
    try:
        time.sleep(0.5)
        beat(folder, 1)  # node 1 beats once, then stops
        if other_exit is not None:
            (folder / "node1.exit").write_text(other_exit + "\n")
        rc = watcher.wait(timeout=20)
    finally:
        torchrun.kill()
        watcher.kill()
    if other_exit is None:
        assert rc == 3 and torchrun.poll() is not None
        if prior is not None:  # the launcher's process has no RANK: it must not pass for rank 0's line
            assert abort.read_text() == prior
        else:
            assert "node 1" in abort.read_text() and "stopped answering" in abort.read_text()
    else:
        assert rc == 0 and not abort.exists()  # it ran until torchrun ended on its own
