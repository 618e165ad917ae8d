"""The launchers' check of the cluster variables, before anything starts: ``python -m paravt.core.cluster PROG``
(``scripts/_common.sh`` ``cluster_check``). A bad one is one line naming it and exit 2, never a torchrun
failure per rank or a run that quietly starts with something else.

* ``NPROC`` (when set): a whole number >= 1 of processes per node;
* ``NNODES`` a whole number >= 1, ``NODE_RANK`` one of ``0..NNODES-1``; with ``NNODES`` > 1 ``MASTER_ADDR`` must
  resolve (bounded by ``RESOLVE_S`` seconds: a resolver that does not answer is refused as well);
* ``MASTER_PORT`` a TCP port, 1..65535;
* ``HEARTBEAT_S``, ``RDZV_TIMEOUT``, ``FS_CHECK_TIMEOUT``, ``SERVERS_TIMEOUT``, ``SERVERS_GRACE``: seconds > 0; ``MAX_RESTARTS`` >= 0;
* ``NODE_GPUS`` (set by ``scripts/slurm/env.sh`` from Slurm's grant): a whole number >= 0.

:func:`check_url` holds the form of a server URL (``rollout.urls``), :func:`node_gpus` the GPUs a node counts.
Unset and empty variables take the launchers' defaults.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
from typing import Mapping
from urllib.parse import urlsplit

RESOLVE_S = 10.0
_INT = re.compile(r"[0-9]+")
_SECONDS = ("HEARTBEAT_S", "RDZV_TIMEOUT", "FS_CHECK_TIMEOUT", "SERVERS_TIMEOUT", "SERVERS_GRACE")


def _whole(env: Mapping[str, str], key: str, low: int, what: str) -> int | None:
    raw = (env.get(key) or "").strip()
    if not raw:
        return None
    if not _INT.fullmatch(raw) or int(raw) < low:
        raise ValueError(f"{key}={raw} must be {what}")
    return int(raw)


def resolves(host: str, timeout_s: float = RESOLVE_S) -> bool:
    """Whether ``host`` resolves to an address within ``timeout_s`` (getaddrinfo has no bound of its own:
    it runs in a daemon thread, left behind when it does not answer)."""
    done: list[bool] = []

    def look() -> None:
        try:
            done.append(bool(socket.getaddrinfo(host, None)))
        except (OSError, UnicodeError):
            done.append(False)

    t = threading.Thread(target=look, daemon=True)
    t.start()
    t.join(timeout_s)
    return bool(done and done[0])


def check_env(env: Mapping[str, str], resolve_s: float = RESOLVE_S) -> None:
    """A ``ValueError`` (one line naming the variable) for the first bad cluster variable in ``env``."""
    _whole(env, "NPROC", 1, "a whole number >= 1 of processes on this node (unset: one per GPU)")
    nnodes = _whole(env, "NNODES", 1, "a whole number >= 1 of nodes") or 1
    rank = _whole(env, "NODE_RANK", 0, f"one of 0..{nnodes - 1} (NNODES={nnodes}), a different one on each node")
    if nnodes > 1 and (rank is None or rank >= nnodes):
        raise ValueError(f"NODE_RANK={env.get('NODE_RANK') or ''} must be one of 0..{nnodes - 1} (NNODES={nnodes}), "
                         f"a different one on each node")
    port = _whole(env, "MASTER_PORT", 1, "a TCP port, 1..65535")
    if port is not None and port > 65535:
        raise ValueError(f"MASTER_PORT={port} must be a TCP port, 1..65535")
    for key in _SECONDS:
        raw = (env.get(key) or "").strip()
        try:
            ok = not raw or float(raw) > 0
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"{key}={raw} must be a number of seconds > 0")
    _whole(env, "MAX_RESTARTS", 0, "a whole number >= 0 of restarts")
    _whole(env, "NODE_GPUS", 0, "a whole number >= 0 of GPUs on this node")
    addr = (env.get("MASTER_ADDR") or "").strip()
    if nnodes > 1:
        if not addr:
            raise ValueError(f"set MASTER_ADDR to node 0's address, the same on every node (NNODES={nnodes})")
        if not resolves(addr, resolve_s):
            raise ValueError(f"MASTER_ADDR={addr} does not resolve to an address from this node (within "
                             f"{resolve_s:g} s): give node 0's hostname or IP address")


def check_url(url: str, key: str = "rollout.urls") -> str:
    """``url`` when it is ``http(s)://host[:port][/path]``, else a ``ValueError`` naming it."""
    why = ""
    try:
        u = urlsplit(str(url).strip())
        if u.scheme not in ("http", "https"):
            why = "its scheme must be http or https"
        elif not u.hostname:
            why = "it names no host"
        else:
            u.port  # noqa: B018 - raises ValueError for a port that is not 0..65535
            if u.port == 0:
                why = "its port must be 1..65535"
    except ValueError:
        why = "its port must be 1..65535"
    if why:
        raise ValueError(f"{key}: {url!r} is not a server URL ({why}): write http://HOST:PORT")
    return url


def node_gpus(visible: int, env: Mapping[str, str] = os.environ) -> int:
    """The GPUs this node runs on: ``NODE_GPUS`` (a scheduler's grant) when set, else the ``visible`` ones
    CUDA counts; a grant beyond what CUDA sees is a ``ValueError``. On CPU (``visible`` 0) 0."""
    granted = _whole(env, "NODE_GPUS", 0, "a whole number >= 0 of GPUs on this node")
    if granted is None or visible == 0:
        return visible
    if granted > visible:
        raise ValueError(f"NODE_GPUS={granted} (the GPUs the scheduler grants this node) but CUDA sees {visible}: "
                         f"check CUDA_VISIBLE_DEVICES on this node")
    return granted


def main(argv: list[str]) -> int:
    prog = argv[0] if argv else "paravt"
    try:
        check_env(os.environ)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
