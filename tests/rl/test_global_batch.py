"""A step's global batch does not depend on the trainer world size: the split of a step's samples over
the ranks (by tokens, uneven counts, zero-mask padding), and the same step's weights on 1, 2 and 3
gloo ranks (FSDP2 and trainer.strategy=none, one and two PPO minibatches, GTR's NLL term)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from paravt.rl.packing import equalize, padding_sample, split_by_tokens

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class S:
    n: int
    images: list = field(default_factory=list)
    loss_mask: list = None
    advantage: float = 1.0
    kind: str = "main"
    think_mask: list | None = None

    def __post_init__(self):
        self.input_ids = [0] * self.n
        self.loss_mask = self.loss_mask or [1] * self.n


def _sizes(parts):
    return [[s.n for s in p] for p in parts]


def test_split_by_tokens_balances_tokens_in_order_with_uneven_counts():
    sizes = [30, 5, 5, 5, 5, 20, 10, 10, 40, 2, 2, 2]
    samples = [S(n) for n in sizes]
    for parts in (1, 2, 3, 4, 5, 7):
        got = split_by_tokens(samples, parts)
        assert len(got) == parts and [s for p in got for s in p] == samples  # every sample once, in order
        mean = sum(sizes) / parts
        assert all(abs(sum(s.n for s in p) - mean) <= max(sizes) for p in got), (parts, _sizes(got))
    assert _sizes(split_by_tokens(samples, 3)) == [[30, 5, 5, 5], [5, 20, 10, 10], [40, 2, 2, 2]]
    assert _sizes(split_by_tokens([S(10)] * 4, 3)) == [[10], [10, 10], [10]]  # 4 samples on 3 ranks
    assert _sizes(split_by_tokens([S(10), S(10)], 3)) == [[10], [], [10]]  # fewer samples than ranks
    assert split_by_tokens([], 2) == [[], []]
    with pytest.raises(ValueError, match="0 ranks"):
        split_by_tokens(samples, 0)


def test_equalize_splits_packs_then_pads_with_zero_mask_copies():
    a, b, c = S(4), S(5), S(6)
    assert _sizes(equalize([[a, b, c]], 2, None)) == [[4], [5, 6]]
    pad = padding_sample([S(9, ["img"]), S(3), S(7, ["img"])])
    assert pad.n == 7 and pad.images == ["img"] and pad.kind == "pad" and not any(pad.loss_mask)
    got = equalize([[a]], 3, pad)
    assert _sizes(got) == [[4], [7], [7]] and got[1][0] is pad
    assert equalize([], 2, pad) == [[pad], [pad]]  # a rank with no sample of this minibatch
    assert padding_sample([S(5), S(2)]).n == 2  # no images anywhere: the shortest


def _run(world_size: int, tiny_dir, world, out: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc_per_node={world_size}", str(ROOT / "tests/rl/global_batch_script.py"),
                        str(tiny_dir), str(world), str(out)],
                       capture_output=True, text=True, timeout=900, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-4000:]
    return torch.load(out, weights_only=False)


@pytest.mark.launcher  # three torchrun runs (1, 2, 3 gloo ranks): CI's launcher group
def test_the_same_step_on_one_two_and_three_gloo_ranks(world, tiny_dir, tmp_path):
    """Minibatches come from the global list, each split over the ranks by tokens, and the loss is divided
    by the step's policy tokens, so the weights after a step are those of one rank whatever the world size:
    FSDP2 (which averages gradients) and trainer.strategy=none (averaged by the trainer), packed and one
    forward per sample, with ppo_minibatches=2. Every rank runs as many forwards (padding where short)."""
    res = {w: _run(w, tiny_dir, world, tmp_path / f"w{w}.pt") for w in (1, 2, 3)}
    one = res[1]
    for name, case in one.items():
        assert case["agree"] and any(d.abs().max() > 0 for d in case["delta"].values()), name
        for w in (2, 3):
            got = res[w][name]
            assert got["agree"], (name, w)
            assert len(set(got["forwards"])) == 1, (name, w, got["forwards"])  # the same count on every rank
            for k, d in case["delta"].items():
                err = float((got["delta"][k] - d).abs().max())
                # a delta is the difference of two fp32 weights: where they are near 1 (the norms' weights) it
                # is resolved only to fp32's spacing there (1.2e-7), whatever its size, so the bound allows
                # one spacing on top of the relative agreement
                assert err <= 3e-4 * float(d.abs().max()) + 1.2e-7, (name, w, k, err, float(d.abs().max()))
            for k in ("ppo/loss", "ppo/tokens", "ppo/kl", "ppo/kl_reward", "ppo/entropy", "ppo/clip_ratio",
                      "ppo/behav_dropped_ratio", "ppo/grad_norm", "rollout/logprob_gap", "ppo/entropy_think",
                      "gtr/nll", "gtr/sft_tokens", "rollout_corr/behav_weight_mean"):
                if k in case["metrics"]:
                    assert got["metrics"][k] == pytest.approx(case["metrics"][k], rel=1e-4, abs=1e-7), (name, w, k)
    assert one["gtr_none"]["metrics"]["gtr/sft_tokens"] == 8 and one["k1_token"]["metrics"]["ppo/kl_reward"] != 0
    assert one["k1_token"]["metrics"]["ppo/behav_dropped_ratio"] > 0  # the capped tokens took part
    # one forward per sample, 2-3 samples a minibatch on 3 ranks: padding forwards ran (12 against 10 samples' worth)
    assert sum(res[3]["mb2_unpacked"]["forwards"]) > sum(one["mb2_unpacked"]["forwards"])
