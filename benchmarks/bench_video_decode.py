"""Video decode + preprocessing throughput (decord, PyAV fallback) on synthetic mp4s.

    python benchmarks/bench_video_decode.py [--out benchmarks/results/video_decode.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _util import write_result  # benchmarks/_util.py: the script's folder is on sys.path
from paravt.core import video as V
from paravt.data.synthetic import WorldConfig, make_spec, write_video


def timeit(fn, repeats=5):
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/video_decode.json")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp())
    spec = make_spec(WorldConfig(min_duration=120, max_duration=120), "bench", 0)
    path = tmp / "v.mp4"
    t0 = time.perf_counter()
    write_video(spec, path)
    res = {"write_120s_video_s": time.perf_counter() - t0}
    for k in (4, 16, 64):
        t, n = timeit(lambda: len(V.sample_overview(str(path), k)))
        res[f"overview_K{k}"] = {"seconds": t, "frames_per_s": n / t}
    t, n = timeit(lambda: len(V.sample_crop(str(path), 30, 60)))
    res["crop_16_frames"] = {"seconds": t, "frames_per_s": n / t}
    V._decord_reader, orig = (lambda p: None), V._decord_reader  # force the PyAV fallback
    try:
        t, n = timeit(lambda: len(V.sample_overview(str(path), 64)), repeats=3)
        res["overview_K64_pyav"] = {"seconds": t, "frames_per_s": n / t}
    finally:
        V._decord_reader = orig
    return write_result(a.out, res)


if __name__ == "__main__":
    sys.exit(main())
