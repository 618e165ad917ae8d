"""PARA-GRPO: advantages and the policy loss as functions, of plain tensors and of a step's samples.

Where this departs from plain GRPO (group-normalised outcome reward, clipped surrogate,
KL to a reference), every item a setting of the recipe:

1. **Reward** = R_acc + format_weight · R_fmt + tool_weight · R_tool (:mod:`paravt.rl.rewards`), with the
   format reward anchored at the structural tokens (``anchoring.weight``, ``answer_suffix``)
   and scored on the turns *including* the forced ``<think>\\n`` (``think_prefix``).
2. **nFrames gating**: each prompt's overview budget K ~ Uniform{4,8,16,32,64}, the same K for
   its n rollouts (:mod:`paravt.rl.gating`), so tool calls earn credit where the overview is
   too sparse; off → K = 64.
3. **Multi-turn, multi-agent rollouts**: the loss covers only main-agent tokens (tool
   responses, templates, prompts masked); sub-agent trajectories are optional extra samples
   with their episode's advantage (``include_subagent_in_loss``).
4. **Reward shaping** before normalisation: (r + bias) · scale (bias −0.2, scale 10), clipped
   to ±``reward_clip`` (20), then group mean/std normalisation, then advantage normalisation
   over the whole batch: over every policy token (``adv_norm_level: token``, the release's
   AReaL default, so long sequences weigh more) or over sequences (``sequence``).
5. **Decoupled PPO loss** (asynchronous rollouts up to ``max_staleness`` versions old):
   the ratio is taken against the *proximal* policy (log-probs recomputed by the current
   weights before the update) and each token is weighted by the behaviour importance weight
   exp(logp_prox − logp_behav) against the engine's log-probs; tokens whose weight exceeds
   ``behav_imp_weight_cap`` (5) are dropped from the loss.
6. **Token-level aggregation** (``loss_agg: token-mean``; other modes: :mod:`paravt.rl.loss_agg`): the loss
   summed over every policy token of the batch, divided by their count (across ranks), not averaged per
   sequence first (:func:`gtr_objective`, the objective the trainer backpropagates, + GTR's NLL when on).
7. KL to the frozen reference, coefficient 0.01, in one of two places (``kl_mode``):
   ``reward_k1`` (the release): a per-token reward −β·(log π_behav − log π_ref) whose
   return-to-go over the policy tokens is added to each token's advantage before the batch
   normalisation; ``loss_k3``: the k3 estimator exp(d) − d − 1 added to the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable, Sequence

import torch


def shape_rewards(rewards: torch.Tensor, bias: float = -0.2, scale: float = 10.0,
                  clip: float | None = 20.0) -> torch.Tensor:
    r = (rewards + bias) * scale
    return r.clamp(-clip, clip) if clip is not None else r


def group_normalize(rewards: torch.Tensor, group_ids: Sequence[int], eps: float = 1e-6,
                    use_std: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, per-sample zero-std flag): (r − mean_g) / (std_g + eps) within each group."""
    gid = torch.as_tensor(list(group_ids))
    adv = torch.zeros_like(rewards, dtype=torch.float64)
    zero = torch.zeros_like(rewards, dtype=torch.bool)
    for g in gid.unique():
        m = gid == g
        r = rewards[m].double()
        std = r.std(unbiased=False) if r.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
        centred = r - r.mean()
        adv[m] = centred / (std + eps) if use_std else centred
        zero[m] = bool(std < 1e-8)
    return adv.to(rewards.dtype), zero


