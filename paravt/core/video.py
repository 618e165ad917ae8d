"""Video sampling shared by SFT, RL and eval.

Frames come from one :class:`VideoReader` per video (PyAV; seek to the keyframe before each
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

import bisect
import math
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

#: Qwen3-VL: 16-pixel patches merged 2×2 → a 32-pixel factor.
DEFAULT_FACTOR = 32
DEFAULT_MIN_PIXELS = 784
DEFAULT_MAX_PIXELS = 50176


class VideoError(RuntimeError):
    """A video could not be opened or decoded; the message names the file."""


@dataclass(frozen=True)
class VideoInfo:
    path: str
    duration: float
    fps: float
    num_frames: int
    width: int
    height: int


@dataclass
class Frame:
    timestamp: float
    image: Image.Image


def local_path(path_or_url: str) -> str:
    """A filesystem path from a path or a ``file://`` URL."""
    p = str(path_or_url)
    return p[len("file://"):] if p.startswith("file://") else p


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

def _check_file(path: str) -> str:
    p = local_path(path)
    if not Path(p).is_file():
        raise VideoError(f"video file not found: {p}")
    return p


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


def _open_stream(path: str, threads: int):
    import av  # noqa: PLC0415

    try:
        c = av.open(path)
        s = c.streams.video[0]
    except Exception as exc:  # noqa: BLE001 - av.error.* / IndexError (no video stream)
        raise VideoError(f"cannot decode video {path}: {exc}") from exc
    s.thread_type = "AUTO"
    s.codec_context.thread_count = threads
    return c, s


class Timeline:
    """Frame index <-> presentation timestamp of one video stream.

    Constant-rate streams (every timestamp on the ``1/rate`` grid): index ``i`` is at ``i / rate``,
    decord's mapping, with nothing read. Variable-rate streams (phone, screen and web recordings,
    dropped frames, jittered timestamps): ``pts`` holds every frame's timestamp in presentation
    order, from a packet index (demuxed, not decoded); index ``i`` is the ``i``-th frame shown."""

    def __init__(self, start: int, tb, rate, pts: list[int] | None = None):
        self.start, self.tb, self.rate = start, tb, rate
        self.pts_list = pts
        if pts is not None:
            self._pos = {p: i for i, p in enumerate(pts)}
            self._times = [float((p - pts[0]) * tb) for p in pts]

    @property
    def variable(self) -> bool:
        return self.pts_list is not None

    def index(self, pts: int) -> int:
        """The index of the frame with this timestamp (the nearest one, for a timestamp off the list)."""
        if self.pts_list is None:
            return int(round(float((pts - self.start) * self.tb * self.rate)))
        i = self._pos.get(pts)
        if i is not None:
            return i
        return self.nearest(float((pts - self.pts_list[0]) * self.tb))

    def pts(self, index: int) -> int:
        if self.pts_list is None:
            return self.start + int(round(float(index / self.rate / self.tb)))
        return self.pts_list[index]

    def time(self, index: int) -> float:
        """Seconds from the first frame to frame ``index``."""
        if self.pts_list is None:
            return index / float(self.rate)
        return self._times[index]

    def nearest(self, t: float) -> int:
        """The frame whose timestamp is nearest ``t`` seconds (constant rate: ``round(t * fps)``)."""
        if self.pts_list is None:
            raise ValueError("nearest() of a constant-rate timeline: use frame_indices")
        times = self._times
        j = bisect.bisect_left(times, t)
        if j <= 0:
            return 0
        if j >= len(times):
            return len(times) - 1
        return j if times[j] - t < t - times[j - 1] else j - 1


def _packet_pts(c, s) -> list[int]:
    """Every video packet's timestamp, sorted (presentation order), by demuxing the whole file
    without decoding a frame."""
    c.seek(0, stream=s, backward=True, any_frame=True)
    pts = sorted({p.pts for p in c.demux(s) if p.pts is not None and p.size})
    c.seek(0, stream=s, backward=True, any_frame=True)
    return pts


