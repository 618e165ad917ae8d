"""``python -m paravt.core.reaper --pgid N``: ends a server's whole process group once the process
that launched it is gone, even when the server will not stop by itself.

A launched server dies with its launcher (``PR_SET_PDEATHSIG``, SIGTERM), but a graceful shutdown
can wait forever: a vLLM API server whose engine died waits in uvicorn's shutdown for requests that
will never be answered, holding its port and memory. So every server is started in a process group
of its own, and beside it this reaper (stdlib only, its own session, so a signal to the launcher's
group does not reach it). It blocks on a pipe from the launcher; at end-of-file (the launcher exited,
was killed with -9, or stopped the server itself) it sends SIGTERM to the server, waits ``--grace``
seconds, then SIGKILL to whatever is left of its group. It needs nothing from the launcher once started.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


ORPHAN_GRACE_S = 5.0  # members a dead leader left behind: SIGTERM, then SIGKILL this much later


def leader_alive(pgid: int) -> bool:
    """The group's leader runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pgid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_group(pgid: int, grace_s: float, leader_exited) -> bool:
    """Wait up to ``grace_s`` for the group to end; True when it did. Once ``leader_exited()`` the
    leader's orderly shutdown is over, and whatever it left in the group (a vLLM engine core and its
    worker when only the API server was killed) has nobody to stop it: those get SIGTERM and
    ``ORPHAN_GRACE_S`` more, not the rest of ``grace_s``."""
    deadline = time.monotonic() + grace_s
    orphans_told = False
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        if not orphans_told and leader_exited():
            orphans_told = True
            deadline = min(deadline, time.monotonic() + ORPHAN_GRACE_S)
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                return True
        time.sleep(0.2)
    return not group_alive(pgid)


def end_group(pgid: int, grace_s: float) -> bool:
    """SIGTERM to the group's leader (the server, which shuts its own children down in order), then
    SIGKILL to every process still in the group after ``grace_s`` (or soon after the leader is gone,
    :func:`wait_group`); True when it had to kill."""
    try:
        os.kill(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    if wait_group(pgid, grace_s, lambda: not leader_alive(pgid)):
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paravt.core.reaper", description=__doc__.split("\n\n")[0])
    p.add_argument("--pgid", type=int, required=True, help="the server's process group")
    p.add_argument("--grace", type=float, default=15.0, help="seconds between SIGTERM and SIGKILL")
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only end-of-file on stdin ends the watch
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except OSError:
        pass
    end_group(a.pgid, a.grace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
