"""Examples kept across epochs (``example_cache_mb``): the stream gives the same packs, ids, labels and image
tensors with the cache as without it, counts skipped rows the same way, and keeps no more than its budget."""

from __future__ import annotations

import torch

from paravt.data.schema import load_sft_rows
from paravt.models.loading import load_processor
from paravt.sft.data import ExampleBuilder, PackedStream, VideoSamplingConfig
from paravt.sft.example_cache import CachedBuilder, example_bytes


def _packs(stream: PackedStream, n: int):
    out = []
    for _ in range(n):
        out.append([(e.input_ids, e.labels, None if e.images is None else
                     [t.clone() for t in e.images.tensors(stream.build.processor)]) for e in stream.next_batch()])
    return out


def _same(a, b):
    assert len(a) == len(b)
    for pa, pb in zip(a, b):
        assert len(pa) == len(pb)
        for (ia, la, ta), (ib, lb, tb) in zip(pa, pb):
            assert ia == ib and la == lb
            assert (ta is None) == (tb is None)
            if ta is not None:
                assert all(torch.equal(x, y) for x, y in zip(ta, tb))


def test_cached_examples_give_the_same_packs_over_several_epochs(world, tiny_dir):
    rows, _ = load_sft_rows([str(world / "local/paravt_sft_synth.parquet")])
    rows = rows[:12]
    proc = load_processor(tiny_dir)
    video = VideoSamplingConfig(max_frames=8)
    plain = PackedStream(rows, ExampleBuilder(proc, video, 1500), seed=3, max_length=1500)
    cached_builder = CachedBuilder(ExampleBuilder(proc, video, 1500), cache_mb=512)
    cached = PackedStream(rows, cached_builder, seed=3, max_length=1500)
    n = 3 * len(rows)  # past at least two epochs
    _same(_packs(plain, n), _packs(cached, n))
    assert cached.state.epoch >= 2 and cached_builder.hits > 0
    assert dict(plain.build.skipped) == dict(cached_builder.skipped)


def test_a_skipped_row_is_counted_each_time_it_comes_up(world, tiny_dir):
    rows, _ = load_sft_rows([str(world / "local/paravt_sft_synth.parquet")])
    rows = rows[:6]
    proc = load_processor(tiny_dir)
    counts = []
    for mb in (0, 512):
        b = ExampleBuilder(proc, VideoSamplingConfig(max_frames=8), 400)  # long rows are skipped
        s = PackedStream(rows, CachedBuilder(b, mb) if mb else b, seed=1, max_length=400)
        for _ in range(8):
            try:
                s.next_batch()
            except Exception:  # noqa: BLE001 - every row too long: the stream says so
                break
        counts.append((dict(b.skipped), s.state.epoch, s.state.cursor))
    assert counts[0] == counts[1] and sum(counts[0][0].values()) > 0


def test_the_cache_stops_at_its_budget(world, tiny_dir):
    rows, _ = load_sft_rows([str(world / "local/paravt_sft_synth.parquet")])
    proc = load_processor(tiny_dir)
    b = CachedBuilder(ExampleBuilder(proc, VideoSamplingConfig(max_frames=8), 8192), cache_mb=1)
    sizes = [example_bytes(b(r)) for r in rows[:10]]
    assert 0 < b.used <= 1 << 20
    assert 0 < len(b) < 10 and sum(sizes) > 1 << 20


def test_the_row_that_opens_a_bin_is_built_once(world, tiny_dir):
    rows, _ = load_sft_rows([str(world / "local/paravt_sft_synth.parquet")])
    proc = load_processor(tiny_dir)
    builder = ExampleBuilder(proc, VideoSamplingConfig(max_frames=8), 1500)
    built = []

    def build(row):
        built.append(row)
        return builder(row)

    s = PackedStream(rows[:10], build, seed=0, max_length=1500)
    consumed = sum(len(s.next_batch()) for _ in range(4))
    # each row that did not fit one bin opened the next without a second build (the last one waits for the next)
    assert len(built) == consumed + (s._held is not None) and len({id(r) for r in built}) == len(built)