def _on_grid(c, s, start: int, tb, rate, n: int, window: int = 64, reorder: int = 16) -> bool:
    """True when the stream's timestamps sit on the ``1/rate`` grid (a constant-rate file) with no
    frame missing, in three windows of ``window`` packets (start, middle, end). A few hundred packets
    demuxed, nothing decoded; the last ``reorder`` of each window are left out of the gap check
    (with B-frames a packet arrives up to that many places after its turn on screen)."""
    tol = max(float(tb) * 1.01, 0.02 / float(rate))  # timestamp rounding of the container, in seconds
    for frac in (0.0, 0.5, 0.97):
        if frac:
            c.seek(start + int(frac * n / float(rate) / float(tb)), stream=s, backward=True, any_frame=False)
        else:
            c.seek(start, stream=s, backward=True, any_frame=True)
        got = []
        for p in c.demux(s):
            if p.pts is not None and p.size:
                got.append(p.pts)
            if len(got) >= window:
                break
        for p in got:
            x = float((p - start) * tb) * float(rate)
            if abs(x - round(x)) / float(rate) > tol:
                return False
        got = sorted(got)[: max(2, len(got) - reorder)]  # packets come in decode order: B-frames arrive late
        steps = [round(float((b - a) * tb) * float(rate)) for a, b in zip(got, got[1:])]
        if any(d != 1 for d in steps):  # a missing frame (a gap of two or more on the grid)
            return False
    c.seek(start, stream=s, backward=True, any_frame=True)
    return True


class _Decoder:
    """One demuxer + decoder over the file and its position (see :class:`VideoReader`)."""

    SKIP_MARGIN = 10  # frames before a target decoded in full: the reordering + frame-thread delay (misses are retried)
    DEFAULT_GOP = 250  # x264's default keyint, until two keyframes are seen in one forward run

    def __init__(self, path: str, threads: int, timeline: Timeline, stats: dict, opened=None):
        self.path = path
        self.c, self.s = opened if opened is not None else _open_stream(path, threads)
        self.timeline, self.stats = timeline, stats
        self.gen = None
        self.pos: int | None = None
        self.gop = self.DEFAULT_GOP
        self.last_key: int | None = None
        self.keys: set[int] = set()  # keyframe indices seen

    def index(self, pts: int) -> int:
        return self.timeline.index(pts)

    def pts(self, index: int) -> int:
        return self.timeline.pts(index)

    def seek(self, index: int) -> None:
        self.c.seek(self.pts(index), stream=self.s, backward=True, any_frame=False)
        self.gen = self.c.decode(self.s)
        self.pos = self.last_key = None
        self.stats["seeks"] += 1

    def next_frame(self, target: int, skip: bool):
        """Decode forward to the first frame at or after ``target``: (index, frame) or (None, None)."""
        cc = self.s.codec_context
        for fr in self.gen:  # type: ignore[union-attr]
            if fr.pts is None:
                continue
            i = self.index(fr.pts)
            self.stats["decoded"] += 1
            if fr.key_frame:
                if self.last_key is not None and self.pos is not None and self.pos >= self.last_key \
                        and 0 < i - self.last_key:  # two keyframes in one forward run: a true gap
                    self.gop = i - self.last_key
                self.last_key = i
                self.keys.add(i)
            self.pos = i
            want = "NONREF" if skip and target - i > self.SKIP_MARGIN else "DEFAULT"
            if cc.skip_frame != want:
                cc.skip_frame = want
            if i >= target:
                return i, fr
        return None, None

    def frame(self, target: int):
        for attempt, skip in enumerate((True, False)):
            if attempt or self.gen is None or self.pos is None or target <= self.pos \
                    or target - self.pos > self.gop / 2 or any(self.pos < k <= target for k in self.keys):
                self.seek(target)
            i, fr = self.next_frame(target, skip)
            if i == target:
                return fr
            self.stats["retries"] += 1  # passed over (a skipped frame, a timestamp gap): again, no skipping
            self.gen = None
        raise VideoError(f"frame {target} of {self.path} not found (decoded up to {self.pos})")

    def run(self, targets: list[int], out: dict, post=None) -> None:
        try:
            for t in targets:
                a = self.frame(t).to_ndarray(format="rgb24")
                out[t] = post(a) if post is not None else a
        finally:
            self.s.codec_context.skip_frame = "DEFAULT"

    def close(self) -> None:
        self.gen = None
        self.c.close()


