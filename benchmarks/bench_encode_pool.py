"""Prompt encoding with 64 samples in flight: one encode worker vs several.

    python benchmarks/bench_encode_pool.py [--workers 1 2 4] [--n 64] [--out benchmarks/results/encode_pool.json]

Encodes ``n`` sub-agent prompts (16 crop frames each, the tiny model's processor) submitted at once
to a fresh ``ThreadPoolExecutor`` of each size (what ``PARAVT_ENCODE_WORKERS`` sets for
``paravt.models.tokenize.ENCODE_POOL``) and reports the wall time until all are encoded and until
the first one is. Three runs per size, the median kept.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _util import write_result  # benchmarks/_util.py: the script's folder is on sys.path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results/encode_pool.json"))
    a = p.parse_args(argv)
    from PIL import Image

    from paravt.core import prompts
    from paravt.core.video_reader import Frame
    from paravt.data.tool_specs import DATA_TOOL_SCHEMAS
    from paravt.models.loading import load_processor
    from paravt.models.tiny import build_tiny
    from paravt.models.tokenize import encode_prompt

    d = Path(tempfile.mkdtemp())
    build_tiny(d / "tiny", seed=0)
    proc = load_processor(d / "tiny")
    frames = [Frame(float(i), Image.new("RGB", (224, 224), (i * 10 % 255, 80, 160))) for i in range(16)]
    msgs = prompts.build_messages("agentic_general", "What happens in this window?", frames, "v.mp4", 120.0,
                                   tool_schemas=DATA_TOOL_SCHEMAS)

    def one():
        return encode_prompt(proc, msgs, "<think>\n")

    async def run(pool):
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        first = []
        futs = [loop.run_in_executor(pool, one) for _ in range(a.n)]
        for f in asyncio.as_completed(futs):
            await f
            if not first:
                first.append(time.perf_counter() - t0)
        return time.perf_counter() - t0, first[0]

    res = {"n": a.n, "cores": os.cpu_count(), "frames_per_prompt": 16}
    for w in a.workers:
        times = []
        for _ in range(3):
            with ThreadPoolExecutor(max_workers=w) as pool:
                times.append(asyncio.run(run(pool)))
        res[f"workers_{w}"] = {"all_s": round(statistics.median(t for t, _ in times), 3),
                               "first_s": round(statistics.median(f for _, f in times), 3)}
    return write_result(a.out, res)


if __name__ == "__main__":
    sys.exit(main())
