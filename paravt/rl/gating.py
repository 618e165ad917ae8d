"""nFrames gating: a per-prompt overview budget K.

With gating on, K ~ Uniform(choices) drawn deterministically from a SHA-256 of (seed, sample
id): every rollout of the prompt's group sees the same K, every process and every rerun
draws the same K. With gating off, K is the recipe's ``hierarchical_agent.nframes`` (64).
"""

from __future__ import annotations

from typing import Sequence

from paravt.core.seeding import stable_hash

DEFAULT_CHOICES = (4, 8, 16, 32, 64)


def choose_k(sample_id: str, seed: int, enabled: bool = True, choices: Sequence[int] = DEFAULT_CHOICES,
             default_k: int = 64) -> int:
    if not enabled:
        return default_k
    if not choices:
        raise ValueError("gating.choices is empty")
    return int(choices[stable_hash("nframes-gating", seed, sample_id) % len(choices)])


def check_gating_choices(choices) -> None:
    """``paravt.gating.choices``: a non-empty list of frame counts >= 1 (a warning for values the release never draws)."""
    if not choices or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in choices):
        raise ValueError(f"paravt.gating.choices must be a non-empty list of frame counts >= 1, got {choices!r} "
                         f"(the release draws from {list(DEFAULT_CHOICES)})")
    odd = [k for k in choices if k not in DEFAULT_CHOICES]
    if odd:
        import warnings  # noqa: PLC0415
        warnings.warn(f"paravt.gating.choices {odd} are outside the release's {list(DEFAULT_CHOICES)}", stacklevel=3)
