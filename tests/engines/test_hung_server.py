"""A rollout server that stops answering while it holds its port (SIGSTOP, a host that stopped scheduling
it) is found by the client's health probes within ``health_misses x (health_interval_s + health_timeout_s)``,
not at the request's timeout; an answer other than 200 during a weight push is not a miss (SGLang's
/health may wait behind a reload), silence is. The end-to-end case through ``run_rl.sh`` is
``tests/engines/test_pool_rl.py``."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from paravt.engines.base import EngineError, SamplingParams
from paravt.engines.factory import watch_health
from paravt.engines.pool import EnginePool
from paravt.engines.sglang import SGLangEngine


def _frozen_port() -> tuple[socket.socket, str]:
    """A port that accepts connections (the kernel's backlog) and never answers: a frozen server."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s, f"http://127.0.0.1:{s.getsockname()[1]}"


def _client(url: str) -> SGLangEngine:
    e = watch_health(SGLangEngine(url, request_timeout_s=600, max_retries=0), 0.3, 2)
    e.health_timeout_s = 0.3
    return e


def test_a_request_to_a_frozen_server_fails_within_the_probe_bound_not_its_timeout():
    sock, url = _frozen_port()
    e = _client(url)

    async def go():
        try:
            t0 = time.monotonic()
            out = await e.generate([1, 2, 3], None, SamplingParams(max_new_tokens=4))
            return out, time.monotonic() - t0
        finally:
            await e.close()

    try:
        out, took = asyncio.run(go())
    finally:
        sock.close()
    assert out.finish_reason == "error"
    assert "did not answer /health 2 times in a row" in out.error and url in out.error and "frozen" in out.error
    assert took < 60, took  # the request's own timeout is 600 s


def test_a_push_to_a_frozen_server_raises_naming_it():
    sock, url = _frozen_port()
    e = _client(url)

    async def go():
        try:
            await e.update_weights("/nonexistent/ckpt", 3)
        finally:
            await e.close()

    try:
        with pytest.raises(EngineError, match="did not answer /health 2 times in a row .* during /update_weights_from_disk"):
            asyncio.run(go())
    finally:
        sock.close()


async def _busy_server(slow_s: float):
    """/health answers 503 (busy); /generate and the disk reload answer after ``slow_s``."""
    from aiohttp import web

    async def health(_):
        return web.Response(status=503)

    async def reload(_):
        await asyncio.sleep(slow_s)
        return web.json_response({"success": True, "message": "ok"})

    async def generate(_):
        await asyncio.sleep(slow_s)
        return web.json_response({"output_ids": [5], "meta_info": {"output_token_logprobs": [[-0.1, 5, None]],
                                  "finish_reason": {"type": "length"}, "prompt_tokens": 3, "weight_version": "0"}})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/update_weights_from_disk", reload)
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the port the OS picked
    return runner, f"http://127.0.0.1:{port}"


def test_a_busy_answer_is_not_a_miss_during_a_push_but_is_during_a_generation():
    async def go():
        runner, url = await _busy_server(2.0)
        e = _client(url)
        try:
            await e.update_weights("/some/ckpt", 7)  # 2 s of 503s: a reload that takes its time
            version = e.weight_version
            out = await e.generate([1, 2, 3], None, SamplingParams(max_new_tokens=1))
        finally:
            await e.close()
            await runner.cleanup()
        return version, out

    version, out = asyncio.run(go())
    assert version == 7
    assert out.finish_reason == "error" and "did not answer /health" in out.error


def test_the_pool_evicts_a_frozen_server_and_sends_the_request_to_the_live_one():
    sock, frozen = _frozen_port()

    async def go():
        runner, live = await _busy_server(0.0)
        engines = [_client(frozen), _client(live)]
        pool = EnginePool(engines, probe_timeout_s=0.5)
        try:
            view = pool.for_episode("k")
            view.server = 0  # pinned to the server that froze
            out = await view.generate([1, 2, 3], None, SamplingParams(max_new_tokens=1))
        finally:
            await pool.close()
            await runner.cleanup()
        return pool, out

    try:
        pool, out = asyncio.run(go())
    finally:
        sock.close()
    assert out.finish_reason == "length" and out.token_ids == [5]
    assert list(pool.evicted) == [0] and "did not answer /health" in pool.evicted[0]
