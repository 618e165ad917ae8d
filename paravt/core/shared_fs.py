"""A run on several nodes: the shared run folder checked at start, and a lost node named.

A multi-node run needs ``output_dir`` on a filesystem every node shares: rank 0 alone writes the
checkpoints' COMPLETE markers, prunes old checkpoints and records a stopped run's line, and every
rank resumes from what it reads there. So, before the stage starts (``python -m paravt.core.shared_fs
check ... MODULE ARGS``, the module torchrun runs on every node):

* **check** — global rank 0 writes a fresh token file under ``output_dir/.paravt/fs`` and publishes its
  name through torchrun's rendezvous store; every node's local rank 0 must see that file within
  ``--timeout`` seconds. A node that does not ends the run on every node with one line naming it and
  exit 2 (bad input: never restarted), through the launcher's abort file. Then ``MODULE`` runs as
  ``python -m MODULE ARGS`` would. One node: no check.
* **watch** — beside torchrun, each node's launcher writes a heartbeat under
  ``output_dir/.paravt/nodes/<run id>`` every ``--interval`` seconds and reads the others'. A node
  whose heartbeat stops for ``--timeout`` seconds (its launcher killed, its host gone) ends this
  node's run: the line naming it goes to the abort file with exit 3 (lost work; ``resume=auto``
  continues from the newest checkpoint) and torchrun gets SIGTERM. Without this a survivor waits in
  a collective for as long as the process group's timeout.
* **gone** — after torchrun failed on its own: the nodes that left (an exit record, or a heartbeat
  that no longer moves), one line; exit 3 when one was lost without an exit of its own.
* **a node that only serves** (``rollout.layout`` entry without ``train``) starts no torchrun, so it takes
  part in the check another way before it starts its servers (:func:`check_serving`): once node 0's
  rendezvous store answers at ``MASTER_ADDR:MASTER_PORT`` (node 0's launcher is up and beating), it must
  see node 0's heartbeat move under the run folder within ``FS_CHECK_TIMEOUT`` seconds. One that does not
  stops with one line naming it, exit 2, and leaves the line in the store, where every training node's
  watcher finds it within a heartbeat and ends that node's run with the same line and exit 2.

Stdlib and torch's store only: this runs before any stage module is imported.
"""

from __future__ import annotations

import os
import runpy
import signal
import socket
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

ABORT_FILE_ENV = "PARAVT_ABORT_FILE"
SHARED_HINT = ("a run on several nodes needs output_dir on a filesystem every node shares (checkpoints, their "
               "COMPLETE markers and a stopped run's line are written there by rank 0 and read by every node)")


def node_label(node_rank: str | int | None = None, host: str | None = None) -> str:
    n = os.environ.get("NODE_RANK", "?") if node_rank is None else node_rank
    return f"node {n} ({host or socket.gethostname()})"


def report_abort(code: int, line: str, cause: bool = True) -> None:
    """Record a deliberate stop (bad input, lost work, a lost node) for the launcher: ``code<TAB>line`` in
    the file ``$PARAVT_ABORT_FILE`` names (set by ``scripts/_common.sh:torchrun_supervised``, which prints
    the line and exits with ``code`` instead of letting torchrun resume a run that stopped itself; a
    restarted worker sees the file and ends, :func:`stopped_on_purpose`). Rank 0's line wins (it names
    the cause; the others only say rank 0 failed): rank 0 (or a process without ``RANK``) replaces the
    file, another rank writes it only while it does not exist, and so does rank 0 when ``cause`` is False
    (it stopped because another rank or node went away, whose line names the cause)."""
    path = os.environ.get(ABORT_FILE_ENV)
    if not path:
        return
    text = f"{int(code)}\t{' '.join(line.split())}\n"
    if int(os.environ.get("RANK", 0)) == 0 and cause:
        tmp = f"{path}.rank0"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(text)


def stopped_on_purpose() -> bool:
    """True in a worker torchrun restarted after the run stopped itself (:func:`report_abort`)."""
    path = os.environ.get(ABORT_FILE_ENV)
    return bool(path) and os.path.exists(path)


def _store(timeout_s: float):
    """A client of the store torchrun's agents share (the rendezvous' own), under this attempt's prefix."""
    import torch.distributed as dist  # noqa: PLC0415

    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(seconds=timeout_s))
    prefix = f"paravt/fs/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return dist.PrefixStore(prefix, base)


