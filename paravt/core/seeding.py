"""Stable seeds. Every random draw in the project (K, sampling, shuffling, synthetic world)
derives its seed here from explicit parts, with SHA-256, never Python's salted ``hash()``."""

from __future__ import annotations

import hashlib
import random

import numpy as np


def stable_hash(*parts: object) -> int:
    """A 63-bit integer from the string forms of ``parts``; the same on every run and process."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") & ((1 << 63) - 1)


def rng(*parts: object) -> np.random.Generator:
    return np.random.default_rng(stable_hash(*parts))


def py_rng(*parts: object) -> random.Random:
    return random.Random(stable_hash(*parts))


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch global generators (torch only if importable)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    try:
        import torch  # noqa: PLC0415

        torch.manual_seed(seed)
    except ImportError:  # pragma: no cover
        pass
