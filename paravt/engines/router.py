"""Rollout servers behind one router, started by trainer rank 0 in front of the servers it uses, and
:class:`RoutedPool`, the engine that sends every request through it. Two routers, one per engine, both
pinned in requirements/rl.txt and cpu.txt (the trainer's own environment):

* vLLM: ``vllm-router`` (:class:`VLLMRouter`, ``--policy sticky_least_loaded``), requests as
  :class:`RouterClient` (the tokens endpoint), the episode's key as ``X-Session-ID``.
* SGLang: ``sglang-router`` (:class:`~paravt.engines.sglang_router.SGLangRouter`, ``--policy manual
  --assignment-mode min_load``), requests as :class:`~paravt.engines.sglang_router.SGLangRouterClient`
  (native ``/generate``), the key as ``X-SMG-Routing-Key``. The router rebuilds each body from its own
  typed request, which has no ``sampling_params.logit_bias``: the ban on generating vision placeholders
  travels as a custom logit processor instead (:mod:`paravt.engines.sglang_logit_processor`; the servers run
  ``--enable-custom-logit-processor``).

Both are started the same way:

* The router process is ``python -m <router>.launch_router`` from the trainer's environment, started once
  the servers answer; :meth:`RouterProcess.start` returns when the router reports every server healthy
  (``/readiness``), and it stops with the run (it dies with the process that started it, kill -9 included).
  The router's own retries and circuit breaker are off, so a failed request comes back to the pool instead
  of being retried on the same (sticky) server.
* :class:`RoutedPool` is an :class:`~paravt.engines.pool.EnginePool` whose requests go to the router's
  one URL. An episode's view sends its key in the router's key header: a new key goes to the server with
  the fewest keys (vLLM) or requests in flight (SGLang), and every later request with that key (each turn,
  each sub-agent) to the same one. A failed request is followed by a health probe of every live server,
  each directly; those that do not answer are evicted (one warning line each) and removed from the router,
  which moves their keys to a live server, and the request is sent again. With no dead server the error
  goes back to the episode (a bad request is not a dead server). Weight pushes, the version each server
  holds and the probes reach the servers directly, as in the pool; with none left every request fails at
  once and the next push ends the run (exit 3).
* vllm-router counts each server's open keys ("sessions"): an episode's view ends its session when the
  episode ends (:func:`end_episode`, which the episode owner calls), so the count is of episodes in flight;
  a key never finished (an episode that raised) is dropped after ``session_ttl_s`` without a request.
  sglang-router counts requests in flight, released as each ends; a key's server is forgotten after
  ``session_ttl_s`` without a request (``--max-idle-secs``).
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import dataclasses
import logging
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from paravt.engines.base import EngineError, GenerationOutput, SamplingParams
from paravt.engines.pool import EnginePool, PinnedEngine
from paravt.engines.sglang import SGLangServer
from paravt.engines.sweep import ServerSweep
from paravt.engines.vllm import VLLMEngine

log = logging.getLogger(__name__)

SESSION_TTL_ENV = "VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S"  # sticky_least_loaded's idle session expiry (s)
KEY_HEADER = "X-Session-ID"  # the first header vllm-router reads a routing key from (src/policies/hash_key.rs)
_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("paravt_router_key", default=None)
_SERVED = re.compile(r'^vllm_router_processed_requests_total\{worker="([^"]+)"\}\s+(\S+)', re.M)


@dataclass
class RouterConfig:
    python: str = sys.executable  # the environment holding the router (the trainer's)
    host: str = "127.0.0.1"  # only trainer rank 0 talks to it
    port: int = 0  # 0: a free port
    metrics_port: int = 0  # its Prometheus port (requests per server, :meth:`RoutedPool.take_served`); 0: a free port
    startup_timeout_s: float = 120.0  # give up waiting for /readiness after this
    # a key unused this long is dropped from the router's per-server session count (the episodes that
    # ended are released at once, see end_episode; this only bounds those that raised)
    session_ttl_s: int = 1800
    log_file: str | None = None  # the router's log (null: <router>_<port>.log)
    extra_args: list[str] = field(default_factory=list)  # more router flags

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"


def router_command(cfg: RouterConfig, worker_urls: Sequence[str]) -> list[str]:
    """argv of vllm-router in front of ``worker_urls``."""
    if not worker_urls:
        raise ValueError("a router needs at least one rollout server URL")
    if not cfg.port or not cfg.metrics_port:
        raise ValueError("router_command needs the router's port and metrics port (VLLMRouter picks free ones)")
    return [cfg.python, "-m", "vllm_router.launch_router", "--host", cfg.host, "--port", str(cfg.port),
            "--worker-urls", *worker_urls, "--policy", "sticky_least_loaded",
            # the pool judges a failed request (probe, evict, send again); the router must not retry it on
            # the same sticky server nor hide the failure
            "--disable-retries", "--disable-circuit-breaker",
            "--worker-startup-timeout-secs", str(int(cfg.startup_timeout_s)), "--worker-startup-check-interval", "1",
            "--prometheus-host", cfg.host, "--prometheus-port", str(cfg.metrics_port), *cfg.extra_args]


class RouterProcess(SGLangServer, abc.ABC):
    """A router process: ``Router(cfg, urls).start()`` returns once it reports every server healthy; ``stop()``
    ends it (start, port wait, log and stop as :class:`~paravt.engines.sglang.SGLangServer`). A router says how
    to list, remove and count its servers, how a key's session ends, and which client sends to it."""

    name = "router"
    kill_grace_s = 5.0
    stop_grace_s = 10.0

    def __init__(self, cfg: RouterConfig, worker_urls: Sequence[str]):
        from paravt.models.parallel import free_port  # noqa: PLC0415

        port = cfg.port or free_port()
        metrics = cfg.metrics_port or free_port()
        while metrics == port:
            metrics = free_port()
        cfg = dataclasses.replace(cfg, port=port, metrics_port=metrics)
        super().__init__(cfg)
        self.worker_urls = [u.rstrip("/") for u in worker_urls]

    def log_tail(self, n: int = 40) -> str:
        return re.sub(r"\x1b\[[0-9;]*m", "", super().log_tail(n))  # it colours its log even into a file

    def wait_healthy(self) -> None:
        """Until ``/readiness`` counts every server healthy (the router checks each ``/health`` itself)."""
        import requests  # noqa: PLC0415

        deadline = time.monotonic() + self.cfg.startup_timeout_s
        seen = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineError(f"{self.name} exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = requests.get(self.cfg.url + "/readiness", timeout=5)
                body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
                seen = f"HTTP {r.status_code} {r.text[:200]}"
                if r.status_code == 200 and body.get("healthy_workers") == len(self.worker_urls):
                    return
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.5)
        raise EngineError(f"{self.name} at {self.cfg.url} did not report the {len(self.worker_urls)} rollout "
                          f"server(s) healthy within {self.cfg.startup_timeout_s:.0f} s (last /readiness: {seen}):\n"
                          f"{self.log_tail()}")

    @abc.abstractmethod
    def workers(self) -> list[str]:
        """The URLs the router routes to now."""

    @abc.abstractmethod
    def _remove(self, url: str) -> str | None:
        """Ask the router to drop ``url``; None, or why it did not answer yes."""

    def remove(self, url: str) -> bool:
        """Stop routing to ``url`` (its keys move to a live server at their next request). A router may answer
        yes for a URL it does not know, so its worker list is read before and after: a URL that was never
        listed, or is still listed, is one warning line. True when it was removed."""
        import requests  # noqa: PLC0415

        url = url.rstrip("/")
        try:
            before = self.workers()
            why = self._remove(url) if url in before else None
            after = self.workers() if why is None and url in before else before
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            before, after, why = [], [], f"{type(exc).__name__}: {exc}"
        if why is None and url not in before:
            why = f"it was not among the router's workers {before}"
        elif why is None and url in after:
            why = "it is still among the router's workers after it was removed"
        if why is not None:
            log.warning("%s at %s did not remove the evicted server %s (%s)", self.name, self.cfg.url, url, why)
        return why is None

    @abc.abstractmethod
    def served(self) -> dict[str, int]:
        """Requests the router has sent to each server since it started (its Prometheus counters)."""

    def finish_session(self, key: str) -> tuple[str, dict[str, str]] | None:
        """The request (path, query) that ends ``key``'s session in the router, or None when its count needs none."""
        return None

    @abc.abstractmethod
    def client(self, engines: Sequence[Any], max_concurrency: int) -> Any:
        """The engine that sends requests to the router as ``engines`` (the servers' own clients) would."""


