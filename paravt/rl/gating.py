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
