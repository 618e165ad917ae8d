"""The behaviour weight w = exp(prox − behav) the decoupled loss applies: its statistics (what the
numerics gate reads) and the opt-in rollout correction (truncation at C, rejection outside [1/C, C])."""

from __future__ import annotations

import math

import pytest
import torch

from paravt.rl.config import GRPOConfig
from paravt.rl.grpo import WeightStats, ppo_token_loss, rollout_correction


def _seq(log_w, adv=1.0):
    lw = torch.tensor(log_w, dtype=torch.float32)
    behav = torch.full_like(lw, -2.0)
    prox = behav + lw
    logp = prox.clone().requires_grad_(True)
    return logp, prox, behav, torch.full_like(lw, adv), torch.ones_like(lw, dtype=torch.bool)


def test_default_loss_is_unchanged_by_the_correction_code():
    logp, prox, behav, adv, mask = _seq([0.1, -0.3, 2.0, 0.0])  # w = 7.4 at token 2: over the cap of 5
    out = ppo_token_loss(logp, prox, behav, None, adv, mask, 0.2, 0.0, 5.0)
    w = torch.exp(prox - behav)
    keep = w <= 5.0
    assert torch.isclose(out.loss_sum, -(w * keep).sum()) and out.dropped == 1 and out.n_tokens == 3
    assert torch.allclose(out.log_w, prox - behav) and out.truncated == out.rejected == 0


def test_token_truncation_caps_each_weight_at_c():
    lw = [math.log(3.0), math.log(0.5), 0.0]
    w, keep, trunc, rej = rollout_correction(torch.tensor(lw), torch.ones(3, dtype=torch.bool), "token", None, 2.0)
    assert torch.allclose(w, torch.tensor([2.0, 0.5, 1.0])) and keep.all() and trunc == 1 and rej == 0


def test_sequence_truncation_uses_the_product_of_the_weights():
    lw = torch.tensor([math.log(1.5), math.log(1.5), math.log(0.9)])  # product 2.025 > C = 2
    w, keep, trunc, _ = rollout_correction(lw, torch.ones(3, dtype=torch.bool), "sequence", None, 2.0)
    assert torch.allclose(w, torch.full((3,), 2.0)) and trunc == 3
    w, _, trunc, _ = rollout_correction(lw, torch.ones(3, dtype=torch.bool), "sequence", None, 3.0)
    assert torch.allclose(w, torch.full((3,), 2.025)) and trunc == 0


def test_rejection_masks_tokens_or_sequences_outside_the_band():
    lw = torch.tensor([math.log(2.5), math.log(0.3), 0.1, 0.0])
    mask = torch.tensor([True, True, True, False])
    _, keep, _, rej = rollout_correction(lw, mask, None, "token", 2.0)
    assert keep.tolist() == [False, False, True, False] and rej == 2
    _, keep, _, rej = rollout_correction(lw, mask, None, "sequence", 2.0)  # geometric mean 0.93: inside
    assert keep.tolist() == [True, True, True, False] and rej == 0
    _, keep, _, rej = rollout_correction(torch.tensor([1.0, 1.0]), torch.ones(2, dtype=torch.bool), None, "sequence", 2.0)
    assert not keep.any() and rej == 2


def test_the_loss_applies_the_corrected_weight():
    logp, prox, behav, adv, mask = _seq([math.log(3.0), 0.0, math.log(0.2)])
    out = ppo_token_loss(logp, prox, behav, None, adv, mask, 0.2, 0.0, 5.0, is_level="token", rs_level="token",
                         corr_cap=2.5)
    # token 0: w 3 -> rejected (outside [0.4, 2.5]); token 2: w 0.2 -> rejected; token 1 kept with w 1
    assert out.rejected == 2 and out.truncated == 1 and out.n_tokens == 1
    assert torch.isclose(out.loss_sum, torch.tensor(-1.0))


def test_weight_stats_quantiles_share_over_cap_and_ess():
    g = torch.Generator().manual_seed(0)
    lw = torch.randn(20000, generator=g, dtype=torch.float64) * 0.5
    a, b = WeightStats(), WeightStats()
    a.add(lw[:7000], 5.0)
    b.add(lw[7000:], 5.0)
    m = a.metrics(a.vector() + b.vector())  # two ranks' vectors summed, as the all-reduce does
    w = lw.exp()
    assert m["rollout_corr/behav_weight_mean"] == pytest.approx(float(w.mean()), rel=1e-9)
    assert m["rollout_corr/behav_weight_over_cap"] == pytest.approx(float((w > 5).double().mean()), abs=1e-12)
    assert m["rollout_corr/behav_weight_ess"] == pytest.approx(float(w.sum() ** 2 / (w.numel() * (w * w).sum())))
    for q, key in ((0.01, "p1"), (0.5, "p50"), (0.99, "p99")):
        want = float(torch.quantile(w, q))
        assert abs(math.log(m[f"rollout_corr/behav_weight_{key}"]) - math.log(want)) <= 0.002, key
    one = WeightStats()
    one.add(torch.zeros(10), 5.0)
    mm = one.metrics()
    assert mm["rollout_corr/behav_weight_ess"] == pytest.approx(1.0) and mm["rollout_corr/behav_weight_p50"] == \
        pytest.approx(1.0, abs=0.0011)


def test_config_checks_the_correction_knobs():
    assert GRPOConfig().rollout_is is None and GRPOConfig().rollout_rs is None  # off by default, as released
    with pytest.raises(ValueError, match="rollout_is"):
        GRPOConfig(rollout_is="geometric")
    with pytest.raises(ValueError, match="rollout_corr_cap"):
        GRPOConfig(rollout_rs="token", rollout_corr_cap=1.0)
    with pytest.raises(ValueError, match="behav_imp_weight_cap"):
        GRPOConfig(rollout_is="token", behav_imp_weight_cap=None)
