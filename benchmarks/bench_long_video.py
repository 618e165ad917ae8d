"""Long videos at real size: K-frame overviews and 16-frame crops on 720p H.264, decoders compared.

    python benchmarks/bench_long_video.py [--minutes 10 60] [--out benchmarks/results/long_video.json]

Writes (once, cached in benchmarks/.cache/) 1280x720 24 fps H.264 files that draw their frame
number (paravt.data.synthetic.render.write_numbered_video: x264 superfast, keyint 250, 3 B-frames,
a moving texture with grain), then times in one run, per file:

- decord_get_batch: one ``decord.VideoReader`` + ``get_batch`` of the K indices (qwen-vl-utils'
  path, the authors' release), no resize;
- project_decord: ``sample_overview(backend="decord")`` (the project before: decord + resize);
- pyav_seek_each: PyAV, one seek to the keyframe before every target, every frame decoded from
  there (the "floor" the issue names: decoding from the nearest keyframe to each target);
- project_pyav: ``sample_overview`` with the default reader (keyframe seeks, frame threads,
  non-reference frames skipped far from a target), opened fresh;
- crops: ``sample_crop`` of a 30 s window at the start, middle and end (16 frames), fresh reader;
- torchcodec (when it imports: ``pip install torchcodec==0.13.0`` — the CPU wheel — plus the
  system FFmpeg libraries, ``apt-get install libavcodec59 libavformat59 libavutil57 libswscale6
  libavdevice59 libavfilter8``): ``VideoDecoder(seek_mode=exact|approximate).get_frames_at`` of the
  same indices, FFmpeg threads auto (``num_ffmpeg_threads=0``), overview and middle crop, checked frame-exact too.

A variable-rate file of the same length (``--vfr-minutes``: a 30 fps timeline with every 5th frame
dropped, pts in 1/90000 s, the same 24 frames/s on average and the same encoder settings) is timed
the same way with the default reader (the packet index its timeline needs is built at open, inside
the timing); each frame is checked to lie within one local frame interval of the time asked for and
to show its real time. ``vfr_vs_cfr``: the best of ``--repeat`` overview timings of the variable-rate
file over the best of the constant-rate file's, the two timed in turn.

Every PyAV result is checked frame-exact against the drawn numbers. Timings are wall-clock of one
run on this machine (2 cores); ratios are within the run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from _util import write_result  # benchmarks/_util.py: the script's folder is on sys.path
from paravt.core import video as V
from paravt.data.synthetic.render import read_frame_number, write_numbered_video

CACHE = Path(__file__).resolve().parent / ".cache"


def clock(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def seek_each(path: str, indices: list[int]) -> tuple[np.ndarray, int]:
    """The floor: for each target, seek to the keyframe before it and decode every frame to it."""
    r = V.VideoReader(path)
    d = r._decoders[0]
    out, decoded = [], 0
    for i in indices:
        d.seek(i)
        j, fr = d.next_frame(i, skip=False)
        assert j == i, (j, i)
        out.append(fr.to_ndarray(format="rgb24"))
    decoded = r.stats["decoded"]
    r.close()
    return np.stack(out), decoded


def bench_torchcodec(p: str, idx: list[int], info) -> dict:
    try:
        from torchcodec.decoders import VideoDecoder  # noqa: PLC0415
    except Exception as exc:  # noqa: BLE001 - not installed, or its FFmpeg libraries missing
        return {"torchcodec": f"not usable here: {type(exc).__name__}: {exc}"[:200]}
    mid = V.frame_indices(info.num_frames, info.fps, V.uniform_times(info.duration / 2, info.duration / 2 + 30, 16))
    res: dict = {}
    for mode in ("exact", "approximate"):
        for name, ix in (("overview", idx), ("crop16_middle", mid)):
            t, b = clock(lambda: VideoDecoder(p, seek_mode=mode, num_ffmpeg_threads=0, dimension_order="NHWC").get_frames_at(ix).data.numpy())
            res[f"torchcodec_{mode}_{name}_s"] = round(t, 2)
            res[f"torchcodec_{mode}_{name}_exact"] = [read_frame_number(x) for x in b] == list(ix)
    return res


def bench_file(path: Path, k: int) -> dict:
    p = str(path)
    V.READERS.clear()
    info = V.VideoReader(p).info
    idx = V.frame_indices(info.num_frames, info.fps, V.uniform_times(0.0, info.duration, k))
    res: dict = {"file": path.name, "size_mb": round(path.stat().st_size / 1e6, 1), "frames": info.num_frames,
                 "duration_s": info.duration, "k": k}

    t, n = clock(lambda: len(V.VideoReader(p).info.__dict__))
    res["probe_s"] = round(t, 3)
    import decord  # noqa: PLC0415
    t, arr = clock(lambda: decord.VideoReader(p).get_batch(idx).asnumpy())
    res["decord_get_batch_s"] = round(t, 2)
    t, _ = clock(lambda: V.sample_overview(p, k, backend="decord"))
    res["project_decord_s"] = round(t, 2)
    t, (floor_arr, floor_decoded) = clock(lambda: seek_each(p, idx))
    res["pyav_seek_each_s"], res["pyav_seek_each_decoded"] = round(t, 2), floor_decoded
    assert (floor_arr == arr).all()

    V.READERS.clear()
    t, frames = clock(lambda: V.sample_overview(p, k))
    r = V.open_reader(p)
    res["project_pyav_s"], res["project_pyav_decoded"], res["project_pyav_seeks"] = round(t, 2), r.stats["decoded"], r.stats["seeks"]
    got = [read_frame_number(np.asarray(f.image)) for f in frames]
    res["frame_exact"] = got == idx
    V.READERS.clear()
    t, raw = clock(lambda: V.open_reader(p).frames(idx))
    res["pyav_reader_no_resize_s"] = round(t, 2)
    res["pixels_equal_decord"] = bool((raw == arr).all())
    for name, (s, e) in {"start": (5, 35), "middle": (info.duration / 2, info.duration / 2 + 30),
                         "end": (info.duration - 40, info.duration - 10)}.items():
        V.READERS.clear()
        t, fr = clock(lambda: V.sample_crop(p, s, e))
        ok = [read_frame_number(np.asarray(f.image)) for f in fr] == [int(round(f.timestamp * info.fps)) for f in fr]
        res[f"crop16_{name}_s"], res[f"crop16_{name}_exact"] = round(t, 3), ok
        V.READERS.clear()
        t, _ = clock(lambda: V.sample_crop(p, s, e, backend="decord"))
        res[f"crop16_{name}_decord_s"] = round(t, 3)
    res.update(bench_torchcodec(p, idx, info))
    res["speedup_vs_decord_get_batch"] = round(res["decord_get_batch_s"] / res["project_pyav_s"], 2)
    res["vs_floor"] = round(res["project_pyav_s"] / res["pyav_seek_each_s"], 2)
    return res


def vfr_times(seconds: float) -> list[float]:
    """A 30 fps timeline with every 5th frame missing: 24 frames per second on average."""
    return [i / 30 for i in range(int(seconds * 30)) if i % 5 != 4]


def check_times(frames, times: list[float], asked: list[float]) -> tuple[bool, float, float]:
    """(every frame within one local frame interval of the time asked for, worst such error in s,
    worst gap between the time shown and the frame's real time in s)."""
    ok, worst, shown = True, 0.0, 0.0
    for f, want in zip(frames, asked):
        i = read_frame_number(np.asarray(f.image))
        local = max(times[min(i + 1, len(times) - 1)] - times[i], times[i] - times[max(i - 1, 0)])
        err = abs(times[i] - want)
        ok &= err <= local + 1e-6
        worst, shown = max(worst, err), max(shown, abs(f.timestamp - times[i]))
    return ok, round(worst, 4), round(shown, 4)


def bench_vfr_file(path: Path, times: list[float], k: int) -> dict:
    p = str(path)
    res: dict = {"file": path.name, "size_mb": round(path.stat().st_size / 1e6, 1), "frames": len(times), "k": k}
    V.READERS.clear()
    t, info = clock(lambda: V.VideoReader(p).info)
    res["probe_s"], res["duration_s"], res["fps"] = round(t, 3), round(info.duration, 3), round(info.fps, 3)
    V.READERS.clear()
    t, frames = clock(lambda: V.sample_overview(p, k))
    res["project_pyav_s"] = round(t, 2)
    res["in_bound"], res["worst_error_s"], res["worst_shown_gap_s"] = check_times(
        frames, times, V.uniform_times(0.0, info.duration, k))
    for name, (s, e) in {"start": (5, 35), "middle": (info.duration / 2, info.duration / 2 + 30),
                         "end": (info.duration - 40, info.duration - 10)}.items():
        V.READERS.clear()
        t, fr = clock(lambda: V.sample_crop(p, s, e))
        ok, worst, _ = check_times(fr, times, V.uniform_times(s, e, 16))  # 30 s at 1 fps: 16 frames, the cap
        res[f"crop16_{name}_s"], res[f"crop16_{name}_in_bound"] = round(t, 3), ok and len(fr) == 16
    return res


def alternate(cfr: Path, vfr: Path, k: int, repeat: int) -> dict:
    """The K-frame overview of the constant-rate and the variable-rate file of the same length, fresh
    readers, timed in turn ``repeat`` times; the best of each and their ratio (the turns share
    whatever else the machine is doing, so the ratio holds on a busy machine too)."""
    best = {"cfr": float("inf"), "vfr": float("inf")}
    for _ in range(repeat):
        for name, p in (("cfr", cfr), ("vfr", vfr)):
            V.READERS.clear()
            t, _ = clock(lambda: V.sample_overview(str(p), k))
            best[name] = min(best[name], t)
    return {"overview_best_cfr_s": round(best["cfr"], 2), "overview_best_vfr_s": round(best["vfr"], 2),
            "vfr_vs_cfr": round(best["vfr"] / best["cfr"], 3), "repeat": repeat}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=int, nargs="*", default=[10, 60])
    ap.add_argument("--vfr-minutes", type=int, nargs="*", default=[10])
    ap.add_argument("--repeat", type=int, default=3, help="turns of the constant- vs variable-rate comparison")
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--out", default="benchmarks/results/long_video.json")
    a = ap.parse_args(argv)
    out = {}
    for m in a.minutes:
        path = CACHE / f"numbered_720p_{m}min.mp4"
        if not path.exists():
            t, _ = clock(lambda: write_numbered_video(path, m * 60, progress=True))
            print(f"wrote {path} in {t:.0f} s", flush=True)
        out[f"{m}min"] = bench_file(path, a.k)
        print(out[f"{m}min"], flush=True)
    for m in a.vfr_minutes:
        path = CACHE / f"numbered_720p_{m}min_vfr.mp4"
        times = vfr_times(m * 60)
        if not path.exists():
            t, _ = clock(lambda: write_numbered_video(path, m * 60, times=times, progress=True))
            print(f"wrote {path} in {t:.0f} s", flush=True)
        r = bench_vfr_file(path, times, a.k)
        cfr = CACHE / f"numbered_720p_{m}min.mp4"
        if cfr.exists():
            r.update(alternate(cfr, path, a.k, a.repeat))
        out[f"{m}min_vfr"] = r
        print(r, flush=True)
    return write_result(a.out, out)


if __name__ == "__main__":
    sys.exit(main())
