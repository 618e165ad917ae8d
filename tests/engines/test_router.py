"""The router's process (:class:`paravt.engines.router.VLLMRouter`, the real ``vllm-router`` of
requirements/cpu.txt) in front of real ``hf_server`` processes: it reports ready only once every server
answers ``/health``, drops a server it is told to, and ends with the run: stopped, or killed with the
process that started it. Requests through it need the vLLM tokens endpoint, which hf_server does not
speak: tests/real_server/test_router_vllm.py sends them to real vLLM servers. The router still picks a
server (and opens the key's session) for such a request, so the session count is tested here: the
router reports it only in its log ("active sessions on replica: N" for each new key)."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import requests

from paravt.engines.base import EngineError, SamplingParams
from paravt.engines.router import RoutedPool, RouterConfig, VLLMRouter, end_episode
from paravt.engines.vllm import VLLMEngine
from paravt.models.parallel import free_port
from tests.engines.test_pool import _start


@pytest.fixture(scope="module")
def servers(tiny_dir):
    urls, procs = _start(tiny_dir, 2)
    yield urls
    for p in procs:
        p.kill()
        p.wait(timeout=30)


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_the_router_is_ready_with_every_server_drops_one_when_told_and_stops(servers, tmp_path):
    router = VLLMRouter(RouterConfig(log_file=str(tmp_path / "router.log")), servers).start()
    try:
        ready = requests.get(router.cfg.url + "/readiness", timeout=5).json()
        assert ready["healthy_workers"] == 2
        assert sorted(requests.get(router.cfg.url + "/list_workers", timeout=5).json()["urls"]) == sorted(servers)
        assert router.remove(servers[1])
        assert requests.get(router.cfg.url + "/list_workers", timeout=5).json()["urls"] == [servers[0]]
        assert router.served() == {}  # no request sent yet
    finally:
        router.stop()
    assert router.proc.poll() is not None
    with pytest.raises(requests.ConnectionError):
        requests.get(router.cfg.url + "/liveness", timeout=5)


def test_a_router_whose_server_never_answers_fails_to_start_with_one_error(tmp_path):
    silent = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    router = VLLMRouter(RouterConfig(startup_timeout_s=5, log_file=str(tmp_path / "router.log")), [silent])
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="vllm-router") as err:
        router.start()
    assert time.monotonic() - t0 < 60
    assert "healthy" in str(err.value) or "exited" in str(err.value)
    assert router.proc.poll() is not None  # nothing left running


def test_the_router_dies_with_the_process_that_started_it(servers, tmp_path):
    code = ("import sys, time; from paravt.engines.router import RouterConfig, VLLMRouter; "
            f"r = VLLMRouter(RouterConfig(log_file={str(tmp_path / 'router.log')!r}), {servers!r}).start(); "
            "print(r.proc.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        assert not _gone(pid, 0.5)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
    assert _gone(pid, 30), f"the router (pid {pid}) outlived the process that started it"


_NEW = re.compile(r"SLL: new session '([^']+)' -> replica '([^']+)' \(active sessions on replica: (\d+)\)")
_DONE = re.compile(r"SLL: finished session '([^']+)'")


def _sessions(log_file, want_new: int) -> tuple[dict[str, tuple[str, int]], set[str]]:
    """The router's log: each new key → (its server, that server's session count with it), and the keys
    finished; read until ``want_new`` keys were opened (it writes each line as it happens)."""
    deadline = time.monotonic() + 10
    while True:
        text = re.sub(r"\x1b\[[0-9;]*m", "", open(log_file).read())
        new = {k: (u, int(n)) for k, u, n in _NEW.findall(text)}
        if len(new) >= want_new or time.monotonic() > deadline:
            return new, set(_DONE.findall(text))
        time.sleep(0.2)


def test_ended_episodes_release_their_router_sessions(servers, tmp_path):
    log_file = tmp_path / "router.log"
    engines = [VLLMEngine(u, model="tiny", max_retries=0, request_timeout_s=30) for u in servers]
    pool = RoutedPool.start(engines, RouterConfig(log_file=str(log_file)))
    params = SamplingParams(max_new_tokens=1)
    keys = [f"sample{i}/7" for i in range(6)]

    async def episodes(names, end: bool) -> None:
        views = [pool.for_episode(k) for k in names]
        # hf_server has no tokens endpoint: each request fails (an episode error), the router still routes it
        outs = await asyncio.gather(*(v.generate([1, 2, 3], None, params) for v in views))
        assert all(o.finish_reason == "error" for o in outs) and not pool.evicted
        if end:
            await asyncio.gather(*(end_episode(v) for v in views))

    async def run() -> None:
        try:
            await episodes(keys, end=False)
            new, done = _sessions(log_file, len(keys))
            assert set(new) == set(keys) and not done
            assert max(n for _, n in new.values()) == len(keys) // 2  # open together: 3 per server
            await asyncio.gather(*(end_episode(pool.for_episode(k)) for k in keys))
            new, done = _sessions(log_file, len(keys))
            assert done == set(keys) and not pool.open_sessions  # the router's own count is back to 0 ...
            await episodes(["probe-a", "probe-b"], end=True)  # ... so two new keys find empty servers
            new, done = _sessions(log_file, len(keys) + 2)
            assert new["probe-a"][1] == new["probe-b"][1] == 1 and new["probe-a"][0] != new["probe-b"][0]
            assert {"probe-a", "probe-b"} <= done
        finally:
            await pool.close()

    try:
        asyncio.run(run())
    finally:
        pool.router.stop()


def test_removing_a_server_the_router_does_not_know_is_one_warning(servers, tmp_path, caplog):
    router = VLLMRouter(RouterConfig(log_file=str(tmp_path / "router.log")), servers).start()
    unknown = f"http://127.0.0.1:{free_port()}"
    try:
        with caplog.at_level(logging.WARNING, logger="paravt.engines.router"):
            assert router.remove(unknown) is False
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and unknown in lines[0] and "not among the router's workers" in lines[0]
        assert sorted(router.workers()) == sorted(servers)  # nothing else changed
    finally:
        router.stop()
