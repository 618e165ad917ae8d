"""global_batch_size bins (rows) per optimizer step over all ranks: each rank's share and the passes a step
follow from it and the world size, a step holds the same rows on one rank or two (the slot rule), the 8B
recipe trains 32 packs a step (4 per GPU on 8 GPUs, as released), the step's loss is the mean over the
supervised tokens of all its packs, the metrics report the step's tokens, the learning-rate schedule still
counts optimizer steps, and a combination the trainer cannot run is one line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from paravt.core.config import load_config
from paravt.data.schema import SFTRow
from paravt.sft.config import SFTConfig, StepSplit
from paravt.sft.data import Example, PackedStream
from paravt.sft.trainer import SFTTrainer, lr_lambda, token_ce_sum


def _fake(lengths):
    rows = [SFTRow(messages=[{"role": "assistant", "content": "x"}], videos=[], where=f"r{i}")
            for i in range(len(lengths))]
    size = {f"r{i}": n for i, n in enumerate(lengths)}
    return rows, lambda row: Example([1] * size[row.where], [1] * size[row.where], None, row.where)


def _stream(rows, build, max_length, batch_size=1, pack=True, rank=0, world_size=1):
    return PackedStream(rows, build, seed=0, max_length=max_length, pack=pack, batch_size=batch_size,
                        rank=rank, world_size=world_size)


def _step_rows(streams, split, step):
    """The rows each rank trains in step ``step``, by rank."""
    return [[e.row for m in s.step_batches(split.micro_sizes(r, step)) for e in m] for r, s in enumerate(streams)]


def test_a_step_takes_its_share_of_the_global_batch_the_same_bins():
    rows, build = _fake([30, 50, 20, 70, 10, 40, 60, 25, 35, 45] * 3)
    split = StepSplit(2, 1, 1)
    two, one = _stream(rows, build, 100), _stream(rows, build, 100)
    for s in range(3):
        step = two.step_batches(split.micro_sizes(0, s))
        assert len(step) == 2 and all(sum(len(e) for e in p) <= 100 for p in step)
        assert [[e.row for e in p] for p in step] == [[e.row for e in one.next_batch()] for _ in range(2)]
    assert two.state.to_dict() == one.state.to_dict()  # the cursor a checkpoint keeps
    padded = StepSplit(7, 1, 3, "rows")  # 7 rows, at most 3 a pass: spread as evenly as three passes allow
    assert padded.passes == 3 and padded.micro_sizes(0, 0) == [3, 2, 2]
    assert [len(m) for m in _stream(rows, build, 100, 3, pack=False).step_batches(padded.micro_sizes(0, 0))] == [3, 2, 2]


@pytest.mark.parametrize("pack", [True, False])
def test_a_step_holds_the_same_rows_on_one_rank_or_two(pack):
    """Slot k of the run is rank (k mod world size)'s next bin: global_batch_size=3 trains the same rows
    each step on one rank as on two (bins of one row each here: any two rows overflow max_length), the
    second rank's spare pass rotating between the ranks."""
    rows, build = _fake([60, 75, 90, 55, 80, 95, 70, 65, 85, 100, 52, 77] * 2)
    one = StepSplit(3, 1, 1, "bins" if pack else "rows")
    two = StepSplit(3, 2, 1, "bins" if pack else "rows")
    single = [_stream(rows, build, 100, pack=pack)]
    pair = [_stream(rows, build, 100, pack=pack, rank=r, world_size=2) for r in range(2)]
    for step in range(6):
        a, b = _step_rows(single, one, step), _step_rows(pair, two, step)
        assert sorted(a[0]) == sorted(b[0] + b[1]) and len(a[0]) == 3
        assert [len(x) for x in b] == ([2, 1] if step % 2 == 0 else [1, 2])
    assert (one.passes, one.fillers, two.passes, two.fillers) == (3, 0, 2, 1)
    assert pair[0].state.to_dict() == pair[1].state.to_dict()  # both ranks read their shares at the same pace


def test_the_8b_recipe_trains_32_packs_a_step_4_per_gpu_on_8_gpus(tmp_path):
    cfg = load_config(SFTConfig, "configs/sft/qwen3vl_8b.yaml", [f"data_root={tmp_path}"])
    assert cfg.packing and cfg.max_length == 8192 and cfg.global_batch_size == 32 and cfg.per_device_batch_size is None
    assert cfg.optim.vision_lr_scale == 1.0 and not cfg.optim.freeze_lm_head  # every parameter trains
    eight, sixteen = cfg.step_split(8), cfg.step_split(16)
    assert [eight.count(r, 0) for r in range(8)] == [4] * 8 and eight.passes == 4 and not eight.fillers
    assert [sixteen.count(r, 3) for r in range(16)] == [2] * 16 and sixteen.passes == 2  # two nodes: the same 32
    rows, build = _fake([3000, 5000, 2500, 7000, 1200, 4100] * 4)
    stream = PackedStream(rows, build, cfg.seed, cfg.max_length, cfg.packing, eight.micro)
    step = stream.step_batches(eight.micro_sizes(0, 0))
    assert len(step) == 4 and all(sum(len(e) for e in p) <= 8192 for p in step)
    tiny = load_config(SFTConfig, "configs/sft/tiny.yaml", ["model_path=m", "data=[{path: x}]"])
    assert tiny.global_batch_size == 1 and tiny.step_split(1).passes == 1  # the tiny recipes keep one pack a step
    assert load_config(SFTConfig, "configs/sft/tiny_perception.yaml", ["model_path=m"]).global_batch_size == 1
    assert tiny.step_split(2).fillers == 1  # on two ranks still one pack: the other rank's pass has no weight


