"""Dynamic sampling (DAPO; verl's ``filter_groups``), opt-in as ``grpo.dynamic_sampling`` (off as released).

A group whose shaped rewards have zero spread gets zero advantage everywhere: it costs a step's compute
and teaches nothing. With dynamic sampling a step drops such groups and draws more prompts until it
holds ``grpo.prompts_per_step`` groups with spread, drawing at most ``grpo.dynamic_sampling_max_prompts``
prompts in all; past that cap it trains on the groups it has and says so (``dynamic_sampling/capped``).

The step's first prompts are the schedule's as without it; the extra ones come, in order, from a seeded
stream of the step's own (:meth:`paravt.rl.rollout.PromptSchedule.extra`), so which prompts a step draws
is a function of the seed, the step and the rewards, never of how far the async producer runs ahead, and
a resumed run draws the same ones. Each round draws just the deficit (prompts_per_step − groups kept), so
a step never holds more groups than the recipe's count. K (nFrames gating) stays a function of each
prompt, the same for its n rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

if TYPE_CHECKING:  # the recipe's config imports this module: --help answers before torch loads
    import torch


@dataclass
class DrawnGroups:
    """The episodes of the prompts a step drew: for each episode its trajectory, group (an index into
    ``prompts``), K and reward; ``lost``: the groups skipped because their episodes lost work."""

    prompts: list[Any] = field(default_factory=list)
    trajs: list[Any] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    ks: list[int] = field(default_factory=list)
    rewards: list[Any] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    first_error: str | None = None

    def add(self, more: DrawnGroups) -> None:
        """Another round's groups (its group indices already counted after this one's prompts)."""
        self.prompts += more.prompts
        self.trajs += more.trajs
        self.groups += more.groups
        self.ks += more.ks
        self.rewards += more.rewards
        self.lost += more.lost
        self.first_error = self.first_error or more.first_error

    def only(self, keep: list[int]) -> DrawnGroups:
        """The episodes of the groups ``keep`` (``prompts`` whole, so group indices still point into it)."""
        wanted = set(keep)
        idx = [i for i, g in enumerate(self.groups) if g in wanted]
        return DrawnGroups(self.prompts, [self.trajs[i] for i in idx], [self.groups[i] for i in idx],
                           [self.ks[i] for i in idx], [self.rewards[i] for i in idx], self.lost, self.first_error)


def groups_with_spread(shaped: torch.Tensor, groups: list[int], eps: float = 1e-8) -> list[int]:
    """The groups (in order of first episode) whose shaped rewards are not all equal: population std above
    ``eps``, the test :func:`paravt.rl.grpo.group_normalize` flags zero-std groups with."""
    import torch  # noqa: PLC0415

    out = []
    for g in dict.fromkeys(groups):
        r = shaped[torch.tensor([x == g for x in groups])].double()
        if r.numel() > 1 and float(r.std(unbiased=False)) >= eps:
            out.append(g)
    return out


async def dynamic_sample(first: DrawnGroups, draw: Callable[[int, int], Awaitable[DrawnGroups]],
                         shape: Callable[[list[float]], torch.Tensor], per_step: int,
                         max_prompts: int) -> tuple[DrawnGroups, dict[str, float]]:
    """Drop ``first``'s zero-spread groups and ``draw(start, count)`` the prompts at positions
    [start, start + count) of the step's extra stream until ``per_step`` groups have spread or
    ``max_prompts`` prompts are drawn. ``shape`` maps raw reward totals to the shaped rewards the
    advantages use. ``first`` grows by each round drawn (it ends holding every episode of the step).
    Returns the kept groups' episodes and the ``dynamic_sampling/*`` metrics."""
    drawn, base = first, len(first.prompts)
    while True:
        kept = groups_with_spread(shape([r.total for r in drawn.rewards]), drawn.groups) if drawn.rewards else []
        room = max_prompts - len(drawn.prompts)
        if len(kept) >= per_step or room <= 0:
            break
        more = await draw(len(drawn.prompts) - base, min(per_step - len(kept), room))
        if not more.prompts:  # the data set has no more prompts for this step
            break
        drawn.add(more)
    n = len(drawn.prompts)
    dropped = len(set(drawn.groups) - set(kept))
    metrics = {"dynamic_sampling/groups_drawn": float(n), "dynamic_sampling/groups_dropped": float(dropped),
               "dynamic_sampling/groups_kept": float(len(kept)),
               "dynamic_sampling/extra_generation_share": max(n - per_step, 0) / max(n, 1),
               "dynamic_sampling/capped": float(len(kept) < per_step)}
    return drawn.only(kept), metrics


def max_prompts(g) -> int:
    """``grpo.dynamic_sampling_max_prompts``, or three times ``prompts_per_step`` when unset."""
    return g.dynamic_sampling_max_prompts or 3 * g.prompts_per_step


def check_dynamic_sampling(g) -> None:
    """``grpo.dynamic_sampling_max_prompts`` (null or at least ``prompts_per_step``)."""
    cap = g.dynamic_sampling_max_prompts
    if cap is not None and cap < g.prompts_per_step:
        raise ValueError(f"grpo.dynamic_sampling_max_prompts must be null or >= grpo.prompts_per_step "
                         f"({g.prompts_per_step}), got {cap}")
