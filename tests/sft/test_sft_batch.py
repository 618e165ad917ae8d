"""per_device_batch_size packs per rank per optimizer step: the stream hands a step that many packs (the
same bins one pack at a time would give), the 8B recipe trains four per GPU as the release does, the
step's loss is the mean over the supervised tokens of all its packs, the metrics report the step's
tokens, and the learning-rate schedule still counts optimizer steps."""

from __future__ import annotations

import json

import pytest
import torch

from paravt.core.config import load_config
from paravt.data.schema import SFTRow
from paravt.sft.config import SFTConfig
from paravt.sft.data import Example, PackedStream
from paravt.sft.trainer import SFTTrainer, lr_lambda, token_ce_sum


def _fake(lengths):
    rows = [SFTRow(messages=[{"role": "assistant", "content": "x"}], videos=[], where=f"r{i}")
            for i in range(len(lengths))]
    size = {f"r{i}": n for i, n in enumerate(lengths)}
    return rows, lambda row: Example([1] * size[row.where], [1] * size[row.where], None, row.where)


def _stream(rows, build, max_length, batch_size, pack=True):
    return PackedStream(rows, build, seed=0, max_length=max_length, pack=pack, batch_size=batch_size)


def test_a_step_takes_per_device_batch_size_packs_the_same_bins():
    rows, build = _fake([30, 50, 20, 70, 10, 40, 60, 25, 35, 45] * 3)
    two = _stream(rows, build, 100, batch_size=2)
    one = _stream(rows, build, 100, batch_size=1)
    for _ in range(3):
        step = two.step_batches()
        assert len(step) == 2 and all(sum(len(e) for e in p) <= 100 for p in step)
        assert [[e.row for e in p] for p in step] == [[e.row for e in one.next_batch()] for _ in range(2)]
    assert two.state.to_dict() == one.state.to_dict()  # the cursor a checkpoint keeps
    assert len(_stream(rows, build, 100, batch_size=2).step_batches(grad_accum=3)) == 6
    padded = _stream(rows, build, 100, batch_size=3, pack=False).step_batches(grad_accum=2)
    assert [len(m) for m in padded] == [3, 3]


def test_the_8b_recipe_trains_four_packs_per_gpu_per_step(tmp_path):
    cfg = load_config(SFTConfig, "configs/sft/qwen3vl_8b.yaml", [f"data_root={tmp_path}"])
    assert cfg.packing and cfg.max_length == 8192 and cfg.per_device_batch_size == 4 and cfg.grad_accum == 1
    assert cfg.optim.vision_lr_scale == 1.0 and not cfg.optim.freeze_lm_head  # every parameter trains
    rows, build = _fake([3000, 5000, 2500, 7000, 1200, 4100] * 4)
    stream = PackedStream(rows, build, cfg.seed, cfg.max_length, cfg.packing, cfg.per_device_batch_size)
    step = stream.step_batches(cfg.grad_accum)
    assert len(step) == 4 and all(sum(len(e) for e in p) <= 8192 for p in step)
    tiny = load_config(SFTConfig, "configs/sft/tiny.yaml", ["model_path=m", "data=[{path: x}]"])
    assert tiny.per_device_batch_size == 1  # the tiny recipes keep one pack a step
    assert load_config(SFTConfig, "configs/sft/tiny_perception.yaml", ["model_path=m"]).per_device_batch_size == 1


def test_a_packed_run_with_per_device_batch_size_2_trains_two_packs_a_step(world, tiny_dir, tmp_path):
    over = [f"model_path={tiny_dir}", f"data.0.path={world}/local/paravt_sft_synth.parquet", "max_length=1024",
            "logging.wandb_project=null", "logging.progress=false", "save_every=100", "max_steps=3",
            "optim.warmup_ratio=0.5"]
    cfg = load_config(SFTConfig, "configs/sft/tiny.yaml", over + [f"output_dir={tmp_path / 'two'}",
                                                                   "per_device_batch_size=2"])
    tr = SFTTrainer(cfg)
    # what the first step holds, from a one-pack-a-step stream over the same rows and seed
    ref = PackedStream(tr.stream.rows, tr.builder, cfg.seed, cfg.max_length, True, 1)
    packs = [ref.next_batch() for _ in range(2)]
    with torch.no_grad():  # one forward over both packs' sequences in one row: the step's loss
        ce, n = token_ce_sum(tr.model, tr._collate(packs[0] + packs[1]))
    tr.train()
    rec = [json.loads(x) for x in (tmp_path / "two/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rec] == [1, 2, 3] and all(r["micro_batches"] == 2 for r in rec)
    assert rec[0]["tokens_per_step"] == sum(len(e) for p in packs for e in p)
    assert rec[0]["rows_per_step"] == sum(len(p) for p in packs) and rec[0]["supervised_tokens"] == n
    assert rec[0]["loss"] == pytest.approx(float(ce) / n, rel=1e-4)
    for _ in range(4):
        ref.next_batch()
    assert tr.stream.state.to_dict() == ref.state.to_dict()  # three steps took six packs
    f = lr_lambda(cfg)  # the schedule counts optimizer steps, not packs
    assert [r["lr"] for r in rec] == pytest.approx([cfg.optim.lr * f(s) for s in range(1, 4)])


def test_deepspeed_with_several_micro_batches_a_step_is_refused_with_one_line(tmp_path):
    """The DeepSpeed engine here steps after one micro-batch; a recipe giving more (the 8B recipe's four
    packs) is one line at start-up, not a silently different update."""
    base = ["model_path=m", f"output_dir={tmp_path}", "data.0.path=x.parquet", "dist.strategy=deepspeed"]
    with pytest.raises(ValueError, match=r"dist.strategy=deepspeed trains one micro-batch .* gives 4 "):
        load_config(SFTConfig, "configs/sft/qwen3vl_8b.yaml", base)
    load_config(SFTConfig, "configs/sft/qwen3vl_8b.yaml", base + ["per_device_batch_size=1"])