def test_a_packed_run_with_global_batch_size_2_trains_two_packs_a_step(world, tiny_dir, tmp_path):
    over = [f"model_path={tiny_dir}", f"data.0.path={world}/local/paravt_sft_synth.parquet", "max_length=1024",
            "logging.wandb_project=null", "logging.progress=false", "save_every=100", "max_steps=3",
            "optim.warmup_ratio=0.5"]
    cfg = load_config(SFTConfig, "configs/sft/tiny.yaml", over + [f"output_dir={tmp_path / 'two'}",
                                                                   "global_batch_size=2"])
    tr = SFTTrainer(cfg)
    # what the first step holds, from a one-pack-a-step stream over the same rows and seed
    ref = PackedStream(tr.stream.rows, tr.builder, cfg.seed, cfg.max_length, True, 1)
    packs = [ref.next_batch() for _ in range(2)]
    with torch.no_grad():  # one forward over both packs' sequences in one row: the step's loss
        ce, n = token_ce_sum(tr.model, tr._collate(packs[0] + packs[1]))
    tr.train()
    rec = [json.loads(x) for x in (tmp_path / "two/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rec] == [1, 2, 3] and all(r["micro_batches"] == 2 and r["filler_passes"] == 0 for r in rec)
    assert rec[0]["tokens_per_step"] == sum(len(e) for p in packs for e in p)
    assert rec[0]["rows_per_step"] == sum(len(p) for p in packs) and rec[0]["supervised_tokens"] == n
    assert rec[0]["loss"] == pytest.approx(float(ce) / n, rel=1e-4)
    for _ in range(4):
        ref.next_batch()
    assert tr.stream.state.to_dict() == ref.state.to_dict()  # three steps took six packs
    f = lr_lambda(cfg)  # the schedule counts optimizer steps, not packs
    assert [r["lr"] for r in rec] == pytest.approx([cfg.optim.lr * f(s) for s in range(1, 4)])


def test_a_combination_the_trainer_cannot_run_is_one_line(tmp_path):
    """DeepSpeed here steps after one micro-batch per rank: the 8B recipe's 32 packs on 8 GPUs (4 each) is
    refused at start-up naming the fix, and 8 packs on 8 GPUs runs; per_device_batch_size is the padded
    micro-batch, refused with packing (each bin is its own pass) with the setting to use instead."""
    base = ["model_path=m", f"output_dir={tmp_path}", "data.0.path=x.parquet"]
    ds = load_config(SFTConfig, "configs/sft/qwen3vl_8b.yaml", base + ["dist.strategy=deepspeed"])
    with pytest.raises(ValueError, match=r"^dist.strategy=deepspeed trains one micro-batch per rank .* "
                                         r"global_batch_size=32 bins over 8 rank\(s\) gives 4: set global_batch_size=8"):
        ds.step_split(8)
    assert ds.step_split(32).passes == 1
    load_config(SFTConfig, "configs/sft/qwen3vl_8b.yaml", base + ["dist.strategy=deepspeed", "global_batch_size=8"]).step_split(8)
    with pytest.raises(ValueError, match=r"^per_device_batch_size=4 is the rows of one padded micro-batch .* "
                                         r"set global_batch_size"):
        load_config(SFTConfig, "configs/sft/qwen3vl_8b.yaml", base + ["per_device_batch_size=4"])
    for bad, fragment in (("global_batch_size=0", "global_batch_size must be >= 1"),
                          ("per_device_batch_size=0", "per_device_batch_size must be >= 1 or null")):
        with pytest.raises(ValueError, match=fragment):
            load_config(SFTConfig, "configs/sft/tiny.yaml", base + ["packing=false", bad])


@pytest.mark.parametrize("override, message", [
    ("video.decoder=ffmpeg", "video.decoder must be one of pyav | decord, got 'ffmpeg'"),
    ("optim.scheduler=linear", "optim.scheduler must be one of cosine | constant, got 'linear'"),
    ("dist.strategy=horovod", "dist.strategy must be one of fsdp2 | deepspeed | ddp | none, got 'horovod'"),
])
def test_a_bad_choice_is_one_line_naming_the_options(override, message):
    with pytest.raises(ValueError) as e:
        load_config(SFTConfig, None, ["model_path=m", "data=[{path: x}]", override])
    assert str(e.value) == message


def test_run_sft_checks_the_split_for_its_ranks_before_torchrun(world, tiny_dir, tmp_path):
    """run_sft.sh's preflight splits global_batch_size over NPROC x NNODES ranks: DeepSpeed with two packs
    per rank on two ranks is one line naming the fix and exit 2, and torchrun never starts."""
    root, b = Path(__file__).resolve().parents[2], tmp_path / "bin"
    b.mkdir()
    (b / "torchrun").write_text(f"#!/usr/bin/env bash\ntouch {tmp_path / 'started'}\n")
    (b / "torchrun").chmod(0o755)
    venv = root / ".venv-cpu"  # the launcher then activates no venv of its own: the stand-in stays first on PATH
    env = {**os.environ, "NPROC": "2", "PATH": f"{b}:{venv}/bin:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    r = subprocess.run(["bash", "scripts/run_sft.sh", "configs/sft/tiny.yaml", f"model_path={tiny_dir}",
                        f"output_dir={tmp_path / 'o'}", f"data.0.path={world}/local/paravt_sft_synth.parquet",
                        "dist.strategy=deepspeed", "global_batch_size=4"],
                       cwd=root, env=env, capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("run_sft.sh: dist.strategy=deepspeed trains one micro-batch per rank") \
        and "over 2 rank(s) gives 2: set global_batch_size=2" in lines[0]
    assert not (tmp_path / "started").exists()
