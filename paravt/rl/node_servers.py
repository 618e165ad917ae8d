"""The rollout servers one node runs under a ``rollout.layout`` (:mod:`paravt.rl.layout`), or node 0's of a
run on several nodes without one, started by that node's launcher: ``python -m paravt.rl.node_servers --ngpu N [--nodes-dir DIR] RECIPE [key=value ...]``.

They start together, each listening on ``LOCAL_ADDR`` (every interface when unset; loopback on one
node), with ``NCCL_CUMEM_ENABLE`` from the launcher (the weight group's setting, as for servers trainer
rank 0 launches); once each has answered ``/health`` or failed, their URLs go to
``$PARAVT_SERVERS_DIR/node<N>.json`` for trainer rank 0 (:func:`paravt.rl.layout.discover`). A server that
fails to start, or exits later, is one line here and is moved to the record's ``dead`` list (republished), so
rank 0 starts without it and a torchrun restart's discovery does not wait for it; the others keep serving.
A node none of whose servers started publishes only its error; beside trainers it exits 3 (its launcher's
torchrun goes on), a node that only serves keeps beating until the run ends, so the run goes on with the
other nodes' servers (rank 0 exits 3 only when none answers).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from paravt.rl.layout import Plan, check_layout, plan, publish, read_number


class _Held(threading.Thread):
    """One server, started and stopped by this thread, which lives as long as the server does: a server
    dies with what launched it (PR_SET_PDEATHSIG), and the kernel counts the launching *thread*."""

    def __init__(self, server: Any):
        super().__init__(daemon=True)
        self.server, self.error = server, None
        self.ready, self.done = threading.Event(), threading.Event()

    def run(self) -> None:
        try:
            self.server.start()
        except BaseException as exc:  # noqa: BLE001 - reported by the node's launcher, one line
            self.error = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        self.ready.set()
        if self.error is None:
            self.done.wait()
            self.server.stop()


def node_servers(cfg: Any, p: Plan, host: str) -> list[tuple[Any, int]]:
    """This node's servers (not started) and their ports, listening on ``host``; logs under output_dir,
    one per server and node."""
    r, out = cfg.rollout, Path(cfg.output_dir)
    b = r.backend()
    if b.server_class is None:
        raise ValueError(f"rollout.engine={r.engine} has no server a node's launcher can start")
    _, base = r.launch_settings()
    if base is None:  # settings from the model alone (hf_server: rollout.dtype)
        from paravt.models.parallel import free_port  # noqa: PLC0415

        ports = [free_port() for _ in p.servers]
        return [(b.server_class(b.server_config(model_path=cfg.model_path, dtype=r.dtype, port=port, host=host,
                                                log_file=str(out / f"rollout_server_node{p.node_rank}_{i}.log"))), port)
                for i, port in enumerate(ports)]
    from paravt.engines.factory import replica_configs  # noqa: PLC0415

    base = replace(base, **b.rollout_settings)
    log = Path(base.log_file) if base.log_file else out / f"rollout_{r.engine}.log"
    base = replace(base, host=host, gpus=[g for s in p.servers for g in s], tp_size=len(p.servers[0]) or 1,
                   log_file=str(log.with_name(f"{log.stem}_node{p.node_rank}{log.suffix}")))
    return [(b.server_class(c), c.port) for c in replica_configs(base, len(p.servers), cfg.model_path)]


def _stop_line(code: int, line: str) -> int:
    """``line`` for the launcher (its abort file under ``run_supervised``, else stderr); returns ``code``."""
    from paravt.core.shared_fs import ABORT_FILE_ENV, report_abort  # noqa: PLC0415

    if os.environ.get(ABORT_FILE_ENV):
        report_abort(code, line)
    else:
        print(line, file=sys.stderr, flush=True)
    return code


class _Record:
    """This node's published servers: the live ones (``urls``, ``pids``) and the dead (``dead``, ``errors``)."""

    def __init__(self, path: Path, base: dict, held: list[_Held], urls: list[str]):
        self.path, self.base, self.held, self.urls = path, base, held, urls
        self.dead: dict[int, str] = {i: h.error for i, h in enumerate(held) if h.error}

    def publish(self) -> None:
        live = [i for i in range(len(self.held)) if i not in self.dead]
        publish(self.path, {**self.base, "urls": [self.urls[i] for i in live],
                            "pids": [self.held[i].server.proc.pid for i in live],
                            "dead": [self.urls[i] for i in self.dead], "errors": list(self.dead.values())})