def sees(path: Path, timeout_s: float, poll_s: float = 0.2) -> bool:
    """Whether ``path`` appears within ``timeout_s`` (its folder re-read each time: NFS caches lookups)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if path.name in os.listdir(path.parent) and path.read_text().strip() == path.name:
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def check_shared(output_dir: Path, prog: str, timeout_s: float) -> str | None:
    """The check of the module docstring on this worker; the failure line, or None. Collective over
    the nodes' local rank 0 (the other local ranks return at once)."""
    world, local_world = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    nnodes = int(os.environ.get("NNODES") or 0) or max(1, world // max(1, local_world))
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    if nnodes <= 1 or local_rank != 0:
        return None
    group = int(os.environ.get("GROUP_RANK", 0))  # this node's place in the rendezvous
    store = _store(timeout_s + 60)
    folder = Path(output_dir) / ".paravt" / "fs"
    token = None
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        token = folder / f"token-{uuid.uuid4().hex}"
        token.write_text(token.name + "\n")
        store.set("token", f"{token.name}\t{node_label()}")
    name, writer = store.get("token").decode().split("\t", 1)
    me = node_label()
    line = None
    if not sees(folder / name, timeout_s):
        line = (f"{prog}: {me} does not see the token file that global rank 0 on {writer} wrote under "
                f"{output_dir} within {timeout_s:g} s: {SHARED_HINT}")
    store.set(f"node{group}", line or "ok")
    if rank == 0:
        answers = [store.get(f"node{n}").decode() for n in range(nnodes)]
        token.unlink(missing_ok=True)
        line = next((a for a in answers if a != "ok"), None)
    return line


def serving_key(run_id: str, node: int) -> str:
    """Where a node that only serves leaves its failed shared-folder check, in node 0's rendezvous store."""
    return f"paravt/serving-check/{run_id}/node{node}"


def _client_store(addr: str, port: int, timeout_s: float):
    import torch.distributed as dist  # noqa: PLC0415

    return dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=timeout_s))


def check_serving(nodes_dir: Path, node: int, prog: str, timeout_s: float, join_s: float, run_id: str,
                  addr: str, port: int, poll_s: float = 0.2) -> str | None:
    """A node that only serves: the check of the module docstring; the failure line, or None. When node 0's
    store does not answer within ``join_s`` the check is left to the heartbeats (node 0 never joined)."""
    try:
        store = _client_store(addr, port, join_s)
    except Exception:  # noqa: BLE001 - node 0 not up: paravt.rl.node_servers names it after RDZV_TIMEOUT
        return None
    first, deadline = read_beat(nodes_dir, 0), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = read_beat(nodes_dir, 0)
        if now is not None and first is not None and now[0] != first[0]:
            return None
        first = first or now
        time.sleep(poll_s)
    line = (f"{prog}: {node_label(node)} does not see node 0's heartbeat move under {nodes_dir} within {timeout_s:g} s "
            f"(FS_CHECK_TIMEOUT), though node 0's rendezvous answers at {addr}:{port}: {SHARED_HINT}")
    try:
        store.set(serving_key(run_id, node), line)
    except Exception:  # noqa: BLE001 - node 0 then ends on its own bound (the servers never appear)
        pass
    return line


class _ServingChecks:
    """A training node's view of the lines serving nodes left in the store (:func:`check_serving`)."""

    def __init__(self, spec: str | None, run_id: str, nodes: list[int]):
        addr, _, port = (spec or "").rpartition(":")
        self.addr, self.port = addr, int(port) if port.isdigit() else 0
        self.keys = [serving_key(run_id, n) for n in nodes]
        self.store = None

    def line(self) -> str | None:
        if not self.addr or not self.keys:
            return None
        try:
            if self.store is None:
                self.store = _client_store(self.addr, self.port, 2.0)
            found = [k for k in self.keys if self.store.check([k])]
            return self.store.get(found[0]).decode() if found else None
        except Exception:  # noqa: BLE001 - not up yet, or gone with node 0's torchrun: asked again next beat
            self.store = None
            return None


