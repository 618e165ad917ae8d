"""A step's samples from rank 0 to the other trainer ranks, without their pixels.

Every rank holds the step's whole sample list (:meth:`paravt.rl.trainer.RLTrainer.train_on`). Rank 0's
samples carry their fp32 pixel tensors (~1.2 MB a frame at 50,176 pixels) and the data URLs sent to the
engine; NCCL's object broadcast stages what it sends in GPU memory on every rank. What goes out instead
(:func:`portable`): ids, masks, logprobs, and each video frame the PyAV reader decoded as its source (file,
frame index, resize, digest: :mod:`paravt.core.frame_sources`), at most ~200 bytes a frame; other images
as themselves. A receiver decodes the frames of the samples it trains on, and computes their tensors
with its own processor (equal settings, equal tensors: :func:`paravt.models.images.processor_key`).

When a rank cannot open a video a frame came from (a node without the data), every rank learns it from
one all-reduce and rank 0 sends the frames' pixels instead (uint8 images, still no tensors).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Sequence

from paravt.core.frame_sources import missing_files
from paravt.models import parallel
from paravt.models.images import ImageInputs
from paravt.rl.rollout import RolloutBatch, Sample

log = logging.getLogger(__name__)
_WARNED: set[str] = set()  # files already reported missing by this process


def portable(samples: Sequence[Sample], frame_sources: bool = True,
             copies: dict[int, ImageInputs] | None = None) -> list[Sample]:
    """Copies of ``samples`` to pickle for another process (:meth:`paravt.models.images.ImageInputs.portable`).
    Samples that share an image list (a group's rollouts: one overview) share its copy (``copies``, by the
    original's id), so a receiver decodes it and computes its tensors once, as rank 0 did."""
    copies = {} if copies is None else copies
    out = []
    for s in samples:
        if s.images is not None:
            if id(s.images) not in copies:
                copies[id(s.images)] = s.images.portable(frame_sources)
            s = replace(s, images=copies[id(s.images)])
        out.append(s)
    return out


def _missing(samples: Sequence[Sample]) -> list[str]:
    return missing_files(src for s in samples if s.images is not None for src in s.images.sources())


def broadcast_step(batch: RolloutBatch | None, sft: list[Sample] | None,
                   world_size: int) -> tuple[list[Sample], int, list[Sample]]:
    """(samples, step index, GTR samples) on every rank from rank 0's ``batch`` and ``sft`` (None on the
    others). Collective. Rank 0 keeps its own objects (their tensors already computed)."""
    mine = None if batch is None else (list(batch.samples), batch.index, list(sft or []))
    if world_size < 2:
        return mine
    copies: dict[int, ImageInputs] = {}
    got = parallel.broadcast_object(
        None if mine is None else (portable(mine[0], True, copies), mine[1], portable(mine[2], True, copies)))
    missing = [] if mine is not None else _missing(got[0] + got[2])
    if set(missing) - _WARNED:
        _WARNED.update(missing)
        log.warning("cannot read %d video(s) rank 0 decoded frames from (e.g. %s): it sends the frames' pixels",
                    len(missing), missing[0])
    if parallel.all_reduce_max(float(bool(missing))) > 0:  # some rank cannot decode: the frames themselves
        copies.clear()
        pixels = parallel.broadcast_object(
            None if mine is None else (portable(mine[0], False, copies), portable(mine[2], False, copies)))
        got = (pixels[0], got[1], pixels[1])
    return mine if mine is not None else got