def _until_the_run_ends(rec: _Record, trainers: list[int], nodes_dir: Path | None,
                        since: float, stop: threading.Event, prog: str, me: str) -> int:
    """The exit code of this node once the run is over (see :func:`serve`); a server that exits before is
    one line and leaves the record (rank 0's pool evicts it)."""
    from paravt.core.shared_fs import read_beat, read_exit  # noqa: PLC0415

    join_s, beat = read_number(os.environ, "RDZV_TIMEOUT", 300), set()
    while not stop.wait(1.0):
        for i, h in enumerate(rec.held):
            if i not in rec.dead and h.server.proc is not None and h.server.proc.poll() is not None:
                rec.dead[i] = f"exited (code {h.server.proc.returncode})"
                rec.publish()
                print(f"{prog}the rollout server {rec.urls[i]} on {me} exited (code {h.server.proc.returncode}); "
                      f"this node's record lists it as dead and trainer rank 0's pool evicts it", file=sys.stderr,
                      flush=True)
        if nodes_dir is None:
            continue
        for n in trainers:
            rc = read_exit(nodes_dir, n, since)
            if rc is not None:  # the run is over; the launcher's `gone` names the node when it failed
                return int(rc) if rc.isdigit() else 1
            b = read_beat(nodes_dir, n)
            if b is not None and b[0] >= since - join_s:
                beat.add(n)
        if len(beat) < len(trainers) and time.time() - since > join_s:
            missing = ", ".join(f"node {n}" for n in trainers if n not in beat)
            return _stop_line(3, f"{prog}{missing} never joined (no heartbeat under {nodes_dir} within {join_s:g} s, "
                                 f"RDZV_TIMEOUT): the rollout servers of {me} stop; start every node's launcher")
    return 143


