"""Frames and mp4 files of a :class:`~paravt.data.synthetic.world.VideoSpec` (PyAV, H.264)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from paravt.data.synthetic.world import BACKGROUNDS, COLOURS, VideoSpec


def _background(spec: VideoSpec, t: float) -> tuple[int, int, int]:
    idx = [b for s, b in spec.scenes if s <= t][-1]
    return BACKGROUNDS[idx]


def render_frame(spec: VideoSpec, t: float) -> np.ndarray:
    img = Image.new("RGB", (spec.size, spec.size), _background(spec, t))
    d = ImageDraw.Draw(img)
    # Distractor: a small grey square drifting across the frame.
    gx = int((t * 3) % (spec.size - 8))
    gy = int(spec.size - 12 - 6 * math.sin(t / 5))
    d.rectangle([gx, gy, gx + 6, gy + 6], fill=(110, 110, 110))
    for ev in spec.events:
        if ev.visible_at(t):
            box = [ev.x, ev.y, ev.x + ev.size, ev.y + ev.size]
            col = COLOURS[ev.colour]
            if ev.shape == "circle":
                d.ellipse(box, fill=col)
            elif ev.shape == "square":
                d.rectangle(box, fill=col)
            else:
                d.polygon([(ev.x + ev.size / 2, ev.y), (ev.x, ev.y + ev.size), (ev.x + ev.size, ev.y + ev.size)], fill=col)
    return np.asarray(img)


def write_video(spec: VideoSpec, path: Path) -> None:
    import av  # noqa: PLC0415

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.mp4")
    with av.open(str(tmp), mode="w") as container:
        stream = container.add_stream("libx264", rate=spec.fps)
        stream.width = stream.height = spec.size
        stream.pix_fmt = "yuv420p"
        # x264's C code, not its assembly: its AVX-512 code encoded the same frames to different bytes, and
        # different decoded pixels, from run to run (one clip of the quickstart's 160 in a world build; that
        # clip gave 3 different files in 20 encodes; its AVX2 code did not), and a CPU with other vector units
        # takes other code. asm=0: one code path whatever the CPU, the same bytes on every run; ~2x slower (seconds).
        stream.options = {"crf": "12", "preset": "veryfast", "threads": "1", "bframes": "0", "x264-params": "asm=0"}
        stream.codec_context.thread_count = 1
        for i in range(spec.num_frames):
            frame = av.VideoFrame.from_ndarray(render_frame(spec, i / spec.fps), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------
# Frame-numbered test videos (decoder exactness tests and the long-video benchmark)
# ---------------------------------------------------------------------------------------
BARCODE_BITS = 20  # frame numbers up to ~1 M (a 60-minute file at 24 fps has 86,400 frames)


def read_frame_number(rgb: np.ndarray) -> int:
    """The frame number drawn by :func:`write_numbered_video` (at any resize of the frame)."""
    h, w = rgb.shape[:2]
    y = rgb.astype(np.float32).mean(axis=2) if rgb.ndim == 3 else rgb.astype(np.float32)
    n = 0
    for b in range(BARCODE_BITS):
        x0 = (1 + b) / (BARCODE_BITS + 2) * w  # block centres scale with the frame
        bw = w / (BARCODE_BITS + 2)
        cx, cy = int(x0 + bw / 2), int(1.5 * bw)  # the row sits one block below the top (aspect kept)
        v = y[max(0, cy - 1):cy + 2, max(0, cx - 1):cx + 2].mean()
        n |= int(v > 128) << b
    return n


def write_numbered_video(path: Path, seconds: float, fps: int = 24, width: int = 1280, height: int = 720,
                         gop: int = 250, bframes: int = 3, preset: str = "superfast", crf: int = 23,
                         grain: int = 6, progress: bool = False, times=None) -> Path:
    """An H.264 mp4 whose every frame draws its own number (a row of black/white blocks, read back
    by :func:`read_frame_number`) over a moving texture (so P/B-frames carry real motion and the
    bitrate is that of camera footage, not of flat colour: ``grain`` adds fresh noise of that
    amplitude to every frame, ~2-3 Mbit/s at 720p like the benchmarks' files). x264 with ``gop`` (keyint) and
    ``bframes`` like benchmark files (x264's defaults: keyint 250, 3 B-frames). ``times`` (seconds,
    one per frame) writes a variable-rate file instead: frame ``i`` shown at ``times[i]`` (pts in
    1/90000 s, as phone and screen recordings store them); ``seconds`` and ``fps`` are then unused
    except as the stream's nominal rate."""
    import av  # noqa: PLC0415

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.mp4")
    n = len(times) if times is not None else int(round(seconds * fps))
    rng = np.random.default_rng(0)
    tex = rng.integers(40, 216, size=(height // 8 + 1, width // 8 + 2), dtype=np.uint8)
    tex = np.kron(tex, np.ones((8, 8), np.uint8))  # 8-px texture: coarse enough to compress like video
    u = np.full((height // 2, width // 2), 128, np.uint8)
    noise = [rng.integers(-grain, grain + 1, size=(height, width), dtype=np.int16) for _ in range(17)] if grain else []
    block = width // (BARCODE_BITS + 2)
    bar_y = int(block * 1.0)
    with av.open(str(tmp), mode="w") as c:
        s = c.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        s.options = {"preset": preset, "crf": str(crf), "g": str(gop), "bf": str(bframes)}
        if times is not None:
            import fractions  # noqa: PLC0415
            tb = fractions.Fraction(1, 90000)
            s.time_base = s.codec_context.time_base = tb
            # rate control blind to the timestamps: the same bits per frame as the constant-rate file
            # (x264 otherwise spends more on frames shown longer), so the two decode alike
            s.options = {**s.options, "x264-params": "force-cfr=1"}
        it = range(n)
        if progress:
            from tqdm import tqdm  # noqa: PLC0415
            it = tqdm(it, desc=f"write {path.name}", unit="frame")
        for i in it:
            off = (i * 3) % (tex.shape[1] - width)
            yp = tex[:height, off:off + width].astype(np.int16)
            if grain:
                yp += noise[i % len(noise)]  # 17 fields in turn: fresh to an encoder that looks 1-3 frames back
            yp = yp.clip(0, 255).astype(np.uint8)
            for b in range(BARCODE_BITS):
                x0 = int((1 + b) / (BARCODE_BITS + 2) * width)
                yp[bar_y:bar_y + block, x0:x0 + block] = 235 if (i >> b) & 1 else 16
            frame = av.VideoFrame.from_numpy_buffer(np.concatenate([yp, u.reshape(-1, width), u.reshape(-1, width)]),
                                                    format="yuv420p")
            if times is None:
                frame.pts = i
            else:
                frame.pts, frame.time_base = int(round(times[i] * 90000)), tb
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    os.replace(tmp, path)
    return path


def write_timed_video(path: Path, times_s, codec: str = "libx264", width: int = 160, height: int = 96,
                      time_base: str = "1/90000", options: dict | None = None, audio_first: bool = False,
                      rate: int | None = None) -> Path:
    """A short video whose frame ``i`` draws ``i`` (read back by :func:`read_frame_number`) and is
    shown at ``times_s[i]`` seconds: constant, dropped-frame, jittered or offset timelines written as
    the container stores them (each frame's ``pts`` set in ``time_base``). The container follows
    the suffix (mp4, mkv, webm, mov); ``audio_first`` adds a silent AAC stream before the video one
    (stream 0 is then audio, as in many downloads)."""
    import fractions  # noqa: PLC0415

    import av  # noqa: PLC0415

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tb = fractions.Fraction(time_base)
    rng = np.random.default_rng(0)
    tex = rng.integers(40, 216, size=(height, width), dtype=np.uint8)
    block = width // (BARCODE_BITS + 2)
    with av.open(str(path), mode="w") as c:
        if audio_first:
            a = c.add_stream("aac", rate=48000)
            a.layout = "mono"
        s = c.add_stream(codec, rate=rate or max(1, round(len(times_s) / max(times_s[-1], 1e-3))))
        s.width, s.height = width, height
        s.pix_fmt = "yuv420p"
        s.time_base = tb
        s.codec_context.time_base = tb
        if options:
            s.options = dict(options)
        for i, t in enumerate(times_s):
            yp = tex.copy()
            for b in range(BARCODE_BITS):
                x0 = int((1 + b) / (BARCODE_BITS + 2) * width)
                yp[block:2 * block, x0:x0 + block] = 235 if (i >> b) & 1 else 16
            frame = av.VideoFrame.from_ndarray(np.stack([yp] * 3, -1), format="rgb24").reformat(format="yuv420p")
            frame.pts = int(round(t / tb))
            frame.time_base = tb
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
        if audio_first:  # one second of silence so the stream is not empty
            af = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            af.sample_rate = 48000
            af.pts = 0
            for p in a.encode(af):
                c.mux(p)
            for p in a.encode():
                c.mux(p)
    return path
