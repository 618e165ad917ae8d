"""Where an RL run's trainer ranks and rollout servers go over its nodes (``rollout.layout``), each node's
share of it (read by ``scripts/run_rl.sh``), and how trainer rank 0 finds the servers every node's
launcher starts (:mod:`paravt.rl.node_servers`).

**The layout** is one entry per node, in ``NODE_RANK`` order, separated by commas; an entry is the
node's parts joined by ``+``, in the order they take the node's GPUs (the job's logical indices):

* ``train:N`` — N trainer ranks, one GPU each (on CPU: N gloo processes);
* ``rollout:S`` or ``rollout:SxT`` — S servers of ``rollout.engine`` (sglang, vllm or hf_server), T GPUs
  each (tensor parallel, default 1; on CPU T is 1 and the servers share the machine);
* ``ENTRY*K`` — the same entry for K nodes in a row.

``train:7+rollout:1,rollout:8``: node 0 trains on GPUs 0-6 and serves on GPU 7, node 1 serves on all
eight (9 servers for 7 trainer ranks). :func:`check_layout` holds every rule, each failure one line
``rollout.layout='…': …``: one entry per node (``NNODES``, repeat counts added up before expanding); node 0
has trainer ranks (it hosts torchrun's rendezvous at ``MASTER_ADDR``); a node's parts fit its own GPUs
(each node's launcher checks its entry: nodes may differ in size); rollout parts need a server engine; a layout
without them needs ``rollout.urls``. A node with no ``train`` part only serves (its launcher starts no
torchrun and ends with the run); one with no ``rollout`` part only trains. With a layout the layout alone
places the servers: ``rollout.replicas``, the server's ``gpus`` and ``tp_size`` and ``NPROC`` are not read.
No layout (the default): the servers run on node 0's ``rollout.server.gpus`` / ``rollout.vllm.gpus``
(``rollout.replicas`` of them) and every other GPU trains (:mod:`paravt.rl.launch`). On one node trainer
rank 0 launches them; on several, node 0's launcher does, as under a layout, and rank 0 finds them through the
run folder: torch's c10d rendezvous orders the nodes by their address strings (``gpu10`` before ``gpu9``),
not by ``NODE_RANK``, so global rank 0 may run on any node.

**Discovery.** Every node's launcher starts its own servers (:mod:`paravt.rl.node_servers`), each
listening on ``LOCAL_ADDR`` (default: every interface); once all answer ``/health`` it writes
``output_dir/.paravt/servers/<run id>/node<N>.json`` (its URLs as ``http://<LOCAL_ADDR or hostname>:port``)
on the run folder every node shares. Trainer rank 0 (:func:`discovered_servers`, called by
:func:`paravt.engines.factory.build_engine`) waits for every node the layout gives servers until its
file is there and its URLs answer, within ``SERVERS_TIMEOUT`` seconds. A node republishes its record
without a server that died (or failed to start), so rank 0 never waits for one known dead, a torchrun
restart's discovery included; once one server answers, the others get ``SERVERS_GRACE`` seconds more (default
``RDZV_TIMEOUT``: the nodes start within it of each other). Rank 0 then starts with the live servers and one
warning line naming each one missing; only when none answers does the run end (one line, exit 3). What it
yields is a plain list of URLs in node order: the engine pool (or a router in front of it) takes it as it
takes ``rollout.urls``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger(__name__)

MAX_NODES = 65536  # the most node entries a layout expands to when NNODES is not known (the config's check)
HF_SERVER_START_S = 300.0  # paravt.engines.backends.start_hf_server's health bound
_PART = re.compile(r"(train):(\d+)|(rollout):(\d+)(?:x(\d+))?")


@dataclass(frozen=True)
class Node:
    """One node's entry: its parts ``(kind, count, tp)`` in the order they take its GPUs."""

    parts: tuple[tuple[str, int, int], ...]

    def count(self, kind: str) -> int:
        return sum(n for k, n, _ in self.parts if k == kind)

    @property
    def tp(self) -> int:
        return max([t for k, _, t in self.parts if k == "rollout"] or [1])

    @property
    def gpus(self) -> int:
        return sum(n * t for _, n, t in self.parts)

    def __str__(self) -> str:
        return "+".join(f"{k}:{n}" + (f"x{t}" if t > 1 else "") for k, n, t in self.parts)