def serve(cfg: Any, p: Plan, folder: Path, nodes_dir: Path | None, prog: str = "run_rl.sh") -> int:
    """Start this node's servers, publish their URLs under ``folder`` once all answer, keep them until the
    run ends. ``nodes_dir`` (a node that only serves: the run's heartbeat folder): end when a trainer
    node's launcher records its exit, with its code, or when none beats within ``RDZV_TIMEOUT``; else
    (beside this node's trainers) the servers live until this process is ended (SIGTERM, or its launcher
    gone). A server that fails to start: its line published for rank 0, exit 3."""
    from paravt.core.procs import die_with_parent  # noqa: PLC0415
    from paravt.core.shared_fs import node_label  # noqa: PLC0415

    die_with_parent(signal.SIGTERM)
    stop, since = threading.Event(), time.time()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    multi, local = p.nnodes > 1, os.environ.get("LOCAL_ADDR")
    if nodes_dir is not None and multi:  # only serves: the shared-folder check torchrun's entry runs elsewhere
        from paravt.core.shared_fs import check_serving  # noqa: PLC0415

        env = os.environ
        line = check_serving(nodes_dir, p.node_rank, prog, read_number(env, "FS_CHECK_TIMEOUT", 60),
                             read_number(env, "RDZV_TIMEOUT", 300), env.get("PARAVT_RUN_ID", ""),
                             env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT") or 29500))
        if line is not None:
            return _stop_line(2, line)
    addr = local or (socket.gethostname() if multi else "127.0.0.1")
    folder.mkdir(parents=True, exist_ok=True)
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)  # the servers' logs go there
    mine, me = folder / f"node{p.node_rank}.json", node_label(p.node_rank)
    mine.unlink(missing_ok=True)  # an earlier run's
    servers = node_servers(cfg, p, local or ("0.0.0.0" if multi else "127.0.0.1"))
    held = [_Held(s) for s, _ in servers]
    urls = [f"http://{addr}:{port}" for _, port in servers]
    record = {"node": p.node_rank, "host": socket.gethostname(), "model": cfg.model_path}
    failed: list[str] = []
    for h in held:
        h.start()
    try:
        while not stop.is_set() and not all(h.ready.is_set() for h in held):  # each healthy, or failed
            time.sleep(0.2)
        if stop.is_set():
            return 143
        failed = [f"server {i + 1} of {len(held)}: {h.error}" for i, h in enumerate(held) if h.error]
        trainers = [n for n, c in enumerate(check_layout(cfg.rollout.layout)) if c.count("train")] \
            if cfg.rollout.layout else list(range(p.nnodes))  # no layout: every node trains
        if len(failed) == len(held):
            publish(mine, {**record, "error": failed[0]})
            if nodes_dir is None:  # beside this node's trainers: its torchrun goes on with the other nodes' servers
                return _stop_line(3, f"{prog}: the rollout servers of {me} did not start: {failed[0]}")
            print(f"{prog}: the rollout servers of {me} did not start: {failed[0]}; this node only beats until the run "
                  f"ends (trainer rank 0 goes on with the other nodes' servers)", file=sys.stderr, flush=True)
        rec = _Record(mine, record, held, urls)
        for line in failed:
            print(f"{prog}: {me}: a rollout server did not start ({line}); the node serves without it",
                  file=sys.stderr, flush=True)
        if len(failed) < len(held):
            rec.publish()
            live = [u for i, u in enumerate(urls) if i not in rec.dead]
            print(f"{prog}: {me} serves {', '.join(live)} (rollout.layout)", file=sys.stderr, flush=True)
        failed = []  # published: the record stays for rank 0 until this node ends
        return _until_the_run_ends(rec, trainers, nodes_dir, since, stop, f"{prog}: ", me)
    finally:
        for h in held:
            h.done.set()
            if not h.ready.is_set():  # still starting: end its process, so its health wait ends too
                try:
                    h.server.stop()
                except Exception:  # noqa: BLE001 - best effort; the process dies with this one anyway
                    pass
        deadline = time.monotonic() + 90
        for h in held:
            h.join(timeout=max(0.0, deadline - time.monotonic()))
        if not failed:  # withdrawn; an error stays for rank 0 (this node's next start replaces it)
            mine.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """This node's servers (:func:`serve`) under ``$PARAVT_SERVERS_DIR``, as ``scripts/run_rl.sh`` starts them."""
    from paravt.core.config import parse_cli  # noqa: PLC0415
    from paravt.rl.config import RLConfig  # noqa: PLC0415

    a = list(sys.argv[1:] if argv is None else argv)
    prog = os.environ.get("PARAVT_PROG", "run_rl.sh")
    if "--ngpu" not in a or not os.environ.get("PARAVT_SERVERS_DIR"):
        print("usage: PARAVT_SERVERS_DIR=DIR python -m paravt.rl.node_servers --ngpu N [--nodes-dir DIR] RECIPE "
              "[key=value ...]", file=sys.stderr)
        return 2
    opts: dict[str, str] = {}
    while a and a[0] in ("--ngpu", "--nodes-dir"):
        opts[a[0]], a = a[1], a[2:]
    cfg = parse_cli(RLConfig, a, prog)
    p = plan(cfg, int(opts["--ngpu"]))
    nodes = Path(opts["--nodes-dir"]) if opts.get("--nodes-dir") else None
    return serve(cfg, p, Path(os.environ["PARAVT_SERVERS_DIR"]), nodes, prog)


if __name__ == "__main__":
    sys.exit(main())