class VLLMRouter(RouterProcess):
    """``vllm-router`` (``--policy sticky_least_loaded``) in front of vLLM rollout servers."""

    name = "vllm-router"

    def command(self) -> tuple[list[str], dict[str, str]]:
        return router_command(self.cfg, self.worker_urls), {SESSION_TTL_ENV: str(int(self.cfg.session_ttl_s))}

    def workers(self) -> list[str]:
        """The servers the router routes to (``/list_workers``)."""
        import requests  # noqa: PLC0415

        r = requests.get(self.cfg.url + "/list_workers", timeout=5)
        r.raise_for_status()
        return [u.rstrip("/") for u in r.json()["urls"]]

    def _remove(self, url: str) -> str | None:
        import requests  # noqa: PLC0415

        r = requests.post(self.cfg.url + "/remove_worker", params={"url": url}, timeout=5)
        return None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}"

    def served(self) -> dict[str, int]:
        import requests  # noqa: PLC0415

        text = requests.get(self.cfg.metrics_url, timeout=5).text
        return {u: int(float(n)) for u, n in _SERVED.findall(text)}

    def finish_session(self, key: str) -> tuple[str, dict[str, str]] | None:
        return "/finish_session", {"session_id": key}

    def client(self, engines: Sequence[VLLMEngine], max_concurrency: int) -> "RouterClient":
        e = engines[0]
        return RouterClient(self.cfg.url, server=self, model=e.model, request_timeout_s=e.request_timeout_s,
                            max_retries=e.max_retries, max_concurrency=max_concurrency,
                            banned_token_ids=e.banned_token_ids, image_token_id=e.image_token_id)