def _server_engines() -> list[str]:
    """The rollout engines whose servers a node's launcher can start: those with a server launcher."""
    from paravt.engines.registry import backend_names, get_backend  # noqa: PLC0415

    return [n for n in backend_names(rollout_only=True) if get_backend(n).server_class is not None]


def check_layout(text: str, *, engine: str | None = None, urls: list[str] | tuple = (), nnodes: int | None = None,
                 ngpu: int | None = None, node: int | None = None) -> list[Node]:
    """The nodes of ``text``; a ``ValueError`` ``rollout.layout='…': why`` for any rule it breaks. The
    config checks what it knows (``engine``, ``urls``), the launcher the rest (``nnodes``; ``ngpu``: the
    GPUs of node ``node``, whose entry alone is checked against them, as nodes may differ in size; without
    ``node`` every node's; 0 on CPU). Repeat counts are added up before any entry is expanded, so a count
    beyond ``NNODES`` (or :data:`MAX_NODES`) is refused at once."""
    def bad(why: str):
        raise ValueError(f"rollout.layout={text!r}: {why}")

    entries: list[tuple[Node, int]] = []
    total, bound = 0, MAX_NODES if nnodes is None else nnodes
    for entry in (e.strip() for e in str(text).split(",")):
        body, star, times = entry.partition("*")
        if not body.strip():
            bad("an empty node entry: every node has at least one part (entries are comma-separated, one per node)")
        if star and not (times.strip().isdigit() and int(times) >= 1):
            bad(f"'{entry}': a repeated entry is ENTRY*K with K >= 1 nodes")
        parts, seen = [], set()
        for p in (p.strip() for p in body.split("+")):
            m = _PART.fullmatch(p)
            if not m:
                bad(f"'{p}' in the entry '{entry}' is not train:N, rollout:S or rollout:SxT "
                    f"(entries: one per node, comma-separated; parts joined by +)")
            kind = m.group(1) or m.group(3)
            n, tp = int(m.group(2) or m.group(4)), int(m.group(5) or 1)
            if n < 1 or tp < 1:
                bad(f"'{p}': counts must be >= 1 (leave a part out instead)")
            if kind in seen:
                bad(f"the entry '{entry}' names {kind} twice: one part of each kind per node")
            seen.add(kind)
            parts.append((kind, n, tp))
        k = int(times) if star else 1
        total += k
        if total > bound:
            bad(f"'{entry}' brings the node entries to {total}, more than "
                f"{'MAX_NODES=' if nnodes is None else 'NNODES='}{bound}: one per node, in NODE_RANK order")
        entries.append((Node(tuple(parts)), k))
    nodes = [n for n, k in entries for _ in range(k)]  # at most NNODES (MAX_NODES) long
    if nnodes is not None and len(nodes) != nnodes:
        bad(f"{len(nodes)} node entr{'y' if len(nodes) == 1 else 'ies'} for NNODES={nnodes}: one per node, in "
            f"NODE_RANK order (ENTRY*K repeats one)")
    if not nodes[0].count("train"):
        bad("node 0 runs no trainer rank: it hosts torchrun's rendezvous at MASTER_ADDR, so give it train:N "
            "(a node that only serves comes after it)")
    serving = any(n.count("rollout") for n in nodes)
    servers = _server_engines()
    if engine is not None and serving and engine not in servers:
        bad(f"rollout parts start servers of rollout.engine, which must then be {', '.join(servers)}, "
            f"not {engine!r}")
    if engine in servers and not serving and not urls:
        bad(f"no node has a rollout part and rollout.urls is empty: rollout.engine={engine} has no server")
    for i, n in enumerate(nodes):
        if node is not None and i != node:
            continue  # checked on its own node, against its own GPUs
        if ngpu and n.gpus > ngpu:
            bad(f"node {i} '{n}' takes {n.gpus} GPUs, " + (f"node {i} has {ngpu}" if node is not None
                                                           else f"a node has {ngpu}"))
        if ngpu == 0 and n.tp > 1:
            bad(f"node {i} '{n}': tensor parallel (rollout:SxT, T > 1) needs GPUs; on CPU each server is one process")
    return nodes


