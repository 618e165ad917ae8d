"""The router's process (:class:`paravt.engines.router.VLLMRouter`, the real ``vllm-router`` of
requirements/cpu.txt) in front of real ``hf_server`` processes: it reports ready only once every server
answers ``/health``, drops a server it is told to, and ends with the run: stopped, or killed with the
process that started it. Requests through it need the vLLM tokens endpoint, which hf_server does not
speak: tests/real_server/test_router_vllm.py sends them to real vLLM servers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from paravt.engines.base import EngineError
from paravt.engines.router import RouterConfig, VLLMRouter
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
        router.remove(servers[1])
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
