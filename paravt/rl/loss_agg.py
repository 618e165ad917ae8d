"""How a step's per-token PPO losses become one number (``grpo.loss_agg``).

The release (EvolvingLMMs-Lab/ParaVT, AReaL's ``ppo_actor_loss_fn`` under ``train_batch`` with
``loss_weight_fn = loss_mask.count_nonzero()``) takes each micro-batch's token mean and weights it by
its token count over the total of every micro-batch and data-parallel rank: the loss summed over every
policy token of the step, divided by their count. That is ``token-mean``, the default. The other modes
come from verl / TRL / Dr. GRPO:

* ``token-mean``           Σ_i Σ_t l_it / Σ_i n_i                  (long sequences weigh more)
* ``seq-mean-token-mean``  (1/N) Σ_i (Σ_t l_it / n_i)              (each sequence weighs the same)
* ``seq-mean-token-sum``   (1/N) Σ_i (Σ_t l_it / norm)             (Dr. GRPO: a constant normaliser,
  no length bias; ``norm`` = ``grpo.loss_agg_norm`` or the recipe's ``max_new_tokens``)

with n_i the policy tokens of sequence i (those over the behaviour-weight cap included, as the release
counts them) and N the step's sequences with at least one policy token. The denominators Σ_i n_i and
N are the whole step's, over all ranks (every rank holds the step's sample list), so each rank's
backward of ``numerator(its samples) / denominator`` sums to the global loss at any world size.
Each mode below returns the numerator of one pack of samples; :func:`step_denominator` the step's
denominator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Literal, Sequence

if TYPE_CHECKING:  # the recipe's config imports this module: --help answers before torch loads
    import torch

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]


def token_mean(loss_sums: Sequence[torch.Tensor], n_tokens: Sequence[int], norm: float):
    """Σ_i Σ_t l_it (divided later by the step's policy tokens)."""
    total = 0.0
    for loss in loss_sums:
        total = total + loss
    return total


def seq_mean_token_mean(loss_sums: Sequence[torch.Tensor], n_tokens: Sequence[int], norm: float):
    """Σ_i (Σ_t l_it / n_i) (divided later by the step's sequences); a sequence with no policy token adds 0."""
    total = 0.0
    for loss, n in zip(loss_sums, n_tokens):
        total = total + loss / max(n, 1)
    return total


def seq_mean_token_sum(loss_sums: Sequence[torch.Tensor], n_tokens: Sequence[int], norm: float):
    """Σ_i (Σ_t l_it / norm) (divided later by the step's sequences)."""
    total = 0.0
    for loss in loss_sums:
        total = total + loss / norm
    return total


AGGREGATORS: dict[str, Callable] = {"token-mean": token_mean, "seq-mean-token-mean": seq_mean_token_mean,
                                    "seq-mean-token-sum": seq_mean_token_sum}


def sample_tokens(s) -> int:
    """The policy tokens of one sample (position t of ``loss_mask[1:]`` predicts token t+1)."""
    return sum(s.loss_mask[1:])


def step_denominator(mode: str, samples: Sequence) -> int:
    """The step's policy tokens (``token-mean``) or its sequences that have policy tokens (the sequence modes)."""
    if mode == "token-mean":
        return sum(sample_tokens(s) for s in samples)
    return sum(1 for s in samples if sample_tokens(s) > 0)


def aggregate(mode: str, loss_sums: Sequence[torch.Tensor], n_tokens: Sequence[int], denominator: float,
              norm: float):
    """The loss of ``loss_sums`` (each a sequence's Σ_t l_t, with ``n_tokens`` policy tokens) under ``mode``,
    over a step whose denominator (:func:`step_denominator`, all ranks) is ``denominator``."""
    return AGGREGATORS[mode](loss_sums, n_tokens, norm) / max(denominator, 1)


def check_loss_agg_norm(norm: float | None) -> None:
    if norm is not None and not norm > 0:
        raise ValueError(f"grpo.loss_agg_norm must be > 0 or null (the recipe's max_new_tokens), got {norm}")