@dataclass
class Plan:
    """This node's share of the run, as ``run_rl.sh`` starts it."""

    node_rank: int
    nnodes: int
    train_gpus: list[str]  # physical ids of this node's trainer GPUs ([] on CPU)
    nproc: int  # trainer ranks on this node (0: it only serves)
    world: int  # trainer ranks of the run
    train_nodes: int  # nodes that run torchrun
    servers: list[list[int]]  # layout: this node's servers, each its logical GPUs ([] on CPU)
    expect: dict[int, int] | None  # layout: servers per node that has some; None: no layout
    rollout_gpus: list[int]  # no layout: the GPUs node 0 sets aside for the servers trainer rank 0 launches
    servers_timeout_s: float  # layout: how long rank 0 waits for every node's servers
    serving_only: list[int] = field(default_factory=list)  # layout: the nodes with no train part

    def shell(self) -> str:
        """The fields ``run_rl.sh`` reads, ``-`` for an empty one (``read`` would shift the others)."""
        def join(xs) -> str:
            return ",".join(map(str, xs)) or "-"

        expect = "-" if self.expect is None else join(f"{n}:{c}" for n, c in self.expect.items())
        return " ".join(map(str, (join(self.train_gpus), self.nproc, self.world, self.train_nodes, len(self.servers),
                                  "rank0" if self.expect is None else "layout", expect, f"{self.servers_timeout_s:g}",
                                  join(self.rollout_gpus), join(self.serving_only))))


def read_number(env: Mapping[str, str], key: str, default: float) -> float:
    """``env[key]`` as seconds (``default`` when unset); anything but a positive number is a ``ValueError``."""
    raw = env.get(key) or ""
    try:
        v = float(raw) if raw else default
    except ValueError:
        v = -1
    if v <= 0:
        raise ValueError(f"{key}={raw} must be a number of seconds > 0")
    return v


