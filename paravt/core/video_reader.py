"""One open video, frame-exact by index: :class:`VideoReader` (PyAV, keyframe seeks) and the
stream :class:`Timeline` it maps times to frames with (constant-rate files by their rate grid,
variable-rate ones by a packet index built without decoding).

:mod:`paravt.core.video` is the API the stages use (the shared reader cache, the samplers, the
decord path); this module is what it decodes with. A missing or undecodable file raises
:class:`VideoError` naming the file.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
from PIL import Image

Decoder = Literal["pyav", "decord"]  # the video decoders a recipe may name (crop.decoder, the SFT data's video.decoder)

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


#: Attribute of a frame image decoded by the PyAV reader: (path, index, factor, min_pixels, max_pixels), what
#: decodes the same pixels again in another process (:mod:`paravt.core.frame_sources`).
SOURCE_ATTR = "paravt_source"


def local_path(path_or_url: str) -> str:
    """A filesystem path from a path or a ``file://`` URL."""
    p = str(path_or_url)
    return p[len("file://"):] if p.startswith("file://") else p


def _check_file(path: str) -> str:
    p = local_path(path)
    if not Path(p).is_file():
        raise VideoError(f"video file not found: {p}")
    return p



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
        if frac and len(got) < window and len(got) - reorder < 2:
            # the end of the data, too few packets to tell: a file cut after a reference frame lacks the B-frames
            continue  # shown before it, a gap that is no dropped frame (else read as a shorter variable-rate video)
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
