"""Video sampling shared by SFT, RL and eval: decord first, PyAV as a fallback.

Every sampled frame carries its timestamp in seconds. Frames are resized Qwen-style
(:func:`smart_resize`): both sides a multiple of ``patch_size * merge_size`` and the area
inside ``[min_pixels, max_pixels]``. The helpers mirror the behaviour of qwen-vl-utils
(which needs torchvision) without depending on it.

A missing or undecodable file raises :class:`VideoError` naming the file.
"""

from __future__ import annotations

import math
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


def _decord_reader(path: str):
    try:
        import decord  # noqa: PLC0415
    except ImportError:  # pragma: no cover - decord is in every requirements file
        return None
    try:
        return decord.VideoReader(path, ctx=decord.cpu(0), num_threads=1)
    except Exception as exc:  # decord raises its own DECORDError
        raise VideoError(f"cannot decode video {path}: {exc}") from exc


def probe(path: str) -> VideoInfo:
    """Duration, fps and size of a video."""
    p = _check_file(path)
    vr = _decord_reader(p)
    if vr is not None:
        n = len(vr)
        if n == 0:
            raise VideoError(f"video has no frames: {p}")
        fps = float(vr.get_avg_fps())
        h, w = vr[0].shape[:2]
        return VideoInfo(p, n / fps, fps, n, int(w), int(h))
    return _probe_av(p)


def _probe_av(p: str) -> VideoInfo:
    import av  # noqa: PLC0415

    try:
        with av.open(p) as c:
            s = c.streams.video[0]
            fps = float(s.average_rate or 1)
            n = s.frames or sum(1 for _ in c.decode(video=0))
            return VideoInfo(p, n / fps, fps, n, s.codec_context.width, s.codec_context.height)
    except Exception as exc:
        raise VideoError(f"cannot decode video {p}: {exc}") from exc


def _decode_indices(p: str, indices: Sequence[int]) -> np.ndarray:
    vr = _decord_reader(p)
    if vr is not None:
        try:
            return vr.get_batch(list(indices)).asnumpy()
        except Exception as exc:
            raise VideoError(f"cannot decode frames {list(indices)[:4]}... of {p}: {exc}") from exc
    import av  # noqa: PLC0415

    wanted = set(indices)
    got: dict[int, np.ndarray] = {}
    try:
        with av.open(p) as c:
            for i, fr in enumerate(c.decode(video=0)):
                if i in wanted:
                    got[i] = fr.to_ndarray(format="rgb24")
                if len(got) == len(wanted):
                    break
    except Exception as exc:
        raise VideoError(f"cannot decode video {p}: {exc}") from exc
    missing = wanted - set(got)
    if missing:
        raise VideoError(f"frames {sorted(missing)[:4]} not found in {p}")
    return np.stack([got[i] for i in indices])


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


def _frames_at(
    info: VideoInfo, times: Sequence[float], factor: int, min_pixels: int, max_pixels: int
) -> list[Frame]:
    indices = frame_indices(info.num_frames, info.fps, times)
    arr = _decode_indices(info.path, indices)
    frames = []
    for idx, a in zip(indices, arr):
        img = resize_frame(Image.fromarray(a), factor, min_pixels, max_pixels)
        frames.append(Frame(timestamp=round(idx / info.fps, 3), image=img))
    return frames


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
) -> list[Frame]:
    """K frames spread uniformly over the whole video (capped at the frame count)."""
    info = probe(path)
    k = min(k, info.num_frames)
    return _frames_at(info, uniform_times(0.0, info.duration, k), factor, min_pixels, max_pixels)


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
) -> list[Frame]:
    """Frames of [start, end] (default: the whole video) at ``fps``, between min_frames and
    max_frames of them (spread uniformly when the cap binds)."""
    info = probe(path)
    s = 0.0 if start is None else max(0.0, float(start))
    e = info.duration if end is None else min(float(end), info.duration)
    if not e > s:
        raise VideoError(f"empty window [{s}, {e}] in {info.path} (duration {info.duration:.2f}s)")
    n = int(math.floor((e - s) * fps))
    n = max(min_frames, min(max_frames, n))
    return _frames_at(info, uniform_times(s, e, n), factor, min_pixels, max_pixels)


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
) -> list[Frame]:
    """The crop_video sampler: [start, end] at 1 fps, 1 to 16 frames (the release's crop_video)."""
    return sample_fps(path, fps, max_frames, min_frames, start, end, factor, min_pixels, max_pixels)