def plan(cfg: Any, ngpu: int, env: Mapping[str, str] = os.environ) -> Plan:
    """This node's share of ``cfg`` (an RLConfig) on a node with ``ngpu`` GPUs (0: CPU), from ``NNODES``,
    ``NODE_RANK``, ``NPROC`` and ``PARAVT_VISIBLE_DEVICES`` in ``env``; bad input is a ``ValueError``."""
    from paravt.rl.launch import trainer_gpus, world_size  # noqa: PLC0415

    r = cfg.rollout
    nnodes = int(env.get("NNODES") or 1)
    node = int(env.get("NODE_RANK") or 0) if nnodes > 1 else 0
    nproc_env = int(env["NPROC"]) if env.get("NPROC") else None
    ids = [x for x in env.get("PARAVT_VISIBLE_DEVICES", "").split(",") if x.strip()] or [str(i) for i in range(ngpu)]
    key, settings = r.launch_settings()
    start_s = settings.startup_timeout_s if settings is not None else HF_SERVER_START_S
    timeout_s = read_number(env, "SERVERS_TIMEOUT", read_number(env, "RDZV_TIMEOUT", 300) + start_s)
    if not r.layout:
        rollout = list(settings.gpus) if settings is not None and r.replicas else []
        gpus = trainer_gpus(ngpu, rollout, ids if ngpu else [], node) if ngpu else []
        if ngpu and not gpus:
            raise ValueError(f"rollout.{key}.gpus={rollout} takes all {ngpu} GPUs of node 0, where trainer rank 0 "
                             f"launches the servers: leave one to train, or set rollout.layout (a node may only serve)")
        nproc = nproc_env or len(gpus) or 1
        world = world_size(ngpu, rollout, nnodes, nproc_env) if ngpu else nproc * nnodes
        if nnodes > 1 and r.backend().server_config is not None and r.replicas > 0:
            # Several nodes: torch's c10d rendezvous numbers the nodes by their address strings, so global rank 0
            # may be on any node. The servers stay on node 0's rollout GPUs, started by node 0's launcher as under
            # a layout, and rank 0 finds them through the run folder wherever it runs.
            tp = int(getattr(settings, "tp_size", 1) or 1)
            servers = [rollout[i * tp:(i + 1) * tp] for i in range(r.replicas)] if node == 0 else []
            return Plan(node, nnodes, gpus, nproc, world, nnodes, servers, {0: r.replicas}, [], timeout_s)
        return Plan(node, nnodes, gpus, nproc, world, nnodes, [], None, rollout, timeout_s)
    nodes = check_layout(r.layout, engine=r.engine, urls=r.urls, nnodes=nnodes, ngpu=ngpu, node=node)
    me = nodes[node]
    if nproc_env is not None and nproc_env != me.count("train"):
        raise ValueError(f"NPROC={nproc_env}, but rollout.layout={r.layout!r} runs {me.count('train')} trainer rank(s) "
                         f"on node {node}: unset NPROC (the layout sets every node's trainer ranks)")
    at, train, servers = 0, [], []  # the parts take the node's GPUs in their order (none on CPU)
    for kind, n, tp in me.parts:
        if kind == "train":
            train = list(range(at, at + n)) if ngpu else []
        else:
            servers = [list(range(at + s * tp, at + (s + 1) * tp)) if ngpu else [] for s in range(n)]
        at += n * tp
    return Plan(node, nnodes, [ids[i] for i in train], me.count("train"), sum(n.count("train") for n in nodes),
                sum(1 for n in nodes if n.count("train")), servers,
                {i: n.count("rollout") for i, n in enumerate(nodes) if n.count("rollout")}, [], timeout_s,
                [i for i, n in enumerate(nodes) if not n.count("train")])


# ---------------------------------------------------------------------------------------- discovery
def publish(path: Path, record: dict) -> None:
    """``record`` as ``path`` (node<N>.json), whole or not at all: readers never see half a file; stamped with
    the time it was written (``written``), so a later run's discovery can tell an earlier run's record."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({**record, "written": time.time()}) + "\n")
    os.replace(tmp, path)


def _record(folder: Path, node: int) -> dict | None:
    """Node ``node``'s published servers, or None (the folder is listed first: NFS caches lookups)."""
    name = f"node{node}.json"
    try:
        return json.loads((folder / name).read_text()) if name in os.listdir(folder) else None
    except (OSError, ValueError):
        return None


def _answers(url: str) -> bool:
    import requests  # noqa: PLC0415

    try:
        return requests.get(url.rstrip("/") + "/health", timeout=5).status_code == 200
    except requests.RequestException:
        return False