class KeyedClient:
    """A client at a router's URL: each request carries the running episode's key (set by
    :meth:`RoutedPool.route`) in the router's key header; its liveness is the router's."""

    key_header = KEY_HEADER

    @property
    def health_url(self) -> str:
        return self.url + "/liveness"  # the router itself; /readiness would also fail with every server paused

    async def _http(self):
        import aiohttp  # noqa: PLC0415

        if self._session is None or self._session.closed:
            header = self.key_header

            async def key_header(_session, _ctx, params) -> None:
                key = _KEY.get()
                if key is not None:
                    params.headers[header] = key

            trace = aiohttp.TraceConfig()
            trace.on_request_start.append(key_header)
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.request_timeout_s),
                                                  trace_configs=[trace])
        return self._session


class RouterClient(KeyedClient, VLLMEngine):
    """:class:`~paravt.engines.vllm.VLLMEngine` at vllm-router's URL: the tokens endpoint, the key as
    ``X-Session-ID``."""

    server_kind = "vLLM router"
    key_header = KEY_HEADER


async def end_episode(engine) -> None:
    """The episode owner's end-of-episode hook, called once with the view it got from ``for_episode``
    after the episode's last request: a routed view releases its router session; any other engine has
    nothing to release."""
    end = getattr(engine, "end_episode", None)
    if end is not None:
        await end()


class RoutedPin(PinnedEngine):
    """One episode's view of a :class:`RoutedPool`: its requests carry its key; :meth:`end_episode`
    releases the key's session in the router."""

    async def end_episode(self) -> None:
        await self.pool.finish_session(self.key)


