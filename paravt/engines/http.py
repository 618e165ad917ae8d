"""HTTP plumbing shared by every client and server launcher: one session per client, ONE retry
policy (:func:`retry`), one health wait (:func:`wait_healthy`).

Retry policy: a request is tried at most ``attempts`` times in total, with exponential backoff
(1, 2, 4 … s, capped at 30 s). Only transient failures are retried: connection errors, timeouts,
HTTP 5xx and 429 (:class:`TransientHTTPError`). Any other 4xx is a bad request and fails at
once. Callers above the engine (the episode, the eval driver) do not retry again, so a request
is never tried more than ``attempts`` times.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from typing import Any, Awaitable, Callable, TypeVar

from paravt.engines.base import EngineError

T = TypeVar("T")


class TransientHTTPError(EngineError):
    """HTTP 5xx / 429: worth another attempt."""


async def retry(call: Callable[[], Awaitable[T]], attempts: int, transient: tuple[type[BaseException], ...],
                before_attempt: Callable[[], None] | None = None, max_backoff_s: float = 30.0) -> T:
    """``await call()`` up to ``attempts`` times (>= 1); exceptions in ``transient`` are retried
    after 1, 2, 4 … s, anything else propagates at once; the last transient error is raised as
    an :class:`EngineError` naming the attempt count. ``before_attempt`` may raise to stop early
    (e.g. the server process died)."""
    last: BaseException | None = None
    for attempt in range(max(1, attempts)):
        if before_attempt is not None:
            before_attempt()
        try:
            return await call()
        except transient as exc:
            last = exc
            if attempt + 1 < attempts:
                await asyncio.sleep(min(2.0 ** attempt, max_backoff_s))
    raise EngineError(f"failed after {max(1, attempts)} attempts: {last}")


def http_transient_errors() -> tuple[type[BaseException], ...]:
    import aiohttp  # noqa: PLC0415

    return (aiohttp.ClientError, asyncio.TimeoutError, TransientHTTPError)


def weight_group_env() -> dict[str, str]:
    """What a rollout server needs in its environment to meet the trainer in one NCCL weight group:
    NCCL's cuMem allocator set as the trainer has it (``NCCL_CUMEM_ENABLE``; ``run_rl.sh`` exports 0,
    which SGLang and vLLM use for their own workers), so both ends of the group agree; and the interfaces the
    user names for NCCL and gloo (``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``), so the servers join on the
    network the trainer chose."""
    return {"NCCL_CUMEM_ENABLE": os.environ.get("NCCL_CUMEM_ENABLE", "0"),
            **{k: os.environ[k] for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if os.environ.get(k)}}


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout_s: float = 300.0,
                 log_tail: Callable[[], str] = lambda: "") -> None:
    """Block until ``GET url`` answers 200 (backoff 1 s → 10 s); fail at once if ``proc`` exits."""
    import requests  # noqa: PLC0415

    deadline = time.monotonic() + timeout_s
    delay = 0.5
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise EngineError(f"server for {url} exited with code {proc.returncode}:\n{log_tail()}")
        try:
            if requests.get(url, timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(delay)
        delay = min(delay * 1.5, 10.0)
    raise EngineError(f"server at {url} not healthy after {timeout_s:.0f} s:\n{log_tail()}")


class HTTPSessionMixin:
    """Lazily opened session, JSON POST with the retry policy, a health probe and close.
    Subclasses set ``request_timeout_s``, ``max_retries`` (retries after the first attempt),
    ``health_url`` and optionally ``headers``."""

    _session = None
    headers: dict[str, str] = {}
    request_timeout_s: float = 600.0
    max_retries: int = 3

    @property
    def health_url(self) -> str:  # pragma: no cover - overridden
        raise AttributeError("health_url")

    async def _http(self):
        import aiohttp  # noqa: PLC0415

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self.headers,
                                                  timeout=aiohttp.ClientTimeout(total=self.request_timeout_s))
        return self._session

    async def post_json(self, url: str, payload: dict[str, Any],
                        before_attempt: Callable[[], None] | None = None) -> Any:
        """POST ``payload``; the parsed JSON reply. 4xx (not 429) raises EngineError at once."""

        async def once() -> Any:
            session = await self._http()
            async with session.post(url, json=payload) as r:
                if r.status >= 400:
                    msg = f"{url}: HTTP {r.status}: {(await r.text())[:500]}"
                    raise (TransientHTTPError if r.status >= 500 or r.status == 429 else EngineError)(msg)
                return await r.json()

        return await retry(once, self.max_retries + 1, http_transient_errors(), before_attempt)

    async def health(self, timeout_s: float | None = None) -> bool:
        """GET the health URL: 200 or not (``timeout_s``: this probe's own bound, else the session's)."""
        import aiohttp  # noqa: PLC0415

        try:
            session = await self._http()
            kw = {"timeout": aiohttp.ClientTimeout(total=timeout_s)} if timeout_s else {}
            async with session.get(self.health_url, **kw) as r:
                return r.status == 200
        except Exception:  # noqa: BLE001 - unhealthy is an answer, not an error
            return False

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class LaunchedServerMixin:
    """A client whose server this process may have launched (``self.server``: its handle with
    ``proc`` and ``log_tail()``, or None): the health URL, and a dead server named with its log tail
    before each attempt instead of a connection error after the retries."""

    server = None
    url: str = ""
    server_kind = "inference"

    @property
    def health_url(self) -> str:
        return self.url + "/health"

    # A server that stops answering /health while a request waits on it is dead or wedged (its API
    # process may live on after its engine died): the request fails after ``health_misses``
    # consecutive failed probes, ``health_interval_s`` apart (each probe waits ``health_timeout_s``),
    # i.e. within ``health_misses * (health_interval_s + health_timeout_s)`` seconds (rollout.health_interval_s,
    # rollout.health_misses), instead of after the request's own timeout. A server frozen while holding its
    # port (SIGSTOP, a host that stopped scheduling it) accepts the connection and never answers: a miss.
    # During a weight push or a control request an answer other than 200 is not a miss: SGLang's /health
    # can run a one-token generation that waits behind the reload; only silence is.
    health_interval_s: float = 5.0
    health_timeout_s: float = 5.0
    health_misses: int = 3
    _last_probe: tuple[float, str] = (float("-inf"), "ok")

    def _check_alive(self) -> None:
        if self.server is not None and self.server.proc is not None and self.server.proc.poll() is not None:
            raise EngineError(f"{self.server_kind} server {self.url} died (exit {self.server.proc.returncode}):\n"
                              f"{self.server.log_tail()}")

    async def health_status(self, timeout_s: float) -> str:
        """``ok`` (200), ``busy`` (an answer other than 200) or ``silent`` (no answer within ``timeout_s``)."""
        import aiohttp  # noqa: PLC0415

        try:
            session = await self._http()
            async with session.get(self.health_url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                return "ok" if r.status == 200 else "busy"
        except Exception:  # noqa: BLE001 - no answer is an answer
            return "silent"

    async def _probe(self) -> str:
        """:meth:`health_status` with a short timeout; concurrent waiters share one probe per interval."""
        t, status = self._last_probe
        if time.monotonic() - t < self.health_interval_s / 2:
            return status
        self._last_probe = (time.monotonic(), status)  # claimed: others reuse the last answer meanwhile
        status = await self.health_status(self.health_timeout_s)
        self._last_probe = (time.monotonic(), status)
        return status

    async def watched(self, coro: Awaitable[T], what: str) -> T:
        """``await coro`` while probing the server's health; raises :class:`EngineError` naming the
        server when it exits or misses ``health_misses`` probes in a row (for ``what`` other than a
        generation, only probes it did not answer at all count)."""
        task = asyncio.ensure_future(coro)
        misses, generation = 0, what.rstrip("/").endswith("generate")
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.health_interval_s)
                if done:
                    return task.result()
                self._check_alive()
                status = await self._probe()
                misses = 0 if status == "ok" or (status == "busy" and not generation) else misses + 1
                if misses >= self.health_misses:
                    raise EngineError(f"{self.server_kind} server {self.url} did not answer /health {misses} times in a "
                                      f"row (~{misses * (self.health_interval_s + self.health_timeout_s):.0f} s) during "
                                      f"{what}: its engine is dead, wedged or frozen")
        finally:
            if not task.done():
                task.cancel()
