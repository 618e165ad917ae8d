"""Processes that end with their parent, and one run per output directory.

* :func:`die_with_parent` — a torchrun worker (its own session: a signal to the launcher's process
  group never reaches it) asks Linux for SIGKILL when its parent, torchrun's agent, dies, so a
  killed launcher never leaves workers training and writing checkpoints with nobody watching.
  :func:`preexec_die_with_parent` does the same for servers a trainer or eval starts (``Popen``).
* :class:`OutputLock` — ``output_dir/.paravt.lock`` held with ``flock`` by the run's main process
  (released by the kernel when it dies, even under kill -9); a second run on the same directory
  refuses with the holder's pid instead of racing it. On a filesystem without flock (ENOSYS, EOPNOTSUPP,
  ENOLCK: Lustre mounted without it) it warns once, naming the folder, and the run goes on without the lock.

* :func:`start_server` — a server in a process group of its own, watched by
  :mod:`paravt.core.reaper`: the whole group ends when the launcher does, even a server wedged in
  its own shutdown (SIGTERM, then SIGKILL after a grace period, with nobody left to ask).

Outside Linux both are no-ops (``prctl`` is Linux-only; the lock still works where ``fcntl`` exists).
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits; True when set."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes  # noqa: PLC0415

    parent = os.getppid()  # recorded before the call: PID 1 is a live parent in a container
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    # The parent died between our start and the call (we were re-parented): follow it now. Comparing
    # with PID 1 instead would kill every worker whose launcher *is* PID 1 (torchrun as a container's
    # entrypoint, `docker run ... bash scripts/run_rl.sh`, Kubernetes pods).
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def preexec_die_with_parent() -> None:
    """``Popen(preexec_fn=...)``: the child is killed when the process that started it dies."""
    die_with_parent(signal.SIGTERM)


_NO_FLOCK = {errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOLCK}
_WARNED: set[str] = set()


def _warn_no_flock(folder: Path, exc: OSError) -> None:
    """One line per folder and process: the lock is off, a second run on ``folder`` is not refused."""
    if str(folder) in _WARNED:
        return
    _WARNED.add(str(folder))
    print(f"warning: {folder} is on a filesystem without flock ({os.strerror(exc.errno)}): running without the "
          f"output lock, so a second run on this folder is not refused; start one run per output_dir", file=sys.stderr)


class OutputLockBusy(RuntimeError):
    """Another live run holds the output directory."""


class OutputLock:
    """``with OutputLock(dir):`` — an exclusive, non-blocking ``flock`` on ``dir/.paravt.lock``."""

    NAME = ".paravt.lock"

    def __init__(self, directory: str | Path):
        self.path = Path(directory) / self.NAME
        self._fh = None

    def acquire(self) -> "OutputLock":
        import fcntl  # noqa: PLC0415

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise OutputLockBusy(f"{self.path.parent} is in use by another run (pid {holder}); stop it or choose "
                                 "another output directory") from None
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                fh.close()
                raise
            # a filesystem without flock (Lustre or NFS mounted without it): the run goes on unguarded
            _warn_no_flock(self.path.parent, exc)
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing drops the flock
            self._fh = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def start_server(argv: list[str], env: dict[str, str], log_fh, grace_s: float = 15.0):
    """``Popen(argv)`` as a server: its own process group (its children included), SIGTERM when the
    launcher dies, and a reaper that escalates to SIGKILL ``grace_s`` later. Returns ``(proc,
    reaper)``; :func:`stop_server` ends both."""
    import subprocess  # noqa: PLC0415

    proc = subprocess.Popen(argv, env=env, stdout=log_fh, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=preexec_die_with_parent)
    reaper = subprocess.Popen([sys.executable, "-m", "paravt.core.reaper", "--pgid", str(proc.pid),
                               "--grace", str(grace_s)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  x for x in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", ""))
                                  if x)})
    return proc, reaper


def stop_server(proc, reaper, grace_s: float = 60.0) -> None:
    """SIGTERM to the server (its orderly shutdown stops its children), SIGKILL to its whole group after
    ``grace_s`` if anything is left, or soon after the server itself is gone (a killed API server's
    engine processes stay in its group with nobody to stop them); then release the reaper."""
    import time  # noqa: PLC0415

    from paravt.core.reaper import wait_group  # noqa: PLC0415

    if proc is not None:
        own_group = True
        try:
            own_group = os.getpgid(proc.pid) == proc.pid
        except ProcessLookupError:
            pass
        try:
            proc.send_signal(signal.SIGTERM)
            if own_group:
                # proc.poll() reaps our child as it exits (a zombie still counts as a member of its group)
                if not wait_group(proc.pid, grace_s, lambda: proc.poll() is not None):
                    os.killpg(proc.pid, signal.SIGKILL)
            else:
                deadline = time.monotonic() + grace_s
                while time.monotonic() < deadline and proc.poll() is None:
                    time.sleep(0.2)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except Exception:  # noqa: BLE001
            pass
    if reaper is not None:
        try:
            reaper.stdin.close()  # the group is gone: the reaper finds nothing to end and exits
            reaper.wait(timeout=10)
        except Exception:  # noqa: BLE001
            reaper.kill()
