"""Several rollout servers as one engine, for runs that outgrow one rollout GPU or one node.

Routing, per request:

* **Sticky by episode.** The episode asks for a view bound to its key (:meth:`EnginePool.for_episode`);
  every turn of that episode and every sub-agent it starts goes to the one server the view was given
  at its first request, so a later turn finds its prefix (and the overview's vision features) in that
  server's cache. A new view goes to the live server with the fewest requests in flight (ties: the
  next in turn), so episodes spread over the servers. A request without a view is routed the same
  way, request by request.
* **A dead server is evicted.** A request that fails is followed by a health probe of its server; a
  server that does not answer it is evicted (one warning line naming it and the error) and the
  request is sent again to another live server, as are the requests that were in flight on it and
  every later turn of the episodes pinned to it. A server that answers its probe keeps its place and
  the error goes back to the episode (a bad request is not a dead server). With no server left every
  request fails at once with one error naming the evicted ones, and the run's next weight push fails
  on it (the trainer then checkpoints and exits 3).

``update_weights`` pushes the same directory and version to every live server at once and returns
when all hold it; the trainer's own push (:meth:`paravt.engines.factory.EngineHandle.push_weights`)
reaches the live servers directly, through :meth:`EnginePool.live_urls`. Each generated turn carries
the version of the server that served it, so staleness is measured per turn.

:class:`paravt.engines.router.RoutedPool` keeps these rules with servers behind a router (sglang-router,
vllm-router): the router picks each episode's server and the pool evicts, removing the dead server from the
router too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Sequence

from paravt.engines.base import EngineError, GenerationOutput, InferenceEngine, SamplingParams

log = logging.getLogger(__name__)


class EnginePool(InferenceEngine):
    def __init__(self, engines: Sequence[InferenceEngine], probe_timeout_s: float = 10.0):
        """``probe_timeout_s`` bounds the health probe after a failed request: a server that does not
        answer ``/health`` within it is evicted."""
        if not engines:
            raise ValueError("EnginePool needs at least one engine")
        self.engines = list(engines)
        self.names = [str(getattr(e, "url", "") or f"engine {i}") for i, e in enumerate(self.engines)]
        self.outstanding = [0] * len(self.engines)
        self.served = [0] * len(self.engines)  # requests each server has answered (a metric and a test hook)
        self.evicted: dict[int, str] = {}  # server index → the error that evicted it
        self.probe_timeout_s = probe_timeout_s
        self._next = 0
        self._probes: dict[int, asyncio.Future] = {}

    # ------------------------------------------------------------------ who is alive
    @property
    def live(self) -> list[int]:
        return [i for i in range(len(self.engines)) if i not in self.evicted]

    def live_urls(self) -> list[str]:
        """The servers still serving, in order (where the trainer pushes each version)."""
        return [self.names[i] for i in self.live]

    def none_left(self) -> str:
        """The error of a pool whose every server was evicted."""
        gone = "; ".join(f"{self.names[i]}: {why}" for i, why in self.evicted.items())
        return f"no rollout server left: all {len(self.engines)} were evicted ({gone})"

    @property
    def weight_version(self) -> int:  # type: ignore[override]
        live = self.live or range(len(self.engines))
        return min(self.engines[i].weight_version for i in live)

    @weight_version.setter
    def weight_version(self, v: int) -> None:
        for e in self.engines:
            e.weight_version = v

    def _pick(self) -> int:
        live = self.live
        n = len(self.engines)
        order = [j for j in ((self._next + k) % n for k in range(n)) if j in live]
        i = min(order, key=lambda j: self.outstanding[j])
        self._next = (i + 1) % n
        return i

    async def _healthy(self, i: int) -> bool:
        """One health probe of server ``i``, shared by the requests that failed on it together."""
        fut = self._probes.get(i)
        if fut is None:
            async def probe() -> bool:
                try:
                    return bool(await asyncio.wait_for(self.engines[i].health(), self.probe_timeout_s))
                except Exception:  # noqa: BLE001 - no answer is an answer
                    return False
            fut = self._probes[i] = asyncio.ensure_future(probe())
            fut.add_done_callback(lambda _f, i=i: self._probes.pop(i, None))
        return await asyncio.shield(fut)

    def evict(self, i: int, why: str) -> None:
        if i in self.evicted:
            return
        why = " ".join(str(why).split())[:300]
        self.evicted[i] = why
        log.warning("rollout server %s evicted (it failed a request and did not answer /health: %s); %d of %d "
                    "server(s) left", self.names[i], why, len(self.live), len(self.engines))

    # ------------------------------------------------------------------ requests
    def for_episode(self, key: str) -> "PinnedEngine":
        """A view whose requests all go to one live server (see the module docstring)."""
        return PinnedEngine(self, key)

    async def generate(self, input_ids, images, params: SamplingParams) -> GenerationOutput:
        return await self.route(None, input_ids, images, params)

    async def route(self, pin: "PinnedEngine | None", input_ids, images, params: SamplingParams) -> GenerationOutput:
        """One request: on ``pin``'s server (chosen now if it has none or it was evicted), else on
        the least loaded live server; sent again elsewhere while the server it failed on is dead."""
        while True:
            if not self.live:
                return GenerationOutput([], [], "error", self.weight_version, error=self.none_left())
            i = pin.server if pin is not None and pin.server is not None and pin.server not in self.evicted \
                else self._pick()
            if pin is not None:
                pin.server = i
            self.outstanding[i] += 1
            try:
                out = await self.engines[i].generate(input_ids, images, params)
            except Exception as exc:  # noqa: BLE001 - a client bug or a dropped connection: judged below
                out = GenerationOutput([], [], "error", self.engines[i].weight_version,
                                       error=f"{type(exc).__name__}: {exc}")
            finally:
                self.outstanding[i] -= 1
            if out.finish_reason != "error":
                self.served[i] += 1
                return out
            if i not in self.evicted and await self._healthy(i):
                self.served[i] += 1
                return out  # the server is fine: the request itself failed (the episode records it)
            self.evict(i, out.error or "request failed")

    def take_served(self) -> list[int]:
        """Requests each server answered since the last call (a per-step metric)."""
        out, self.served = self.served, [0] * len(self.engines)
        return out

    async def update_weights(self, source: Any, version: int | None = None) -> None:
        live = self.live
        if not live:
            raise EngineError(self.none_left())
        await asyncio.gather(*(self.engines[i].update_weights(source, version) for i in live))

    async def health(self) -> bool:
        live = self.live
        return bool(live) and all(await asyncio.gather(*(self.engines[i].health() for i in live)))

    async def close(self) -> None:
        await asyncio.gather(*(e.close() for e in self.engines), return_exceptions=True)


class PinnedEngine(InferenceEngine):
    """One episode's view of an :class:`EnginePool`: its requests stay on one server (``server``,
    chosen at the first request) until that server is evicted, then on the one they moved to."""

    def __init__(self, pool: EnginePool, key: str):
        self.pool, self.key = pool, key
        self.server: int | None = None

    @property
    def weight_version(self) -> int:  # type: ignore[override]
        return self.pool.weight_version

    @property
    def server_name(self) -> str | None:
        return None if self.server is None else self.pool.names[self.server]

    async def generate(self, input_ids, images, params: SamplingParams) -> GenerationOutput:
        return await self.pool.route(self, input_ids, images, params)

    def for_episode(self, key: str) -> "PinnedEngine":
        return self.pool.for_episode(key)

    async def update_weights(self, source: Any, version: int | None = None) -> None:
        raise TypeError("weights go to the pool (every live server), not to one episode's view")

    async def health(self) -> bool:
        return await self.pool.health()