def discover(folder: Path, expect: dict[int, int], timeout_s: float, poll_s: float = 1.0,
             since: float = 0.0, grace_s: float | None = None) -> list[str]:
    """The URLs of the live servers ``expect`` names (node → count), in node order.

    Each node's record (``node<N>.json``) lists the servers that run (``urls``), those that died or failed to
    start (``dead``, with ``errors``; a node whose servers all failed has only ``error``). Rank 0 waits for
    every listed URL to answer ``/health``, but never for a server its node records as dead. It returns once
    every server is live or known dead; else, once one answers, the others get ``grace_s`` more seconds
    (default: what is left of ``timeout_s``) and the whole wait ends at ``timeout_s``. Then the live servers
    are returned with one warning line naming each one missing, or, when none answers, an ``EngineError``
    (one line naming every node). A record that accounts for a number of servers other than the layout's is
    an ``EngineError`` at once. A record written before ``since`` is an earlier run's (a rerun into the same
    output_dir, whose serving node has not started yet): waited on, never read as this run's."""
    from paravt.engines.base import EngineError  # noqa: PLC0415

    t0 = time.monotonic()
    deadline, first_live = t0 + timeout_s, None
    live: dict[int, list[str]] = {}
    while True:
        waiting, gone, live = [], [], {}
        for n, count in sorted(expect.items()):
            rec = _record(folder, n)
            if rec is None or rec.get("written", 0.0) < since:
                waiting.append(f"node {n} (no {folder / f'node{n}.json'} of this run)")
                continue
            host, urls, dead = rec.get("host"), list(rec.get("urls", [])), list(rec.get("dead", []))
            if rec.get("error") and not urls:
                gone.append(f"node {n} ({host}): its rollout servers did not start: {rec['error']}")
                continue
            if len(urls) + len(dead) != count:
                raise EngineError(f"rollout.layout: node {n} ({host}) published {len(urls) + len(dead)} server(s), the "
                                  f"layout gives it {count}: start every node with the same rollout.layout")
            errors = list(rec.get("errors", [])) + [""] * len(dead)
            gone += [f"node {n} ({host}): {u} {e or 'exited'}" for u, e in zip(dead, errors)]
            up = [u for u in urls if _answers(u)]
            if up:
                live[n] = up
            if len(up) < len(urls):
                waiting.append(f"node {n} ({host}: its servers {', '.join(u for u in urls if u not in up)} do not "
                               f"answer /health)")
        now = time.monotonic()
        if live and first_live is None:
            first_live = now
        urls_live = [u for n in sorted(live) for u in live[n]]
        late = first_live is not None and grace_s is not None and now - first_live >= grace_s
        if not waiting or now >= deadline or late:
            missing = waiting + gone
            if not urls_live:
                why = "; ".join(missing)
                raise EngineError(f"rollout.layout: no rollout server answers ({why}) within {now - t0:.0f} s "
                                  f"(SERVERS_TIMEOUT={timeout_s:g}): start that node's launcher (the same command, its "
                                  f"own NODE_RANK), read its server log under output_dir, and keep output_dir on a "
                                  f"filesystem every node shares")
            if missing:
                bound = "" if not waiting else f" after {now - t0:.0f} s (SERVERS_TIMEOUT={timeout_s:g}" + \
                    (f", SERVERS_GRACE={grace_s:g})" if grace_s is not None else ")")
                log.warning("rollout.layout: starting with %d live rollout server(s)%s; missing: %s",
                            len(urls_live), bound, "; ".join(missing))
            return urls_live
        time.sleep(poll_s)


def discovered_servers() -> list[str] | None:
    """Trainer rank 0 of a run with a layout (``run_rl.sh`` sets ``PARAVT_SERVERS_DIR``): every node's
    servers (:func:`discover`); None without a layout (the engine then launches its own)."""
    folder = os.environ.get("PARAVT_SERVERS_DIR")
    if not folder:
        return None
    expect = {int(n): int(c) for n, _, c in (x.partition(":") for x in os.environ.get("PARAVT_SERVERS_NODES", "").split(",")) if c}
    grace = os.environ.get("PARAVT_SERVERS_GRACE")
    return discover(Path(folder), expect, float(os.environ.get("PARAVT_SERVERS_TIMEOUT") or 600),
                    since=float(os.environ.get("PARAVT_SERVERS_SINCE") or 0),
                    grace_s=float(grace) if grace else None) if expect else []
