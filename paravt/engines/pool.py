"""Several rollout servers as one engine, for runs that outgrow one rollout GPU or one node.

A request goes to the server with the fewest requests in flight (ties: the next in turn), so a long
episode never queues behind another on a busy server while one idles. ``update_weights`` pushes the
same directory and version to every server at once and returns when all hold it. Each generated turn
carries the version of the server that served it, so staleness is measured per turn.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from paravt.engines.base import GenerationOutput, InferenceEngine, SamplingParams


class EnginePool(InferenceEngine):
    def __init__(self, engines: Sequence[InferenceEngine]):
        if not engines:
            raise ValueError("EnginePool needs at least one engine")
        self.engines = list(engines)
        self.outstanding = [0] * len(self.engines)
        self.served = [0] * len(self.engines)  # requests each server has answered (a metric and a test hook)
        self._next = 0

    @property
    def weight_version(self) -> int:  # type: ignore[override]
        return min(e.weight_version for e in self.engines)

    @weight_version.setter
    def weight_version(self, v: int) -> None:
        for e in self.engines:
            e.weight_version = v

    def _pick(self) -> int:
        n = len(self.engines)
        order = [(self._next + i) % n for i in range(n)]
        i = min(order, key=lambda j: self.outstanding[j])
        self._next = (i + 1) % n
        return i

    async def generate(self, input_ids, images, params: SamplingParams) -> GenerationOutput:
        i = self._pick()
        self.outstanding[i] += 1
        try:
            return await self.engines[i].generate(input_ids, images, params)
        finally:
            self.outstanding[i] -= 1
            self.served[i] += 1

    def take_served(self) -> list[int]:
        """Requests each server answered since the last call (a per-step metric)."""
        out, self.served = self.served, [0] * len(self.engines)
        return out

    async def update_weights(self, source: Any, version: int | None = None) -> None:
        await asyncio.gather(*(e.update_weights(source, version) for e in self.engines))

    async def health(self) -> bool:
        return all(await asyncio.gather(*(e.health() for e in self.engines)))

    async def close(self) -> None:
        await asyncio.gather(*(e.close() for e in self.engines), return_exceptions=True)
