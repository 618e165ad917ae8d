"""Every server of a routed pool probed directly while requests wait on the router.

A router (vllm-router, sglang-router) hides which server holds a request, and a server frozen while it holds
its port (SIGSTOP, a host that stopped scheduling it) accepts connections and answers nothing: the request
would wait for its own timeout. So while requests wait (:meth:`ServerSweep._while_servers_answer`) every
live server's ``/health`` is probed, at most once per half ``health_interval_s`` and shared by every waiting
request; a server that misses ``health_misses`` probes in a row (each bounded by ``health_timeout_s``; the
settings of the servers' clients, ``rollout.health_interval_s`` and ``rollout.health_misses``) is evicted
(one line; the router is told) and the requests that waited are sent again through the router, which has
moved the evicted server's keys. A request that waited on a live server is sent again too: the router does
not say where it was, and an eviction is rare.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from paravt.engines.base import GenerationOutput


class ServerSweep:
    """A mixin for :class:`~paravt.engines.pool.EnginePool` subclasses whose requests go through a router."""

    engines: list[Any]
    evicted: dict[int, str]

    @property
    def _sweep_state(self) -> dict[str, Any]:
        st = self.__dict__.get("_sweep_st")
        if st is None:
            st = self.__dict__["_sweep_st"] = {"lock": asyncio.Lock(), "last": float("-inf"), "misses": {}}
        return st

    async def _while_servers_answer(self, task: asyncio.Future, gone: int) -> GenerationOutput | None:
        """``task``'s answer; None (``task`` cancelled) when a server is evicted while it waits. The router hides
        which server holds the request, and a server frozen while it holds its port (SIGSTOP) answers nothing,
        so while requests wait every live server is probed directly (:meth:`_sweep`)."""
        interval = float(getattr(self.engines[0], "health_interval_s", 5.0))
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                return task.result()
            await self._sweep(interval)
            if len(self.evicted) > gone:
                task.cancel()
                return None

    async def _sweep(self, interval: float) -> None:
        """Probe every live server's ``/health`` (at most once per half interval, shared by the waiting requests);
        one that missed ``health_misses`` probes in a row is evicted (one line; the router is told)."""
        st = self._sweep_state
        async with st["lock"]:
            if time.monotonic() - st["last"] < interval / 2:
                return
            live = self.live
            found = await asyncio.gather(*(self.engines[i].health_status(getattr(self.engines[i], "health_timeout_s", 5.0))
                                           for i in live))
            st["last"] = time.monotonic()
            for i, status in zip(live, found):
                st["misses"][i] = 0 if status == "ok" else st["misses"].get(i, 0) + 1
                limit = int(getattr(self.engines[i], "health_misses", 3))
                if st["misses"][i] >= limit:
                    self.evict(i, f"it did not answer /health {limit} times in a row while requests waited on the router")
