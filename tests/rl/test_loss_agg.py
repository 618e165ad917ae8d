"""grpo.loss_agg: each aggregation on a batch computed by hand, over any split of the step across ranks,
and the default (token-mean, the release's) equal to the trainer's objective bit for bit."""

from __future__ import annotations

import re

import pytest
import torch

from paravt.rl.config import GRPOConfig
from paravt.rl.grpo import StepStats, gtr_objective, policy_tokens, sample_loss
from paravt.rl.loss_agg import AGGREGATORS, aggregate, sample_tokens, step_denominator
from paravt.rl.rollout import Sample


def _sample(mask: list[int]) -> Sample:
    """A sample whose loss reads ``mask`` (loss_mask[1:]); ids and logprobs are placeholders."""
    n = len(mask) + 1
    return Sample(list(range(n)), [0] + mask, [0.0] * n, None, 0.0)


# Three sequences: per-token losses (policy tokens only) and their counts.
#   A: 1, 2, 3      (3 tokens, sum 6)
#   B: 4            (1 token,  sum 4)
#   C: 0.5, 1.5     (2 tokens, sum 2)
# and a padding sequence with no policy token (sum 0).
SUMS = [torch.tensor(6.0), torch.tensor(4.0), torch.tensor(2.0), torch.tensor(0.0)]
TOKENS = [3, 1, 2, 0]
SAMPLES = [_sample([1, 1, 1, 0]), _sample([0, 1]), _sample([1, 1]), _sample([0, 0, 0])]


def test_counts_of_the_step():
    assert [sample_tokens(s) for s in SAMPLES] == TOKENS
    assert step_denominator("token-mean", SAMPLES) == 6  # 3 + 1 + 2 policy tokens
    assert step_denominator("seq-mean-token-mean", SAMPLES) == 3  # the padding sequence is not counted
    assert step_denominator("seq-mean-token-sum", SAMPLES) == 3


@pytest.mark.parametrize("mode,norm,expected", [
    ("token-mean", 8.0, 2.0),  # (6 + 4 + 2) / 6
    ("seq-mean-token-mean", 8.0, 7 / 3),  # (6/3 + 4/1 + 2/2) / 3 = (2 + 4 + 1) / 3
    ("seq-mean-token-sum", 8.0, 0.5),  # (6/8 + 4/8 + 2/8) / 3 = 1.5 / 3
    ("seq-mean-token-sum", 4.0, 1.0),  # (6/4 + 4/4 + 2/4) / 3 = 3 / 3
])
def test_each_mode_by_hand(mode, norm, expected):
    got = aggregate(mode, SUMS, TOKENS, step_denominator(mode, SAMPLES), norm)
    assert torch.isclose(got, torch.tensor(expected)), (mode, float(got), expected)


@pytest.mark.parametrize("mode", list(AGGREGATORS))
@pytest.mark.parametrize("split", [[[0, 1, 2, 3]], [[0, 3], [1, 2]], [[2], [0], [1, 3]]])
def test_any_split_over_ranks_sums_to_the_whole_step(mode, split):
    """Each rank divides its own numerator by the step's denominator (all ranks): the ranks' losses add up."""
    den = step_denominator(mode, SAMPLES)
    whole = aggregate(mode, SUMS, TOKENS, den, 8.0)
    parts = sum(aggregate(mode, [SUMS[i] for i in r], [TOKENS[i] for i in r], den, 8.0) for r in split)
    assert torch.isclose(parts, whole)


def _random_batch(gen: torch.Generator):
    g = GRPOConfig()
    samples, outs = [], []
    for _ in range(7):
        n = int(torch.randint(3, 40, (1,), generator=gen))
        mask = (torch.rand(n, generator=gen) < 0.7).int().tolist()
        s = Sample(list(range(n + 1)), [0] + mask, [0.0] + (-torch.rand(n, generator=gen)).tolist(), None,
                   float(torch.randn(1, generator=gen)))
        logp = (-torch.rand(n, generator=gen)).requires_grad_()
        prox = logp.detach() + 0.01 * torch.randn(n, generator=gen)
        samples.append(s)
        outs.append((logp, torch.rand(n, generator=gen), prox))
    return g, samples, outs


def test_default_is_the_trainers_token_mean_exactly():
    g, samples, outs = _random_batch(torch.Generator().manual_seed(0))
    assert g.loss_agg == "token-mean"
    losses = [sample_loss(s, logp, ent, prox, None, None, g, 0.0, 1.0, StepStats())
              for s, (logp, ent, prox) in zip(samples, outs)]
    before = 0.0  # the objective as the trainer computed it with no aggregation setting
    for x in losses:
        before = before + x
    before = gtr_objective(before, policy_tokens(samples), 0.0, 0, 1.0)
    norm = g.loss_agg_norm or 2048
    now = gtr_objective(AGGREGATORS[g.loss_agg](losses, [sample_tokens(s) for s in samples], norm),
                        step_denominator(g.loss_agg, samples), 0.0, 0, 1.0)
    assert torch.equal(now, before)


def test_the_choice_is_checked():
    with pytest.raises(ValueError, match=re.escape("grpo.loss_agg must be one of token-mean | seq-mean-token-mean")):
        GRPOConfig(loss_agg="seq-mean")
    with pytest.raises(ValueError, match="loss_agg_norm"):
        GRPOConfig(loss_agg="seq-mean-token-sum", loss_agg_norm=0)
