"""Video sampling shared by SFT, RL and eval.

Frames come from one :class:`~paravt.core.video_reader.VideoReader` per video (PyAV; seek to the keyframe before each
target, frame-exact, shared by the probe, the overview and every crop of an episode and its GRPO
group, resized frames cached; decoded in :data:`DECODE_POOL` off the asyncio loop).
``backend="decord"`` keeps the design's original decoder (one ``get_batch`` per call, the path of
qwen-vl-utils the release uses); benchmarks/README.md compares them on 720p H.264.

Every sampled frame carries its timestamp in seconds. Frames are resized Qwen-style
(:func:`smart_resize`): both sides a multiple of ``patch_size * merge_size`` and the area
inside ``[min_pixels, max_pixels]``. The helpers mirror the behaviour of qwen-vl-utils
(which needs torchvision) without depending on it.

A missing or undecodable file raises :class:`VideoError` naming the file.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Sequence

import numpy as np
from PIL import Image

from paravt.core.video_reader import SOURCE_ATTR, Frame, VideoError, VideoInfo, VideoReader, _check_file

#: Qwen3-VL: 16-pixel patches merged 2×2 → a 32-pixel factor.
DEFAULT_FACTOR = 32
DEFAULT_MIN_PIXELS = 784
DEFAULT_MAX_PIXELS = 50176

# ---------------------------------------------------------------------------------------
# Resizing
# ---------------------------------------------------------------------------------------

def smart_resize(
    height: int,
    width: int,
    factor: int = DEFAULT_FACTOR,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_ratio: float = 200.0,
) -> tuple[int, int]:
    """(h, w) rounded to multiples of ``factor`` with the area in [min_pixels, max_pixels]
    and the aspect ratio kept as closely as the rounding allows."""
    if height <= 0 or width <= 0:
        raise ValueError(f"invalid image size {height}x{width}")
    if max(height, width) / min(height, width) > max_ratio:
        raise ValueError(f"aspect ratio of {height}x{width} exceeds {max_ratio}")
    if min_pixels > max_pixels:
        raise ValueError(f"min_pixels {min_pixels} > max_pixels {max_pixels}")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def resize_frame(img: Image.Image, factor: int, min_pixels: int, max_pixels: int) -> Image.Image:
    h, w = smart_resize(img.height, img.width, factor, min_pixels, max_pixels)
    if (h, w) == (img.height, img.width):
        return img
    return img.resize((w, h), Image.BICUBIC)


# ---------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------


def decord_available() -> bool:
    try:
        import decord  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


DECORD_MISSING = ("decoder decord was asked for but decord is not installed (pip install decord==0.6.0; it has no "
                  "wheel for aarch64): use the default decoder, pyav")


def _decord_reader(path: str):
    """A decord reader: the decoder asked for is the decoder used (no silent fallback)."""
    try:
        import decord  # noqa: PLC0415
    except ImportError:
        raise VideoError(DECORD_MISSING) from None
    try:
        return decord.VideoReader(path, ctx=decord.cpu(0), num_threads=1)
    except Exception as exc:  # decord raises its own DECORDError
        raise VideoError(f"cannot decode video {path}: {exc}") from exc


#: The decoder every sampler uses unless told otherwise: ``pyav`` (:class:`VideoReader`, keyframe
#: seeks; benchmarks/README.md has the numbers) or ``decord`` (the design's original choice and
#: the release's, through qwen-vl-utils; one ``get_batch`` per call).
DEFAULT_BACKEND = "pyav"
BACKENDS = ("pyav", "decord")


class _ReaderCache:
    """Open readers by file (path, size, mtime), least recently used closed first: one reader per
    video serves the probe, the overview and every crop of an episode and of its GRPO group.

    A reader handed out by :meth:`use` is never closed under its user: eviction only drops it from
    the cache, and the last user closes it. Eviction never waits on a reader's lock while holding
    the cache's guard, so a busy reader never stalls other opens."""

    def __init__(self, max_open: int = 16):
        self.max_open = max_open
        self._items: OrderedDict[tuple, VideoReader] = OrderedDict()
        self._guard = threading.Lock()
        self._users: dict[int, int] = {}  # id(reader) -> users inside use()
        self._evicted: set[int] = set()  # dropped from the cache while in use: closed by the last user
        self.opened = 0

    def _lookup(self, path: str, take: bool) -> VideoReader:
        p = _check_file(path)
        st = os.stat(p)
        key = (os.path.realpath(p), st.st_size, st.st_mtime_ns)
        with self._guard:
            r = self._items.get(key)
            if r is not None:
                self._items.move_to_end(key)
                if take:
                    self._users[id(r)] = self._users.get(id(r), 0) + 1
                return r
        r = VideoReader(p)  # opened outside the guard: other opens go on meanwhile
        to_close = []
        with self._guard:
            if key in self._items:  # another thread opened it meanwhile
                to_close.append(r)
                r = self._items[key]
            else:
                self._items[key] = r
                self.opened += 1
            if take:
                self._users[id(r)] = self._users.get(id(r), 0) + 1
            to_close += self._evict()
        self._close(to_close)
        return r

    def _evict(self) -> list[VideoReader]:
        """Drop the least recently used readers beyond ``max_open`` (caller holds the guard); returns
        those to close: a reader in use is closed by its last user instead."""
        out = []
        while len(self._items) > self.max_open:
            _, old = self._items.popitem(last=False)
            if self._users.get(id(old)):
                self._evicted.add(id(old))
            else:
                out.append(old)
        return out

    @staticmethod
    def _close(readers: list[VideoReader]) -> None:
        for old in readers:  # outside the guard
            with old.lock:
                old.close()

    def keep_open(self, max_open: int) -> None:
        """Keep up to ``max_open`` readers open from now on (the least recently used beyond it closed now)."""
        if max_open < 1:
            raise ValueError(f"max_open must be >= 1, got {max_open}")
        with self._guard:
            self.max_open = max_open
            to_close = self._evict()
        self._close(to_close)

    def get(self, path: str) -> VideoReader:
        """The reader of ``path`` for its metadata (``.info``, ``.timeline``); decode through :meth:`use`."""
        return self._lookup(path, take=False)

    @contextmanager
    def use(self, path: str):
        """``with READERS.use(path) as r:`` the reader, locked for this thread and never closed
        until the block ends."""
        r = self._lookup(path, take=True)
        try:
            with r.lock:
                yield r
        finally:
            close = False
            with self._guard:
                n = self._users.get(id(r), 1) - 1
                if n:
                    self._users[id(r)] = n
                else:
                    self._users.pop(id(r), None)
                    close = id(r) in self._evicted
                    self._evicted.discard(id(r))
            if close:
                with r.lock:
                    r.close()

    def clear(self) -> None:
        with self._guard:
            items = list(self._items.values())
            self._items.clear()
            busy = [r for r in items if self._users.get(id(r))]
            self._evicted.update(id(r) for r in busy)
        for r in items:
            if r not in busy:
                with r.lock:
                    r.close()