# ---------------------------------------------------------------------------------------- heartbeats
def beat(folder: Path, node: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".node{node}.{os.getpid()}"
    tmp.write_text(f"{time.time():.3f}\t{socket.gethostname()}\t{os.getppid()}\n")
    os.replace(tmp, folder / f"node{node}")


def read_beat(folder: Path, node: int) -> tuple[float, str] | None:
    try:
        t, host, _ = (folder / f"node{node}").read_text().split("\t")
        return float(t), host
    except (OSError, ValueError):
        return None


def read_exit(folder: Path, node: int, since: float) -> str | None:
    """The exit code node ``node``'s launcher recorded when it ended after ``since``, else None."""
    p = folder / f"node{node}.exit"
    try:
        if p.stat().st_mtime >= since:
            return p.read_text().strip()
    except OSError:
        pass
    return None


def watch(folder: Path, node: int, nnodes: int, prog: str, interval_s: float, timeout_s: float, pid: int,
          serving: _ServingChecks | None = None) -> int:
    """Heartbeat of this node, and the end of this node's run when another node's stops, or when a node
    that only serves failed its shared-folder check (``serving``; see the module docstring). Runs until
    ``pid`` (torchrun) ends; dies with the launcher."""
    from paravt.core.procs import die_with_parent  # noqa: PLC0415

    die_with_parent(signal.SIGKILL)
    started = time.time()
    last: dict[int, tuple[float, float]] = {}  # node → (its beat's timestamp, when we saw it change)
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return 0
        beat(folder, node)
        now = time.time()
        failed = serving.line() if serving is not None else None
        if failed:
            report_abort(2, failed, cause=False)
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            return 2
        for n in range(nnodes):
            b = read_beat(folder, n)
            if n == node or b is None or b[0] < started - timeout_s:
                continue  # not started yet (the rendezvous bounds the join) or an earlier run's
            if read_exit(folder, n, started) == "0":
                continue  # finished: its workers completed every collective (rank 0 may still be saving)
            if last.get(n, (None,))[0] != b[0]:
                last[n] = (b[0], time.monotonic())
            elif time.monotonic() - last[n][1] > timeout_s:
                why = f"ended (exit {read_exit(folder, n, started)})" if read_exit(folder, n, started) else \
                    f"stopped answering (no heartbeat for {time.monotonic() - last[n][1]:.0f} s, --timeout {timeout_s:g})"
                # the first line stays: a line this node's workers wrote already names the cause
                report_abort(3, f"{prog}: {node_label(n, b[1])} {why}: the run on {node_label(node)} ends too; "
                                f"start every node's launcher again to resume (resume=auto)", cause=False)
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                return 3
        time.sleep(max(0.05, interval_s - (time.time() - now)))


def gone(folder: Path, node: int, nnodes: int, prog: str, interval_s: float, since: float) -> int:
    """After torchrun failed: name the nodes that left. Waits three heartbeat intervals for the others
    to beat; prints one line; 3 when a node stopped without an exit of its own, else 0."""
    first = {n: read_beat(folder, n) for n in range(nnodes) if n != node}
    deadline = time.monotonic() + 3 * interval_s
    alive: set[int] = set()
    while time.monotonic() < deadline and len(alive) < len(first):
        time.sleep(interval_s / 4)
        for n, b in first.items():
            now = read_beat(folder, n)
            if now is not None and (b is None or now[0] != b[0]) and read_exit(folder, n, since) is None:
                alive.add(n)
    lost, ended = [], []
    for n, b in first.items():
        if n in alive:
            continue
        rc = read_exit(folder, n, since)
        if rc is not None:
            ended.append(f"{node_label(n, b[1] if b else '?')} ended (exit {rc})")
        elif b is None:
            lost.append(f"node {n} never joined (no heartbeat under {folder})")
        else:
            lost.append(f"{node_label(n, b[1])} stopped answering (no heartbeat for {time.time() - b[0]:.0f} s)")
    if not lost and not ended:
        return 0
    print(f"{prog}: {'; '.join(lost + ended)}: the run on {node_label(node)} ended with it"
          + ("; start every node's launcher again to resume (resume=auto)" if lost else ""), file=sys.stderr)
    return 3 if lost else 0


# ---------------------------------------------------------------------------------------- entry
def _opts(argv: list[str], names: set[str]) -> tuple[dict[str, str], list[str]]:
    opts: dict[str, str] = {}
    while argv and argv[0].startswith("--") and argv[0][2:] in names:
        opts[argv[0][2:]] = argv[1]
        argv = argv[2:]
    return opts, argv


def main(argv: list[str] | None = None) -> int:
    a = list(sys.argv[1:] if argv is None else argv)
    cmd = a.pop(0) if a else ""
    o, rest = _opts(a, {"output-dir", "prog", "timeout", "dir", "node", "nnodes", "interval", "pid", "since", "store",
                        "run-id", "serving"})
    prog = o.get("prog", "paravt")
    if cmd == "check":
        if not rest:
            print(f"{prog}: shared_fs check needs the module to run after the check", file=sys.stderr)
            return 2
        stopped = os.environ.get(ABORT_FILE_ENV)
        if stopped and os.path.isfile(stopped) and os.path.getsize(stopped):  # a restart of a run that stopped itself
            return int(Path(stopped).read_text().split("\t", 1)[0] or 1)
        line = check_shared(Path(o["output-dir"]), prog, float(o.get("timeout", 60)))
        if line is not None:
            report_abort(2, line)
            print(line, file=sys.stderr)
            return 2
        sys.argv = [rest[0], *rest[1:]]
        runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
        return 0
    if cmd in ("watch", "gone"):
        folder, node, nnodes = Path(o["dir"]), int(o["node"]), int(o["nnodes"])
        interval = float(o.get("interval", 2))
        if cmd == "watch":
            serving = [int(n) for n in o.get("serving", "").split(",") if n.strip().isdigit()]
            checks = _ServingChecks(o.get("store"), o.get("run-id", ""), serving) if serving else None
            return watch(folder, node, nnodes, prog, interval, float(o.get("timeout", 300)), int(o["pid"]), checks)
        return gone(folder, node, nnodes, prog, interval, float(o.get("since", 0)))
    print("usage: python -m paravt.core.shared_fs {check|watch|gone} [--option value ...] [MODULE ARGS...]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
