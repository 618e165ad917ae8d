"""SFT examples kept across epochs: a builder that remembers what it built, within a memory budget.

A small data set (the tiny recipes' world) is read for many epochs; each row's example is the same every
time (the same frames decoded and resized, the same ids: building draws nothing at random), so keeping it
saves the decode, the image processor and the tokenizer on every later epoch. A real data set, read once or
twice, keeps the default 0 (off). A row that was skipped is counted again each time it comes up, as when it
is built again, so the skip counts in the metrics do not depend on the cache.
"""

from __future__ import annotations

from paravt.data.schema import SFTRow
from paravt.sft.data import Example, ExampleBuilder, SkipRow


def example_bytes(ex: Example) -> int:
    """About what an Example holds in memory: its ids and labels, its images' pixels and their tensors."""
    n = 2 * 36 * len(ex.input_ids)  # two lists of Python ints
    if ex.images is not None:
        n += sum(im.width * im.height * len(im.getbands()) for im in ex.images.images)
        cached = getattr(ex.images, "_tensors", None)
        if cached is not None:
            n += sum(t.numel() * t.element_size() for t in cached)
    return n


class CachedBuilder:
    """``builder``'s examples (and the reasons of skipped rows) kept by row until they fill ``cache_mb`` MB;
    then rows past the budget are built each time, as without a cache. Rows are keyed by identity: they live
    as long as the stream that holds them."""

    def __init__(self, builder: ExampleBuilder, cache_mb: int):
        self.builder, self.budget, self.used, self.hits = builder, cache_mb << 20, 0, 0
        self._kept: dict[int, Example | SkipRow] = {}

    @property
    def processor(self):
        return self.builder.processor

    @property
    def skipped(self):
        return self.builder.skipped

    def __len__(self) -> int:
        return len(self._kept)

    def __call__(self, row: SFTRow) -> Example:
        hit = self._kept.get(id(row))
        if hit is not None:
            self.hits += 1
            if isinstance(hit, SkipRow):
                self.builder.skipped[hit.reason] += 1
                raise hit
            return hit
        try:
            ex = self.builder(row)
        except SkipRow as exc:
            self._kept[id(row)] = exc
            raise
        size = example_bytes(ex)
        if self.used + size <= self.budget:
            self._kept[id(row)] = ex
            self.used += size
        return ex
