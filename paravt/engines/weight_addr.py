"""The address the rollout servers reach trainer rank 0 at to form the ``broadcast`` weight group
(the group's TCP store listens there; :mod:`paravt.core.weight_sync`).

Chosen, first match wins:

1. ``rollout.sync_address`` (``WeightUpdate.master_address``), else ``PARAVT_WEIGHT_ADDR``: an explicit address;
2. the IPv4 address of the interface ``NCCL_SOCKET_IFNAME`` (else ``GLOO_SOCKET_IFNAME``) names, as NCCL
   reads it: a comma list of name prefixes, ``=name`` for an exact name (a ``^`` exclusion list, or a
   name with no IPv4 address here, chooses nothing: one warning, then the next rule);
3. ``127.0.0.1`` when every server is on this host;
4. the local address of this host's route to the first server not on it: a UDP socket ``connect()``
   then ``getsockname()`` (no packet is sent). This is the address that server's packets come back
   to, unlike the host name's address, which Debian-style ``/etc/hosts`` maps to ``127.0.1.1``.

A loopback address with a server on another host is refused in one line naming both addresses and
what to set: that server could never join the group.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from typing import Sequence
from urllib.parse import urlparse

from paravt.engines.base import EngineError

log = logging.getLogger(__name__)

ADDR_ENV = "PARAVT_WEIGHT_ADDR"
IFNAME_ENVS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _ip(host: str, port: int) -> str | None:
    """``host``'s first address (None: it does not resolve)."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0][4][0]
    except (OSError, IndexError):
        return None


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


def on_this_host(addr: str) -> bool:
    """Whether ``addr`` (an IP address) is this host's: loopback, or one a socket can bind to."""
    if is_loopback(addr):
        return True
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((addr, 0))
        return True
    except OSError:
        return False


def route_address(host: str, port: int) -> str:
    """The local address of this host's route to ``host`` (no packet sent: a UDP ``connect`` only
    picks the route)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(sockaddr)
        return s.getsockname()[0]


def interface_address(spec: str) -> str | None:
    """The IPv4 address of the first interface ``spec`` names (NCCL's ``*_SOCKET_IFNAME`` syntax)."""
    if not spec or spec.startswith("^"):
        return None
    names = [n for _, n in socket.if_nameindex()]
    for want in (w.strip() for w in spec.split(",")):
        exact, want = want.startswith("="), want.lstrip("=")
        for name in names:
            if want and (name == want or (not exact and name.startswith(want))):
                addr = _ipv4_of(name)
                if addr is not None:
                    return addr
    return None


def _ipv4_of(name: str) -> str | None:
    import fcntl  # noqa: PLC0415 - Linux only, as the interface lookup
    import struct  # noqa: PLC0415

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
        except OSError:  # no IPv4 address on it
            return None
    return socket.inet_ntoa(packed[20:24])


def weight_group_address(urls: Sequence[str], explicit: str | None = None) -> str:
    """The weight group's address for servers at ``urls`` (see the module docstring)."""
    remote = []
    for u in urls:
        p = urlparse(u)
        port = p.port or 80
        ip = _ip(p.hostname or "", port)
        if ip is None or not on_this_host(ip):
            remote.append((u, p.hostname or "", port, ip))
    addr, source = explicit, "rollout.sync_address"
    if not addr and os.environ.get(ADDR_ENV):
        addr, source = os.environ[ADDR_ENV], ADDR_ENV
    for var in IFNAME_ENVS if not addr else ():
        if os.environ.get(var):
            addr, source = interface_address(os.environ[var]), f"{var}={os.environ[var]}"
            if addr is None:
                log.warning("weight group: %s names no interface with an IPv4 address here; the address is "
                            "chosen without it (set %s to choose it)", source, ADDR_ENV)
            break
    if not addr and not remote:
        return "127.0.0.1"
    if not addr:
        url, host, port, _ = remote[0]
        try:
            addr, source = route_address(host, port), f"the route to {url}"
        except OSError as exc:
            raise EngineError(f"weight group: no route from this host to the rollout server {url} ({exc}); set "
                              f"rollout.sync_address or {ADDR_ENV} to the address it reaches this host at") from None
    if remote and is_loopback(_ip(addr, 0) or addr):
        url, _, _, ip = remote[0]
        raise EngineError(f"weight group address {addr} (from {source}) is loopback, but the rollout server "
                          f"{url} is on another host ({ip or 'unresolved'}): set rollout.sync_address or {ADDR_ENV} "
                          f"to this host's address on a network that server reaches, or "
                          f"NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to its interface")
    return addr
