"""The broadcast weight group's address (:mod:`paravt.engines.weight_addr`): loopback only while every
rollout server is on this host, else the local address of the route to a remote server, an explicit
address, or an interface's; a loopback address with a remote server is refused in one line. No packet
is sent: a UDP ``connect`` to a TEST-NET address only picks a route."""

from __future__ import annotations

import asyncio
import socket

import pytest

from paravt.engines.base import EngineError
from paravt.engines.weight_addr import ADDR_ENV, IFNAME_ENVS, interface_address, weight_group_address
from paravt.engines.weight_push import BroadcastPush

REMOTE = "http://192.0.2.1:30000"  # TEST-NET-1: never this host


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in (ADDR_ENV, *IFNAME_ENVS):
        monkeypatch.delenv(var, raising=False)


def _route_to(host: str, port: int) -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError:
        return None


def test_servers_on_this_host_meet_on_loopback():
    assert weight_group_address(["http://127.0.0.1:30000", "http://localhost:30001/"]) == "127.0.0.1"


def test_a_forced_loopback_address_is_allowed_while_every_server_is_local(monkeypatch):
    monkeypatch.setenv(ADDR_ENV, "127.0.1.1")
    assert weight_group_address(["http://127.0.0.1:30000"]) == "127.0.1.1"


def test_a_remote_server_gets_the_local_address_of_the_route_to_it():
    want = _route_to("192.0.2.1", 30000)
    if want is None:
        pytest.skip("this host has no route to 192.0.2.1")
    got = weight_group_address(["http://127.0.0.1:30000", REMOTE])
    assert got == want and not got.startswith("127.")


def test_an_explicit_address_wins_config_first(monkeypatch):
    monkeypatch.setenv(ADDR_ENV, "10.9.8.7")
    assert weight_group_address([REMOTE]) == "10.9.8.7"
    assert weight_group_address([REMOTE], explicit="10.1.2.3") == "10.1.2.3"


@pytest.mark.parametrize("force", [(ADDR_ENV, "127.0.1.1"), ("NCCL_SOCKET_IFNAME", "lo"),
                                   ("GLOO_SOCKET_IFNAME", "=lo")])
def test_loopback_with_a_remote_server_is_refused_in_one_line(monkeypatch, force):
    monkeypatch.setenv(*force)
    with pytest.raises(EngineError) as err:
        weight_group_address(["http://127.0.0.1:30000", REMOTE])
    msg = str(err.value)
    assert "\n" not in msg
    assert "127.0" in msg and "192.0.2.1" in msg and force[0] in msg  # both addresses and where it came from
    assert ADDR_ENV in msg and "NCCL_SOCKET_IFNAME" in msg  # what to set


def test_the_config_address_refused_names_the_config_key():
    with pytest.raises(EngineError, match=r"127\.0\.0\.1 \(from rollout\.sync_address\) is loopback"):
        weight_group_address([REMOTE], explicit="127.0.0.1")


def test_an_interface_name_gives_its_ipv4_address(monkeypatch):
    assert interface_address("lo") == "127.0.0.1"
    assert interface_address("^lo,docker") is None  # an exclusion list names no interface
    assert interface_address("=l") is None  # exact: no interface is called "l"
    eth = next((n for _, n in socket.if_nameindex() if n != "lo" and interface_address("=" + n)), None)
    if eth is not None:
        monkeypatch.setenv("NCCL_SOCKET_IFNAME", eth)
        assert weight_group_address([REMOTE]) == interface_address("=" + eth)


def test_a_server_at_one_of_this_hosts_own_addresses_is_local(monkeypatch):
    own = _route_to("192.0.2.1", 30000)
    if own is None:
        pytest.skip("this host has no route to 192.0.2.1")
    monkeypatch.setenv(ADDR_ENV, "127.0.0.1")
    assert weight_group_address([f"http://{own}:30000"]) == "127.0.0.1"


class _Client:
    async def weight_workers(self) -> int:
        return 1


def test_the_first_push_refuses_before_any_server_is_asked_to_join(monkeypatch):
    monkeypatch.setenv(ADDR_ENV, "127.0.0.1")
    push = BroadcastPush("gloo", None, timeout_s=5)
    with pytest.raises(EngineError, match="is loopback"):
        asyncio.run(push._connect([_Client()], [REMOTE]))
    assert push.group is None
