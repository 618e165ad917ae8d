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
        stream.options = {"crf": "12", "preset": "veryfast", "threads": "1", "bframes": "0"}
        stream.codec_context.thread_count = 1
        for i in range(spec.num_frames):
            frame = av.VideoFrame.from_ndarray(render_frame(spec, i / spec.fps), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    os.replace(tmp, path)
