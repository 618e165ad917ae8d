"""Where a decoded video frame came from, so that another process decodes the same pixels again.

A frame the PyAV reader decodes (:func:`paravt.core.video._frames_at`: frame-exact by index) carries
its file, frame index and resize bounds (:data:`paravt.core.video_reader.SOURCE_ATTR`).
:func:`source_of` turns that into a :class:`FrameSource` (60-200 bytes pickled), with the file's size and a
digest of the pixels; :func:`decode` reads the frames of a list of sources back through the shared
readers (:data:`paravt.core.video.READERS`, their frame cache too) and checks every digest, so a
receiver either holds the sender's exact pixels or gets a :class:`VideoError` naming the frame.
:func:`missing_files` says which sources a process cannot open (another node without the videos).

The RL trainer sends a step's samples to its other ranks this way (:mod:`paravt.rl.transfer`): a
64-frame overview costs a few KB instead of its 77 MB of fp32 pixel tensors (50,176-pixel frames).
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from typing import Iterable, Sequence

from PIL import Image

from paravt.core import video
from paravt.core.video_reader import SOURCE_ATTR, VideoError

_CACHED = "paravt_frame_source"  # the FrameSource of an image, computed once (a group's rollouts share frames)


@dataclass(frozen=True)
class FrameSource:
    path: str
    file_size: int
    index: int
    factor: int
    min_pixels: int
    max_pixels: int
    digest: bytes  # of the resized frame's mode, size and pixels

    @property
    def key(self) -> tuple[int, int, int, int]:
        """The frame's key in its reader's frame cache (index and resize bounds)."""
        return self.index, self.factor, self.min_pixels, self.max_pixels


def pixel_digest(img: Image.Image) -> bytes:
    return hashlib.blake2b(f"{img.mode}{img.size}".encode() + img.tobytes(), digest_size=16).digest()


def source_of(img: Image.Image) -> FrameSource | None:
    """Where ``img`` was decoded from, or None (not a PyAV-decoded video frame, or its file is gone)."""
    cached = getattr(img, _CACHED, None)
    if cached is not None:
        return cached
    tag = getattr(img, SOURCE_ATTR, None)
    if tag is None:
        return None
    path, index, factor, lo, hi = tag
    try:
        size = os.stat(path).st_size
    except OSError:
        return None
    src = FrameSource(path, size, int(index), int(factor), int(lo), int(hi), pixel_digest(img))
    setattr(img, _CACHED, src)
    return src


def missing_files(sources: Iterable[FrameSource]) -> list[str]:
    """The files of ``sources`` this process cannot read as the sender saw them (absent, or another size)."""
    out = []
    for path, size in sorted({(s.path, s.file_size) for s in sources}):
        try:
            ok = os.stat(path).st_size == size and os.access(path, os.R_OK)
        except OSError:
            ok = False
        if not ok:
            out.append(path)
    return out


def _resized(frame, factor: int, lo: int, hi: int) -> Image.Image:
    return video.resize_frame(Image.fromarray(frame), factor, lo, hi)


def decode(sources: Sequence[FrameSource]) -> list[Image.Image]:
    """The frames of ``sources``, in order: decoded and resized as the sender's were (one reader pass per
    file and resize), each checked against its digest."""
    by_path: dict[str, list[FrameSource]] = {}
    for s in sources:
        by_path.setdefault(s.path, []).append(s)
    got: dict[FrameSource, Image.Image] = {}
    for path, group in by_path.items():
        with video.READERS.use(path) as r:
            todo: dict[tuple[int, int, int], set[int]] = {}
            for s in group:
                if s.key not in r.frame_cache:
                    todo.setdefault(s.key[1:], set()).add(s.index)
            for (factor, lo, hi), indices in todo.items():
                order = sorted(indices)
                imgs = r.frames(order, post=functools.partial(_resized, factor=factor, lo=lo, hi=hi))
                for i, img in zip(order, imgs):
                    setattr(img, SOURCE_ATTR, (path, i, factor, lo, hi))
                    r.frame_cache[(i, factor, lo, hi)] = img
            for s in group:
                r.frame_cache.move_to_end(s.key)
                got[s] = r.frame_cache[s.key]
            while len(r.frame_cache) > video.FRAME_CACHE_ITEMS:
                r.frame_cache.popitem(last=False)
    for s, img in got.items():
        if pixel_digest(img) != s.digest:
            raise VideoError(f"frame {s.index} of {s.path} decoded here differs from the sender's "
                             "(another file or decoder build at that path)")
    return [got[s] for s in sources]