def split_runs(targets: list[int], w: int, gop: int, keys=()) -> list[list[int]]:
    """Sorted ``targets`` cut into at most ``w`` contiguous runs, one per decoder, balancing the
    frames each decodes: a target costs the distance from the previous target of its run or from
    the keyframe before it, whichever is later (the reader's policy: it seeks when a keyframe lies
    between). Keyframes are those in ``keys`` seen so far, else the GOP grid — an estimate that only
    decides the split, never the frames. The least maximum cost is found by bisection over greedy
    packings; no run is empty."""
    if w <= 1 or len(targets) <= 1:
        return [list(targets)] if targets else []
    ks = sorted(keys)

    def key_before(i: int) -> int:
        j = bisect.bisect_right(ks, i) - 1
        return max(ks[j] if j >= 0 else 0, i // gop * gop)

    lead = [t - key_before(t) for t in targets]  # the cost of a target that starts a run

    def pack(limit: int) -> list[list[int]]:
        runs: list[list[int]] = [[targets[0]]]
        cost = lead[0]
        for i in range(1, len(targets)):
            step = min(lead[i], targets[i] - targets[i - 1])
            if cost + step > limit:
                runs.append([targets[i]])
                cost = lead[i]
            else:
                runs[-1].append(targets[i])
                cost += step
        return runs

    lo, hi = max(lead), sum(lead)
    while lo < hi:  # the least limit that packs into <= w runs
        mid = (lo + hi) // 2
        if len(pack(mid)) <= w:
            hi = mid
        else:
            lo = mid + 1
    return pack(lo)


class VideoReader:
    """One open video: its metadata from the container (nothing decoded) and any frames by index,
    frame-exact (frame ``i`` is the ``i``-th in presentation order, the frame decord returns for
    ``i``), at a cost that does not grow with the position in the file or its length.

    PyAV, per requested index in ascending order: seek to the keyframe before the target
    (``backward=True``) when a keyframe seen earlier lies between the current position and the
    target, or when the target is more than half a GOP ahead (the expected cost of decoding from
    the unknown keyframe before it; the GOP is learnt from consecutive keyframes seen while
    decoding, 250 frames — x264's default — until then); otherwise keep decoding forward.
    While the target is more than ``SKIP_MARGIN`` frames ahead, frames no other frame references
    (``skip_frame=NONREF``: H.264 ``nal_ref_idc = 0``) are not decoded at all; near it every frame
    is. Targets spread over more than two GOPs are split in ``workers`` contiguous runs decoded
    at once by separate demuxer/decoder pairs of this reader (FFmpeg releases the GIL). If a target
    is ever passed without being seen (a skipped frame, a timestamp gap) the reader seeks again
    with skipping off; a frame still missing is a VideoError. Not thread-safe: hold :attr:`lock`
    (the samplers do).
    """

    def __init__(self, path: str, threads: int = 1, workers: int | None = None):
        self.path = _check_file(path)
        self.threads = threads
        self.workers = max(1, workers if workers is not None else min(4, os.cpu_count() or 1))
        self.stats = {"seeks": 0, "decoded": 0, "retries": 0}
        c, s = _open_stream(self.path, threads)
        tb = s.time_base
        rate = s.average_rate or s.guessed_rate or s.base_rate
        if not rate or not tb:
            c.close()
            raise VideoError(f"cannot decode video {self.path}: no frame rate or time base")
        start = s.start_time or 0
        n = int(s.frames or 0)
        if n <= 0:  # containers without a frame count (mkv, webm): from the duration, as decord does
            dur = float(s.duration * tb) if s.duration else (c.duration or 0) / 1e6
            n = int(round(dur * float(rate)))
        try:
            pts = None
            # the container's average rate, else its guessed one (an edit list or a start offset can skew
            # the average); a stream on neither grid gets the packet index
            for cand in dict.fromkeys(r for r in (rate, s.guessed_rate) if r):
                if n > 0 and _on_grid(c, s, start, tb, cand, n):
                    if cand != rate:
                        n, rate = int(round(n * float(cand) / float(rate))), cand
                    break
            else:
                pts = _packet_pts(c, s)
        except Exception as exc:  # noqa: BLE001 - av errors while demuxing: the file is broken
            c.close()
            raise VideoError(f"cannot decode video {self.path}: {exc}") from exc
        if pts is not None:  # variable frame rate: count, duration and rate from the timestamps
            if not pts:
                c.close()
                raise VideoError(f"video has no frames: {self.path}")
            n = len(pts)
            last = float(np.median(np.diff(pts))) if n > 1 else 1.0 / float(rate) / float(tb)
            span = float((pts[-1] - pts[0]) * tb) + last * float(tb)
            rate = n / span  # the mean rate; the timeline holds every frame's own time
            start = pts[0]
        if n <= 0:
            c.close()
            raise VideoError(f"video has no frames: {self.path}")
        cc = s.codec_context
        self.timeline = Timeline(start, tb, rate, pts)
        self.info = VideoInfo(self.path, n / float(rate), float(rate), n, int(cc.width), int(cc.height))
        self._decoders = [_Decoder(self.path, threads, self.timeline, self.stats, opened=(c, s))]
        self.lock = threading.Lock()
        self.frame_cache: OrderedDict[tuple, Image.Image] = OrderedDict()  # (index, resize) -> image

    def _decoder(self, k: int) -> _Decoder:
        while len(self._decoders) <= k:
            self._decoders.append(_Decoder(self.path, self.threads, self.timeline, self.stats))
        return self._decoders[k]

    def frames(self, indices: Sequence[int], post=None):
        """RGB frames (N, H, W, 3) for ``indices`` (any order, repeats allowed); with ``post``, the
        list of ``post(frame)`` instead, computed in the decoding threads (e.g. the resize: Pillow
        and FFmpeg release the GIL, so it runs on every core)."""
        want = sorted(set(int(i) for i in indices))
        bad = [i for i in want if not 0 <= i < self.info.num_frames]
        if bad:
            raise VideoError(f"frames {bad[:4]} outside 0..{self.info.num_frames - 1} of {self.path}")
        d0 = self._decoders[0]
        w = min(self.workers, len(want)) if want and want[-1] - want[0] > 2 * d0.gop else 1
        runs = split_runs(want, w, d0.gop, d0.keys) or [[]]  # no frames asked: one empty run, as before
        w = len(runs)
        got: dict[int, np.ndarray] = {}
        errors: list[BaseException] = []

        def work(k: int) -> None:
            try:
                self._decoder(k).run(runs[k], got, post)
            except BaseException as exc:  # noqa: BLE001 - re-raised below in the caller's thread
                errors.append(exc)

        for k in range(1, w):  # open the extra decoders here (not concurrently)
            self._decoder(k)
        threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(1, w)]
        for t in threads:
            t.start()
        work(0)
        for t in threads:
            t.join()
        if errors:
            exc = errors[0]
            if isinstance(exc, VideoError):
                raise exc
            raise VideoError(f"cannot decode frames of {self.path}: {type(exc).__name__}: {exc}") from exc
        if post is not None:
            return [got[int(i)] for i in indices]
        return np.stack([got[int(i)] for i in indices])

    def close(self) -> None:
        for d in self._decoders:
            d.close()
        self._decoders = []


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
            while len(self._items) > self.max_open:
                _, old = self._items.popitem(last=False)
                if self._users.get(id(old)):
                    self._evicted.add(id(old))  # in use: its last user closes it
                else:
                    to_close.append(old)
        for old in to_close:  # outside the guard
            with old.lock:
                old.close()
        return r

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