READERS = _ReaderCache()
#: Decoding runs here, off the asyncio loop and apart from the engine's worker threads.
DECODE_POOL = ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2)), thread_name_prefix="paravt-decode")


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) must not share the parent's open files or pool threads:
    it starts with no readers (the parent's are left to the parent) and a fresh pool. The inherited
    readers are kept referenced, never freed: freeing a decoder in the child waits for FFmpeg
    threads that only exist in the parent (measured: the child hangs)."""
    global READERS, DECODE_POOL
    _INHERITED.append((READERS, DECODE_POOL))
    READERS = _ReaderCache(READERS.max_open)
    DECODE_POOL = ThreadPoolExecutor(max_workers=DECODE_POOL._max_workers, thread_name_prefix="paravt-decode")


_INHERITED: list = []
os.register_at_fork(after_in_child=_after_fork_in_child)


def keep_open_videos(n: int) -> None:
    """Keep up to ``n`` videos open, with their decoded frames (:data:`READERS`; default 16)."""
    READERS.keep_open(n)


def open_reader(path: str) -> VideoReader:
    """The shared :class:`VideoReader` of ``path`` (see :data:`READERS`)."""
    return READERS.get(path)


async def run_decode(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in :data:`DECODE_POOL` (sub-agents keep generating meanwhile)."""
    import asyncio  # noqa: PLC0415
    import functools  # noqa: PLC0415

    pool = DECODE_POOL  # looked up now: a forked child has its own
    return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args, **kwargs))


def probe(path: str, backend: str | None = None) -> VideoInfo:
    """Duration, fps and size of a video (from the container; nothing decoded with PyAV)."""
    if (backend or DEFAULT_BACKEND) == "decord":
        p = _check_file(path)
        vr = _decord_reader(p)
        if vr is not None:
            n = len(vr)
            if n == 0:
                raise VideoError(f"video has no frames: {p}")
            fps = float(vr.get_avg_fps())
            h, w = vr[0].shape[:2]
            return VideoInfo(p, n / fps, fps, n, int(w), int(h))
    return open_reader(path).info


def _decord_frames(vr, p: str, indices: Sequence[int]) -> np.ndarray:
    try:
        return vr.get_batch(list(indices)).asnumpy()
    except Exception as exc:
        raise VideoError(f"cannot decode frames {list(indices)[:4]}... of {p}: {exc}") from exc


def frame_indices(num_frames: int, fps: float, times: Sequence[float]) -> list[int]:
    """The decoded frame index for each requested time (nearest frame, clipped)."""
    return [min(num_frames - 1, max(0, int(round(t * fps)))) for t in times]


def overview_timestamps(num_frames: int, fps: float, k: int) -> list[float]:
    """Timestamps :func:`sample_overview` returns, without decoding anything."""
    k = min(k, num_frames)
    return [round(i / fps, 3) for i in frame_indices(num_frames, fps, uniform_times(0.0, num_frames / fps, k))]


