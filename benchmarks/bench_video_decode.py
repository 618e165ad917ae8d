"""Video decode + preprocessing throughput (the PyAV reader, decord) on the tiny world's mp4s.

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
from paravt.data.synthetic.render import write_video
from paravt.data.synthetic.world import WorldConfig, make_spec


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
    for backend in ("pyav", "decord"):
        def fresh(fn):  # a new reader each time: open + probe + decode, nothing cached
            V.READERS.clear()
            return fn()
        for k in (4, 16, 64):
            t, n = timeit(lambda: fresh(lambda: len(V.sample_overview(str(path), k, backend=backend))))
            res[f"{backend}_overview_K{k}"] = {"seconds": t, "frames_per_s": n / t}
        t, n = timeit(lambda: fresh(lambda: len(V.sample_crop(str(path), 30, 60, backend=backend))))
        res[f"{backend}_crop_16_frames"] = {"seconds": t, "frames_per_s": n / t}
    return write_result(a.out, res)


if __name__ == "__main__":
    sys.exit(main())
