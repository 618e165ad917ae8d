"""A server frozen while it holds its port (SIGSTOP) behind a router: the router hides which server holds a
request, so while requests wait the pool probes every live server directly; the frozen one is evicted (one
line, the router told) and the request sent again reaches the live server (``paravt.engines.router.RoutedPool``),
within ``health_misses x (health_interval_s + health_timeout_s)``, not at the request's timeout."""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import pytest

from paravt.engines.base import SamplingParams
from paravt.engines.factory import watch_health
from paravt.engines.router import RouterConfig, RoutedPool
from paravt.engines.sglang_router import SGLangRouter
from tests.engines.test_sglang_router import IDS, _clients, _generates, _image, _recorder


def test_a_frozen_server_behind_the_router_is_evicted_and_the_request_answered_by_the_other(tmp_path, caplog):
    logs = [tmp_path / "rec0.jsonl", tmp_path / "rec1.jsonl"]
    started = [_recorder(log) for log in logs]
    procs, urls = [p for p, _ in started], [u for _, u in started]
    clients = [watch_health(c, 0.5, 2) for c in _clients(urls)]
    for c in clients:
        c.health_timeout_s = 0.5
        c.request_timeout_s = 600  # the request's own bound: far beyond the probes'
    pool = RoutedPool.start(clients, RouterConfig(log_file=str(tmp_path / "router.log")), router=SGLangRouter)
    p = SamplingParams(max_new_tokens=2, seed=1)
    frozen = None

    async def go():
        nonlocal frozen
        try:
            view = pool.for_episode("k")
            assert (await view.generate(IDS, _image(), p)).error is None
            frozen = next(i for i in (0, 1) if _generates(logs[i]))  # the server the router gave the key
            procs[frozen].send_signal(signal.SIGSTOP)
            t0 = time.monotonic()
            with caplog.at_level(logging.WARNING):
                out = await view.generate(IDS, _image(), p)
            return out, time.monotonic() - t0
        finally:
            await pool.close()

    try:
        out, took = asyncio.run(go())
    finally:
        pool.router.stop()
        for q in procs:
            q.send_signal(signal.SIGCONT)
            q.kill()
            q.wait(timeout=30)
    print(f"frozen server evicted and the request answered in {took:.1f} s")
    assert out.error is None and list(pool.evicted) == [frozen]
    assert len(_generates(logs[1 - frozen])) == 1  # sent again, to the live server
    assert took < 60, took
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and urls[frozen] in lines[0] and "did not answer /health 2 times" in lines[0], lines