def crop_timestamps(num_frames: int, fps: float, start: float, end: float, crop_fps: float = 1.0,
                    min_frames: int = 1, max_frames: int = 16) -> list[float]:
    """Timestamps :func:`sample_crop` returns, without decoding anything."""
    duration = num_frames / fps
    s, e = max(0.0, start), min(end, duration)
    n = max(min_frames, min(max_frames, int(math.floor((e - s) * crop_fps))))
    return [round(i / fps, 3) for i in frame_indices(num_frames, fps, uniform_times(s, e, n))]


FRAME_CACHE_ITEMS = 512  # resized frames kept per open video (~90 KB each at the default 50,176 px)


def _frames_at(
    info: VideoInfo, times: Sequence[float], factor: int, min_pixels: int, max_pixels: int,
    backend: str | None = None,
) -> list[Frame]:
    """Frames at ``times`` (nearest frame each), resized. With the PyAV reader, frames already
    decoded and resized for this video (an earlier crop, another rollout of the group) are reused;
    the returned images are shared: copy one before changing it."""
    vr = _decord_reader(info.path) if (backend or DEFAULT_BACKEND) == "decord" else None
    if vr is not None:
        indices = frame_indices(info.num_frames, info.fps, times)
        arr = _decord_frames(vr, info.path, indices)
        imgs = [resize_frame(Image.fromarray(a), factor, min_pixels, max_pixels) for a in arr]
        return [Frame(timestamp=round(i / info.fps, 3), image=img) for i, img in zip(indices, imgs)]
    with READERS.use(info.path) as r:
        tl = r.timeline
        # the frame nearest each requested time, and that frame's own time (variable-rate files: from
        # the stream's timestamps, so the prompt shows when the frame was really on screen)
        indices = [tl.nearest(t) for t in times] if tl.variable else frame_indices(info.num_frames, info.fps, times)
        keys = [(i, factor, min_pixels, max_pixels) for i in indices]
        todo = sorted({k[0] for k in keys if k not in r.frame_cache})
        if todo:
            resized = r.frames(todo, post=lambda a: resize_frame(Image.fromarray(a), factor, min_pixels, max_pixels))
            for i, img in zip(todo, resized):
                setattr(img, SOURCE_ATTR, (info.path, i, factor, min_pixels, max_pixels))  # decodable elsewhere
                r.frame_cache[(i, factor, min_pixels, max_pixels)] = img
        imgs = []
        for k in keys:
            r.frame_cache.move_to_end(k)
            imgs.append(r.frame_cache[k])
        while len(r.frame_cache) > FRAME_CACHE_ITEMS:
            r.frame_cache.popitem(last=False)
    return [Frame(timestamp=round(tl.time(i) if tl.variable else i / info.fps, 3), image=img)
            for i, img in zip(indices, imgs)]


def uniform_times(start: float, end: float, k: int) -> list[float]:
    """Centres of k equal segments of [start, end]."""
    if k <= 0:
        raise ValueError(f"number of frames must be positive, got {k}")
    step = (end - start) / k
    return [start + (i + 0.5) * step for i in range(k)]


def sample_overview(
    path: str,
    k: int,
    factor: int = DEFAULT_FACTOR,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    backend: str | None = None,
) -> list[Frame]:
    """K frames spread uniformly over the whole video (capped at the frame count)."""
    info = probe(path, backend)
    k = min(k, info.num_frames)
    return _frames_at(info, uniform_times(0.0, info.duration, k), factor, min_pixels, max_pixels, backend)


def sample_fps(
    path: str,
    fps: float = 1.0,
    max_frames: int = 64,
    min_frames: int = 1,
    start: float | None = None,
    end: float | None = None,
    factor: int = DEFAULT_FACTOR,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    backend: str | None = None,
) -> list[Frame]:
    """Frames of [start, end] (default: the whole video) at ``fps``, between min_frames and
    max_frames of them (spread uniformly when the cap binds)."""
    info = probe(path, backend)
    s = 0.0 if start is None else max(0.0, float(start))
    e = info.duration if end is None else min(float(end), info.duration)
    if not e > s:
        raise VideoError(f"empty window [{s}, {e}] in {info.path} (duration {info.duration:.2f}s)")
    n = int(math.floor((e - s) * fps))
    n = max(min_frames, min(max_frames, n))
    return _frames_at(info, uniform_times(s, e, n), factor, min_pixels, max_pixels, backend)


def sample_crop(
    path: str,
    start: float,
    end: float,
    fps: float = 1.0,
    min_frames: int = 1,
    max_frames: int = 16,
    factor: int = DEFAULT_FACTOR,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    backend: str | None = None,
) -> list[Frame]:
    """The crop sampler: [start, end] at 1 fps, 1 to 16 frames (the release's crop tool)."""
    return sample_fps(path, fps, max_frames, min_frames, start, end, factor, min_pixels, max_pixels, backend)
