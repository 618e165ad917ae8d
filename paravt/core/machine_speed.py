"""This machine's speed as one figure, so wall-clock times from different machines compare.

CPU machines of the same name differ more than 2x in speed from one day to the next, so a wall-clock time
means little without the speed of the machine that took it. The figure is fp32 1024 x 1024 matrix products
on 2 threads, in GFLOP/s: the median of 5 runs of 2 s each, after 3 warm-up products. The quickstart
measures it when it starts and prints it in its report's header beside the stage times.

    python -m paravt.core.machine_speed                    -> machine_speed_gflops=168.2 cpu='AMD EPYC' threads=2 cpus=2
    python -m paravt.core.machine_speed --out speed.json   (also writes the figures as JSON)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def measure(threads: int = 2, seconds: float = 2.0, repeats: int = 5, size: int = 1024) -> dict[str, Any]:
    """GFLOP/s of fp32 ``size`` x ``size`` matrix products on ``threads`` threads: the median of ``repeats``
    runs of ``seconds`` each. Also returns each run's figure, the CPU's name and the CPUs this process may use
    (fewer than ``threads`` under taskset or a container's cpuset, and then the figure says so)."""
    import torch

    if threads < 1 or seconds <= 0 or repeats < 1 or size < 1:
        raise ValueError(f"machine_speed: threads, seconds, repeats and size must be positive "
                         f"(got {threads}, {seconds}, {repeats}, {size})")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
        for _ in range(3):
            a @ b
        runs = []
        for _ in range(repeats):
            t, n = time.perf_counter(), 0
            while time.perf_counter() - t < seconds:
                a @ b
                n += 1
            runs.append(2 * size**3 * n / (time.perf_counter() - t) / 1e9)
    finally:
        torch.set_num_threads(before)
    return {"machine_speed_gflops": round(statistics.median(runs), 1), "runs_gflops": [round(r, 1) for r in runs],
            "cpu": cpu_name(), "threads": threads, "cpus_available": len(os.sched_getaffinity(0)),
            "method": f"fp32 {size}x{size} matmul, median of {repeats} x {seconds:g} s",
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}


def describe(res: dict[str, Any]) -> str:
    """One line for a report's header."""
    return (f"{res['machine_speed_gflops']} GFLOP/s ({res['method']}, {res['threads']} threads; "
            f"{res['cpus_available']} CPUs available; {res['cpu']}; measured {res['measured_at']})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m paravt.core.machine_speed", description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="threads for the products (default 2)")
    ap.add_argument("--seconds", type=float, default=2.0, help="length of each timed run (default 2 s)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs; the median is reported (default 5)")
    ap.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    a = ap.parse_args(argv)
    try:
        res = measure(a.threads, a.seconds, a.repeats)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"machine_speed_gflops={res['machine_speed_gflops']} cpu='{res['cpu']}' threads={res['threads']} "
          f"cpus={res['cpus_available']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