class RoutedPool(ServerSweep, EnginePool):
    """Rollout servers (``engines``, each reached directly for weights and probes) whose requests go
    through ``router`` (see the module docstring)."""

    def __init__(self, engines: Sequence[Any], router: RouterProcess, client: Any, probe_timeout_s: float = 10.0):
        super().__init__(engines, probe_timeout_s)
        self.router, self.client = router, client
        self._served_base = self._read_served() or {}
        self.open_sessions: set[str] = set()  # keys sent through the router and not finished yet
        self._finish_failed = False

    @classmethod
    def start(cls, engines: Sequence[Any], cfg: RouterConfig | None = None, probe_timeout_s: float = 10.0,
              max_concurrency: int = 256, router: type[RouterProcess] = VLLMRouter) -> "RoutedPool":
        """A ``router`` (a :class:`RouterProcess` class: :class:`VLLMRouter`,
        :class:`~paravt.engines.sglang_router.SGLangRouter`) started in front of ``engines``
        (their servers answer already) and the pool over it. Its client sends requests as the servers' own
        clients would, ``max_concurrency`` at once per server."""
        proc = router(cfg or RouterConfig(), [x.url for x in engines]).start()
        try:
            return cls(engines, proc, proc.client(engines, max_concurrency * len(engines)), probe_timeout_s)
        except BaseException:
            proc.stop()
            raise

    def evict(self, i: int, why: str) -> None:
        if i not in self.evicted:
            super().evict(i, why)
            self.router.remove(self.names[i])

    def for_episode(self, key: str) -> RoutedPin:
        return RoutedPin(self, key)

    async def finish_session(self, key: str) -> None:
        """End ``key``'s session in the router (vllm-router: ``POST /finish_session?session_id=<key>``; the router
        stops counting ``key`` on its server; sglang-router needs no request). A key never sent is not asked
        about; a failed call is one warning per run (a key left open only skews the balance until the router's
        TTL drops it)."""
        import aiohttp  # noqa: PLC0415

        if key not in self.open_sessions:
            return
        self.open_sessions.discard(key)
        request = self.router.finish_session(key)
        if request is None:
            return
        path, query = request
        try:
            session = await self.client._http()
            async with session.post(self.router.cfg.url + path, params=query,
                                    timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status == 200:
                    return
                why = f"HTTP {r.status}: {(await r.text())[:200]}"
        except Exception as exc:  # noqa: BLE001 - a release is best effort: never the episode's failure
            why = f"{type(exc).__name__}: {exc}"
        (log.debug if self._finish_failed else log.warning)(
            "%s at %s did not finish session %r (%s); it is dropped after %d s unused",
            self.router.name, self.router.cfg.url, key, why, self.router.cfg.session_ttl_s)
        self._finish_failed = True

    async def route(self, pin, input_ids, images, params: SamplingParams) -> GenerationOutput:
        """One request through the router, under ``pin``'s key; sent again when a server was evicted while
        it was in flight (by this failure's probes or by another's: requests fail together when their server
        dies), after the router was told, so it moves the key to a live one."""
        while True:
            if not self.live:
                return GenerationOutput([], [], "error", self.weight_version, error=self.none_left())
            gone = len(self.evicted)
            self.client.weight_version = self.weight_version  # a turn whose server reports no version
            if pin is not None:
                self.open_sessions.add(pin.key)
            token = _KEY.set(pin.key if pin is not None else None)
            try:
                out = await self._while_servers_answer(asyncio.ensure_future(self.client.generate(input_ids, images,
                                                                                                   params)), gone)
            except Exception as exc:  # noqa: BLE001 - judged below, as a failed request
                out = GenerationOutput([], [], "error", self.weight_version, error=f"{type(exc).__name__}: {exc}")
            finally:
                _KEY.reset(token)
            if out is None:  # a server was evicted while this waited: sent again (the router moved its keys)
                continue
            if out.finish_reason != "error":
                return out
            live = self.live
            for i, ok in zip(live, await asyncio.gather(*(self._healthy(i) for i in live))):
                if not ok:
                    self.evict(i, out.error or "request failed")
            if len(self.evicted) == gone:
                return out  # no server died meanwhile: the request itself failed (the episode records it)

    def _read_served(self) -> dict[str, int] | None:
        try:
            return self.router.served()
        except Exception as exc:  # noqa: BLE001 - a metric: its absence is said, never a failed step
            log.warning("could not read %s's request counts from %s: %s", self.router.name,
                        self.router.cfg.metrics_url, exc)
            return None

    def take_served(self) -> list[int]:
        """Requests the router sent to each server since the last call (a per-step metric)."""
        now = self._read_served()
        if now is None:
            return [0] * len(self.engines)
        out = [now.get(n, 0) - self._served_base.get(n, 0) for n in self.names]
        self._served_base = now
        return out

    async def health(self) -> bool:
        return await self.client.health() and await super().health()

    async def close(self) -> None:
        await asyncio.gather(self.client.close(), super().close(), return_exceptions=True)
