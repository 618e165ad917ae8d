"""The SFT feed (:mod:`paravt.sft.feed`): with ``prefetch`` a background thread prepares the next step's
batches; the steps hold the same batches in the same order, the losses are the same, and a checkpoint keeps
the data cursor of the steps trained (not of the one prefetched), with prefetch on or off."""

from __future__ import annotations

import threading

import pytest
import torch

from paravt.core.config import load_config
from paravt.data.schema import SFTRow
from paravt.sft.config import SFTConfig, StepSplit
from paravt.sft.data import Example, PackedStream
from paravt.sft.feed import StepFeed


def _feed(prefetch: bool, rank: int, split: StepSplit, last_step=None, fail_at=None):
    rows = [SFTRow(messages=[], videos=[], where=f"r{i}") for i in range(9)]
    threads = []

    def build(row):
        threads.append(threading.current_thread().name)
        if row.where == fail_at:
            raise OSError("unreadable row")
        n = 30 + 7 * int(row.where[1:])
        return Example([1] * n, [1] * n, None, row.where)

    stream = PackedStream(rows, build, seed=0, max_length=100, pack=True, batch_size=1, rank=rank,
                          world_size=split.world_size)

    def collate(exs):
        return {"input_ids": torch.tensor([len(e) for e in exs]), "labels": torch.ones(1, 2)}

    return StepFeed(stream, type("B", (), {"skipped": {}})(), collate, lambda s: split.micro_sizes(rank, s),
                    split.passes, prefetch=prefetch, last_step=last_step), threads


def _rows(item):
    return ([[e.row for e in m] for m in item.micro], None if item.peek is None else item.peek["input_ids"].tolist())


@pytest.mark.parametrize("rank", [0, 1])
def test_the_feed_gives_the_same_steps_with_or_without_the_thread(rank):
    """One bin a step over two ranks: each rank trains every other step, and the rank without a bin in the
    first step gets a look at its next bin (``peek``) for its zero-weight pass, the stream put back."""
    split = StepSplit(1, 2, 1)
    got, states = {}, {}
    for prefetch in (False, True):
        feed, threads = _feed(prefetch, rank, split, last_step=6)
        trained, steps = False, []
        for s in range(4):
            item = feed.get(s, trained)
            trained = trained or bool(item.batches) or item.peek is not None
            steps.append(_rows(item))
            assert feed.state.to_dict() == item.state.to_dict()
        feed.close()  # the thread had started on step 4: the stream goes back to after step 3
        got[prefetch], states[prefetch] = steps, feed.stream.state.to_dict()
        assert ("sft-prefetch" in threads) == prefetch  # rows built on the thread when on
        assert feed.state.to_dict() == states[prefetch]
    assert got[True] == got[False]
    assert states[True] == states[False]
    assert (got[False][0][1] is not None) == (rank == 1)  # rank 1 has no bin in step 0: it peeks


def test_an_error_while_preparing_reaches_the_training_thread():
    feed, _ = _feed(True, 0, StepSplit(1, 1, 1), fail_at="r4")
    with pytest.raises(OSError, match="unreadable row"):
        for s in range(20):
            feed.get(s, True)
    feed.close()


def _cfg(world, tiny_dir, out, **kw):
    over = [f"model_path={tiny_dir}", f"output_dir={out}", f"data.0.path={world}/local/paravt_sft_synth.parquet",
            "max_length=1024", "logging.wandb_project=null", "logging.progress=false", "global_batch_size=2",
            "max_steps=4", "save_every=2"]
    return load_config(SFTConfig, "configs/sft/tiny.yaml", over + [f"{k}={v}" for k, v in kw.items()])


def test_prefetch_trains_the_same_batches_in_the_same_order_to_the_same_losses(world, tiny_dir, tmp_path):
    from paravt.sft.trainer import SFTTrainer

    assert _cfg(world, tiny_dir, tmp_path).prefetch is None
    assert SFTTrainer(_cfg(world, tiny_dir, tmp_path / "default")).feed.prefetch is False  # CPU: off by default
    seen, losses, cursors = {}, {}, {}
    for prefetch in (False, True):
        tr = SFTTrainer(_cfg(world, tiny_dir, tmp_path / str(prefetch), prefetch=str(prefetch).lower()))
        assert tr.feed.prefetch is prefetch
        seen[prefetch], losses[prefetch], where = [], [], []
        plain_pass, plain_prepare = tr._pass, tr.feed._prepare

        def record(batch, scale, _seen=seen[prefetch], _pass=plain_pass):
            _seen.append({k: v.clone() for k, v in batch.items()})
            return _pass(batch, scale)

        def prepare(step, trained, _where=where, _prepare=plain_prepare):
            _where.append(threading.current_thread().name)
            return _prepare(step, trained)

        tr._pass, tr.feed._prepare = record, prepare
        tr.train(until=2)  # stops after step 2 (checkpointed) with step 3 prefetched when on
        cursors[prefetch] = torch.load(tmp_path / str(prefetch) / "checkpoints/step_000002/rank0.pt",
                                       weights_only=False)["stream"]
        assert tr.stream.state.to_dict() == cursors[prefetch]  # the feed closed: the stream at the steps trained
        tr = SFTTrainer(_cfg(world, tiny_dir, tmp_path / str(prefetch), prefetch=str(prefetch).lower()))
        tr._pass = record
        tr.train()  # resumes at step 2
        import json
        rec = [json.loads(x) for x in (tmp_path / str(prefetch) / "metrics.jsonl").read_text().splitlines()]
        losses[prefetch] = [(r["step"], r["loss"], r["supervised_tokens"]) for r in rec]
        assert set(where) == ({"sft-prefetch"} if prefetch else {"MainThread"})
    assert cursors[True] == cursors[False]
    assert len(seen[True]) == len(seen[False]) == 8  # 4 steps of 2 packs
    for a, b in zip(seen[False], seen[True], strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert losses[True] == losses[False]