def batch_normalize(adv: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if adv.numel() < 2:
        return adv
    std = adv.std(unbiased=False)
    return (adv - adv.mean()) / (std + eps) if std > eps else adv - adv.mean()


def compute_advantages(rewards: Sequence[float], group_ids: Sequence[int], bias: float = -0.2, scale: float = 10.0,
                       group_norm: bool = True, batch_norm: bool = True,
                       clip: float | None = 20.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-sequence advantages: shaped, clipped, group-normalised and (``batch_norm``) normalised
    over the sequences of the batch. With token-level batch normalisation pass
    ``batch_norm=False`` here and use :func:`token_advantages` + :func:`masked_normalize`."""
    r = shape_rewards(torch.tensor(list(rewards), dtype=torch.float64), bias, scale, clip)
    adv, zero = group_normalize(r, group_ids, use_std=group_norm)
    if batch_norm:
        adv = batch_normalize(adv)
    return adv.float(), {"frac_reward_zero_std": float(zero.float().mean()) if zero.numel() else 0.0}


def k1_kl_rewards(behav_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
                  kl_coef: float) -> torch.Tensor:
    """Per-token KL reward of the release: −β · (log π_behav − log π_ref) on policy tokens, 0 elsewhere."""
    return -kl_coef * (behav_logp - ref_logp) * mask.to(behav_logp.dtype)


def token_advantages(seq_adv: float, mask: torch.Tensor, kl_rewards: torch.Tensor | None = None) -> torch.Tensor:
    """Each policy token's advantage: the sequence's (group-normalised) advantage plus the
    return-to-go of the per-token KL rewards from that token on (γ = λ = 1, no critic, so GAE
    reduces to a reverse cumulative sum over the policy tokens)."""
    m = mask.to(torch.float64)
    adv = torch.full_like(m, float(seq_adv))
    if kl_rewards is not None:
        r = kl_rewards.to(torch.float64) * m
        adv = adv + torch.flip(torch.cumsum(torch.flip(r, [0]), 0), [0])
    return adv * m


def masked_moments(advs: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]) -> tuple[float, float, float]:
    """(sum, sum of squares, count) of the advantages on policy tokens: all-reduce these across
    ranks, then :func:`normalize_with`."""
    s = sq = n = 0.0
    for a, m in zip(advs, masks):
        mb = m.bool()
        s += float(a[mb].sum())
        sq += float((a[mb] ** 2).sum())
        n += float(mb.sum())
    return s, sq, n


def normalize_with(adv: torch.Tensor, mask: torch.Tensor, total: float, total_sq: float, count: float,
                   eps: float = 1e-5) -> torch.Tensor:
    """(adv − mean) / (std + eps) over the global policy tokens; 0 off the mask."""
    if count < 1:
        return adv * 0
    mean = total / count
    var = max(total_sq / count - mean * mean, 0.0)
    return ((adv - mean) / (var ** 0.5 + eps)) * mask.to(adv.dtype)


CORR_LEVELS = (None, "token", "sequence")


@dataclass
class LossOutput:
    loss_sum: torch.Tensor  # summed over the policy tokens of this micro-batch (divide by the global count)
    n_tokens: int
    clipped: int
    dropped: int  # tokens over the behaviour-weight cap
    kl_sum: float
    ratio_sum: float
    log_w: torch.Tensor | None = None  # log behaviour weight (prox - behav) of each policy token (detached)
    truncated: int = 0  # rollout correction: tokens whose weight was truncated at C
    rejected: int = 0  # rollout correction: tokens masked because their weight left [1/C, C]


def rollout_correction(log_w: torch.Tensor, mask: torch.Tensor, is_level: str | None, rs_level: str | None,
                       cap: float) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """The opt-in rollout correction of one sequence's behaviour weights w = exp(prox − behav).

    ``is_level`` (truncated importance sampling): ``token`` → min(w_t, C) per token; ``sequence`` →
    min(∏ w_t, C) over the sequence's policy tokens, the same weight for each. ``rs_level`` (rejection):
    ``token`` masks the tokens whose w_t leaves [1/C, C]; ``sequence`` masks the whole sequence when
    its geometric-mean weight exp(mean log w_t) does. Returns (weight per token, keep mask, truncated
    tokens, rejected tokens); with both levels None the weight is w and nothing is masked."""
    if is_level not in CORR_LEVELS or rs_level not in CORR_LEVELS:
        raise ValueError(f"rollout correction levels must be token, sequence or None, got {is_level}, {rs_level}")
    m = mask.bool()
    lw = log_w.detach() * m
    log_c = float(torch.log(torch.tensor(cap, dtype=torch.float64)))
    weight = lw.exp()
    truncated = 0
    if is_level == "token":
        truncated = int(((lw > log_c) & m).sum())
        weight = torch.clamp(lw, max=log_c).exp()
    elif is_level == "sequence":
        total = lw.sum()
        truncated = int(m.sum()) if float(total) > log_c else 0
        weight = torch.full_like(lw, float(torch.clamp(total, max=log_c).exp()))
    keep = m.clone()
    if rs_level == "token":
        keep = keep & (lw.abs() <= log_c)
    elif rs_level == "sequence":
        n = int(m.sum())
        if n and abs(float(lw.sum()) / n) > log_c:
            keep = torch.zeros_like(keep)
    return weight, keep, truncated, int((m & ~keep).sum())


def ppo_token_loss(logp: torch.Tensor, prox_logp: torch.Tensor, behav_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                   adv: torch.Tensor, mask: torch.Tensor, clip_eps: float = 0.2, kl_coef: float = 0.01,
                   behav_cap: float | None = 5.0, token_weight: torch.Tensor | None = None,
                   is_level: str | None = None, rs_level: str | None = None, corr_cap: float = 2.0) -> LossOutput:
    """Decoupled clipped surrogate + k3 KL, summed over masked tokens.

    All tensors are per token of one sequence (same shape); ``adv`` is broadcast per sequence by the caller.
    ``token_weight`` (optional) multiplies each token's surrogate (GTR: c on thought tokens).
    ``is_level`` / ``rs_level`` / ``corr_cap``: the opt-in rollout correction (:func:`rollout_correction`)
    of the behaviour weight, applied where the loss uses it (``behav_cap`` not None)."""
    mask = mask.bool()
    ratio = torch.exp(logp - prox_logp)
    surr1 = ratio * adv
    surr2 = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    pg = -torch.minimum(surr1, surr2)
    keep = mask.clone()
    dropped = truncated = rejected = 0
    log_w = (prox_logp - behav_logp).detach()
    if behav_cap is not None:
        w = torch.exp(log_w)
        over = (w > behav_cap) & mask
        dropped = int(over.sum())
        keep = keep & ~over
        if is_level is not None or rs_level is not None:
            w, rs_keep, truncated, rejected = rollout_correction(log_w, mask, is_level, rs_level, corr_cap)
            keep = keep & rs_keep
        pg = pg * w
    if token_weight is not None:
        pg = pg * token_weight.detach()
    loss = pg
    kl_sum = 0.0
    if ref_logp is not None and kl_coef > 0:
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1  # k3: unbiased, non-negative
        loss = loss + kl_coef * kl
        kl_sum = float((kl.detach() * keep).sum())
    clipped = int(((((ratio < 1 - clip_eps) & (adv < 0)) | ((ratio > 1 + clip_eps) & (adv > 0))) & keep).sum())
    return LossOutput((loss * keep).sum(), int(keep.sum()), clipped, dropped, kl_sum,
                      float((ratio.detach() * keep).sum()), log_w[mask], truncated, rejected)


class WeightStats:
    """The behaviour weight w = exp(prox − behav) over a step's policy tokens, as the numerics gate reads
    it: mean, quantiles, the share above the loss's cap and the effective sample size
    (Σw)² / (n·Σw²) (1 = uniform weights). Quantiles come from a histogram of log w (bins of
    ``1 / bins_per_nat`` nats over ±``span`` nats, the end bins open), so ranks add their counts."""

    def __init__(self, span: float = 8.0, bins_per_nat: int = 500):
        self.span, self.per = span, bins_per_nat
        self.counts = torch.zeros(int(2 * span * bins_per_nat), dtype=torch.float64)
        self.sums = torch.zeros(4, dtype=torch.float64)  # n, Σw, Σw², count over the cap

    def add(self, log_w: torch.Tensor, cap: float | None) -> None:
        lw = log_w.detach().double().cpu()
        if not lw.numel():
            return
        w = lw.exp()
        idx = ((lw + self.span) * self.per).floor().clamp(0, self.counts.numel() - 1).long()
        self.counts += torch.bincount(idx, minlength=self.counts.numel()).double()
        over = float((w > cap).sum()) if cap is not None else 0.0
        self.sums += torch.tensor([lw.numel(), float(w.sum()), float((w * w).sum()), over], dtype=torch.float64)

    def vector(self) -> torch.Tensor:
        return torch.cat([self.sums, self.counts])

    def metrics(self, reduced: torch.Tensor | None = None, qs=(0.001, 0.01, 0.5, 0.99, 0.999)) -> dict[str, float]:
        v = self.vector() if reduced is None else reduced.double().cpu()
        n, sw, sw2, over = v[:4].tolist()
        counts = v[4:]
        if n < 1:
            return {}
        out = {"rollout_corr/behav_weight_mean": sw / n, "rollout_corr/behav_weight_over_cap": over / n,
               "rollout_corr/behav_weight_ess": sw * sw / (n * sw2) if sw2 > 0 else 1.0}
        cdf = torch.cumsum(counts, 0) / n
        for q in qs:
            b = int(torch.searchsorted(cdf, torch.tensor(q, dtype=torch.float64)))
            log_w = -self.span + (min(b, counts.numel() - 1) + 0.5) / self.per  # the bin's centre
            out[f"rollout_corr/behav_weight_p{q * 100:g}"] = float(torch.exp(torch.tensor(log_w)))
        return out


# ---------------------------------------------------------------------------------------
# A step's loss: the functions the trainer calls, and its statistics
# ---------------------------------------------------------------------------------------

def policy_tokens(samples: Sequence) -> int:
    """The tokens the loss reads in ``samples``: position t of ``loss_mask[1:]`` predicts token t+1."""
    return sum(sum(s.loss_mask[1:]) for s in samples)


def gtr_objective(rl_loss_sum, n_rl: float, nll_sum, n_sft: float, lam: float):
    """L = L_PARA-GRPO + λ · mean NLL: the PPO term over ``n_rl`` (the step's policy tokens, or its sequences:
    :mod:`paravt.rl.loss_agg`), the NLL a token mean over corrected-thought tokens. Linear in both sums: the
    trainer backpropagates it pack by pack with each pack's sums and the step's counts."""
    return rl_loss_sum / max(n_rl, 1) + lam * nll_sum / max(n_sft, 1)


def sft_nll(logp: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Sum of −log p over the masked (corrected-thought) tokens, and their count."""
    mask = mask.bool()
    return -(logp * mask).sum(), int(mask.sum())


def batch_token_advantages(samples: Sequence, refs: dict[int, torch.Tensor] | None, kl_coef: float, token_norm: bool,
                           sum_over_ranks: Callable[[float], float]) -> tuple[dict[int, torch.Tensor], float]:
    """Per-token advantages of ``samples`` (keyed by ``id``) where they differ from each sequence's scalar,
    and the k1 KL reward's sum over them (``ppo/kl_reward``). ``refs`` (the reference's log p of each
    sample, by ``id``; None: no KL reward) adds the KL reward's return-to-go (:func:`token_advantages`);
    ``token_norm`` normalises over the policy tokens of every rank (``sum_over_ranks``: the all-reduce).
    Empty when neither applies."""
    if refs is None and not token_norm:
        return {}, 0.0
    advs, masks, kl_sum = {}, {}, 0.0
    for s in samples:
        mask = torch.tensor(s.loss_mask[1:], dtype=torch.float64)
        klr = None
        if refs is not None:
            klr = k1_kl_rewards(torch.tensor(s.behav_logprobs[1:], dtype=torch.float64), refs[id(s)].double().cpu(),
                                mask, kl_coef)
            kl_sum += float(klr.sum())
        advs[id(s)], masks[id(s)] = token_advantages(s.advantage, mask, klr), mask
    if token_norm:
        tot, sq, n = (sum_over_ranks(x) for x in masked_moments(list(advs.values()), list(masks.values())))
        advs = {k: normalize_with(a, masks[k], tot, sq, n) for k, a in advs.items()}
    return advs, kl_sum


def sample_loss(s, logp: torch.Tensor, ent: torch.Tensor, prox: torch.Tensor, ref: torch.Tensor | None,
                adv: torch.Tensor | None, g, loss_kl: float, think_w: float, stats: StepStats) -> torch.Tensor:
    """One sample's PPO (+ k3 KL) loss sum under the recipe's ``g`` (a GRPOConfig), its statistics into
    ``stats``. ``adv``: its per-token advantages (None: the sample's scalar for every token); ``think_w``
    weights the thought tokens' surrogate (GTR's c; 1 = off)."""
    dev = logp.device
    mask = torch.tensor(s.loss_mask[1:], device=dev, dtype=torch.bool)
    behav = torch.tensor(s.behav_logprobs[1:], device=dev)
    adv = adv.to(logp) if adv is not None else torch.full_like(logp, s.advantage)
    think = torch.tensor(s.think_mask[1:], device=dev, dtype=torch.bool) if s.think_mask is not None else None
    weight = None
    if think is not None and think_w != 1.0:
        weight = torch.where(think, torch.full_like(logp, think_w), torch.ones_like(logp))
    out = ppo_token_loss(logp, prox, behav, ref, adv, mask, g.clip_eps, loss_kl, g.behav_imp_weight_cap,
                         token_weight=weight, is_level=g.rollout_is, rs_level=g.rollout_rs, corr_cap=g.rollout_corr_cap)
    stats.add_ppo(out, ent, (prox - behav).abs() * mask, mask, think, g.behav_imp_weight_cap)
    return out.loss_sum


@dataclass
class StepStats:
    """A step's loss statistics on one rank: sums over its policy tokens, the largest logprob gap and the
    behaviour weights. :meth:`reduce` combines the ranks' (one all-reduce of every sum, one of the
    maximum); :meth:`metrics` names them."""

    loss: float = 0.0  # Σ PPO (+ k3 KL) loss
    tokens: float = 0.0  # policy tokens (those over the behaviour-weight cap included)
    clipped: float = 0.0  # tokens whose ratio was clipped
    dropped: float = 0.0  # tokens over the behaviour-weight cap
    kl: float = 0.0  # Σ k3 KL (kl_mode=loss_k3)
    kl_reward: float = 0.0  # Σ k1 KL reward (kl_mode=reward_k1)
    entropy: float = 0.0
    gap: float = 0.0  # Σ |log p_prox − log p_behav|
    truncated: float = 0.0  # rollout correction: tokens whose weight was truncated
    rejected: float = 0.0  # rollout correction: tokens masked
    ent_think: float = 0.0  # entropy on thought tokens, and their count
    n_think: float = 0.0
    ent_action: float = 0.0  # entropy on the other policy tokens of samples with a think mask, and their count
    n_action: float = 0.0
    sft_nll: float = 0.0  # GTR: Σ NLL of the corrected-thought tokens, and their count
    sft_tokens: float = 0.0
    gap_max: float = 0.0  # the largest |log p_prox − log p_behav|
    weights: WeightStats = field(default_factory=WeightStats)

    def _sums(self) -> list[str]:
        return [f.name for f in fields(self) if f.name not in ("gap_max", "weights")]

    def add_ppo(self, out: LossOutput, ent: torch.Tensor, gap: torch.Tensor, mask: torch.Tensor,
                think: torch.Tensor | None, cap: float | None) -> None:
        """One sample's loss output, entropy and logprob gap per token, policy and thought masks."""
        ent = ent.detach()
        self.loss += float(out.loss_sum.detach())
        self.tokens += int(mask.sum())
        self.clipped += out.clipped
        self.dropped += out.dropped
        self.kl += out.kl_sum
        self.entropy += float((ent * mask).sum())
        self.gap += float(gap.sum())
        self.gap_max = max(self.gap_max, float(gap.max()) if gap.numel() else 0.0)
        self.truncated += out.truncated
        self.rejected += out.rejected
        self.weights.add(out.log_w, cap)
        if think is not None:
            self.ent_think += float((ent * (mask & think)).sum())
            self.n_think += int((mask & think).sum())
            self.ent_action += float((ent * (mask & ~think)).sum())
            self.n_action += int((mask & ~think).sum())

    def add_sft(self, nll: float, n: int) -> None:
        self.sft_nll += nll
        self.sft_tokens += n

    def reduce(self, sum_vector: Callable[[torch.Tensor], torch.Tensor],
               maximum: Callable[[float], float]) -> StepStats:
        """The statistics of every rank: ``sum_vector`` all-reduces a float64 vector, ``maximum`` a float."""
        names = self._sums()
        v = sum_vector(torch.cat([torch.tensor([getattr(self, k) for k in names], dtype=torch.float64),
                                  self.weights.vector()]))
        out = StepStats(**dict(zip(names, v[:len(names)].tolist())), gap_max=maximum(self.gap_max))
        out.weights.sums, out.weights.counts = v[len(names):len(names) + 4], v[len(names) + 4:]
        return out

    def metrics(self, grad_norm: float, rollout_corr: bool, gtr_train: bool) -> dict[str, float]:
        """The step's loss metrics (``rollout_corr``: the correction's ratios; ``gtr_train``: the NLL's)."""
        m = max(self.tokens, 1.0)
        out = {"ppo/loss": self.loss / m, "ppo/clip_ratio": self.clipped / m, "ppo/behav_dropped_ratio": self.dropped / m,
               "ppo/kl": self.kl / m, "ppo/kl_reward": self.kl_reward / m, "ppo/entropy": self.entropy / m,
               "rollout/logprob_gap": self.gap / m, "rollout/logprob_gap_max": self.gap_max,
               "ppo/grad_norm": grad_norm, "ppo/tokens": self.tokens}
        out.update(self.weights.metrics())
        if rollout_corr:
            out["rollout_corr/truncated_ratio"] = self.truncated / m
            out["rollout_corr/rejected_ratio"] = self.rejected / m
        if self.n_think:
            out["ppo/entropy_think"] = self.ent_think / self.n_think
        if self.n_action:
            out["ppo/entropy_action"] = self.ent_action / self.n_action
        if gtr_train:
            out["gtr/nll"] = self.sft_nll / self.sft_tokens if self.sft_tokens else 0.0
            out["gtr/sft_tokens"] = self.sft_tokens
        return out
