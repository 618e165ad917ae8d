"""A launched server that will not stop by itself still dies with its launcher.

The server here is a small HTTP process that answers /health, starts a child (as vLLM's API server
starts its engine process) and ignores SIGTERM, as a vLLM API server does whose engine died: its
graceful shutdown waits on requests nobody will answer. It is launched through the project's own
launcher (:class:`paravt.engines.sglang.SGLangServer`, the base of the vLLM launcher too); then the
launcher is killed with -9. Within the reaper's grace period plus a margin the server and its child
must be gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WEDGED = textwrap.dedent("""
    import http.server, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)          # a shutdown that never finishes
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"])
    open(sys.argv[2], "w").write(f"{child.pid}\\n")
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")

LAUNCHER = textwrap.dedent("""
    import sys, time
    from paravt.engines.sglang import SGLangServer, SGLangServerConfig
    class Wedged(SGLangServer):
        kill_grace_s = 2.0
        def command(self):
            return [sys.executable, sys.argv[1], str(self.cfg.port), sys.argv[2]], {}
    srv = Wedged(SGLangServerConfig(model_path="unused", port=int(sys.argv[3]), gpus=[], startup_timeout_s=60,
                                    log_file=sys.argv[4])).start()
    print(srv.proc.pid, flush=True)
    time.sleep(3600)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def _run_and_kill_launcher(tmp_path: Path, launcher_argv_prefix: list[str]) -> tuple[int, int]:
    from paravt.models.parallel import free_port

    (tmp_path / "wedged.py").write_text(WEDGED)
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    child_file = tmp_path / "child.pid"
    p = subprocess.Popen([*launcher_argv_prefix, sys.executable, str(tmp_path / "launcher.py"), str(tmp_path / "wedged.py"),
                          str(child_file), str(free_port()), str(tmp_path / "server.log")],
                         cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         start_new_session=True)
    try:
        server = int(p.stdout.readline())
        child = int(child_file.read_text())
        assert _alive(server) and _alive(child)
        os.killpg(p.pid, signal.SIGKILL)  # the launcher (and, under unshare, everything in its namespace's group)
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
    return server, child


def test_a_wedged_server_and_its_child_die_with_their_launcher(tmp_path):
    server, child = _run_and_kill_launcher(tmp_path, [])
    deadline = time.time() + 20  # grace 2 s + the reaper's start
    while time.time() < deadline and (_alive(server) or _alive(child)):
        time.sleep(0.2)
    survivors = [pid for pid in (server, child) if _alive(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, "a wedged server outlived its launcher"


def test_stopping_a_wedged_server_escalates_to_sigkill(tmp_path):
    """The launcher's own stop (end of a run) does not wait forever on a server that ignores SIGTERM."""
    srv, child = _start_wedged(tmp_path)
    server = srv.proc.pid
    srv.stop_grace_s = 2.0
    srv.stop()  # returns (SIGTERM ignored, SIGKILL after the grace) instead of waiting on the server
    assert not _alive(server) and not _alive(child), "stop() left the server or its child running"


def test_a_port_still_held_is_waited_for_then_named(tmp_path):
    """A restarted run whose dead predecessor's server still holds the port: the launcher waits for
    it (the reaper frees it), and names the port when it stays taken."""
    import socket
    import threading

    import pytest

    from paravt.engines.base import EngineError
    from paravt.engines.sglang import SGLangServer, SGLangServerConfig

    (tmp_path / "wedged.py").write_text(WEDGED)
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]

    class Wedged(SGLangServer):
        port_wait_s = 1.0

        def command(self):
            return [sys.executable, str(tmp_path / "wedged.py"), str(self.cfg.port), str(tmp_path / "c.pid")], {}

    cfg = SGLangServerConfig(model_path="unused", port=port, gpus=[], startup_timeout_s=60, log_file=str(tmp_path / "s.log"))
    with pytest.raises(EngineError, match=f"port 127.0.0.1:{port} is still in use"):
        Wedged(cfg).start()
    threading.Timer(1.0, held.close).start()  # freed while the launcher waits: it then starts
    srv = Wedged(cfg)
    srv.port_wait_s = 20.0
    srv.start()
    try:
        assert srv.proc.poll() is None
    finally:
        srv.stop_grace_s = 2.0
        srv.stop()


def _gone_within(pid: int, seconds: float) -> bool:
    """True (and the process killed) when ``pid`` still runs ``seconds`` from now (a SIGKILL lands
    asynchronously)."""
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        return True
    return False


def _start_wedged(tmp_path: Path):
    from paravt.engines.sglang import SGLangServer, SGLangServerConfig
    from paravt.models.parallel import free_port

    (tmp_path / "wedged.py").write_text(WEDGED)
    child_file = tmp_path / "child.pid"

    class Wedged(SGLangServer):
        def command(self):
            return [sys.executable, str(tmp_path / "wedged.py"), str(self.cfg.port), str(child_file)], {}

    srv = Wedged(SGLangServerConfig(model_path="unused", port=free_port(), gpus=[], startup_timeout_s=60,
                                    log_file=str(tmp_path / "server.log"))).start()
    return srv, int(child_file.read_text())


def test_a_server_killed_alone_leaves_no_process_waited_on_for_the_whole_grace(tmp_path):
    """Only the server's own process dies (an OOM kill of a vLLM API server); its child (the engine) stays
    in the server's group with nobody to stop it in order. stop() ends it soon after, not after the
    60 s meant for an orderly shutdown: a run whose server died exits without that wait."""
    from paravt.core.reaper import ORPHAN_GRACE_S

    srv, child = _start_wedged(tmp_path)
    assert srv.stop_grace_s == 60.0
    os.kill(srv.proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    srv.stop()
    took = time.monotonic() - t0
    alive = _gone_within(child, 5.0)
    assert not alive, "stop() left the dead server's child running"
    assert took < ORPHAN_GRACE_S + 15, f"stop() waited {took:.1f} s on a server that was already dead"


def test_the_reaper_ends_what_a_dead_server_left_without_the_whole_grace(tmp_path):
    """The same through the reaper (the launcher gone too): end_group's grace is for the server's own
    shutdown, not for its orphans."""
    import threading

    from paravt.core.reaper import ORPHAN_GRACE_S, end_group

    srv, child = _start_wedged(tmp_path)
    pgid = srv.proc.pid
    os.kill(pgid, signal.SIGKILL)
    threading.Thread(target=srv.proc.wait, daemon=True).start()  # its parent reaps it, as a live launcher would
    t0 = time.monotonic()
    killed = end_group(pgid, grace_s=60.0)
    took = time.monotonic() - t0
    alive = _gone_within(child, 5.0)
    srv._reaper.stdin.close()
    assert not alive and killed, "the reaper left the dead server's child running"
    assert took < ORPHAN_GRACE_S + 15, f"end_group waited {took:.1f} s on a server that was already dead"
