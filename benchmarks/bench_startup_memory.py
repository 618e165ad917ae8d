"""Peak host memory per rank when a trainer loads its model onto 2 FSDP2 ranks (gloo, CPU):
sharded start-up (meta init, rank 0 reads the checkpoint, each rank receives its shards:
``parallel.load_fsdp2``) against loading the whole model on every rank and then sharding it.

A widened tiny Qwen3-VL (~215 M parameters, fp32 ~0.86 GB) stands in for the 8B; each mode runs in
fresh processes and reports every rank's peak RSS (``ru_maxrss``) after loading, and the RSS before
loading (the interpreter, torch and transformers). Usage:

    .venv-cpu/bin/python benchmarks/bench_startup_memory.py [--layers 13] [--out benchmarks/results/startup_memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rank_main(model: str, sharded: bool, out: str) -> None:
    import torch

    from paravt.models import parallel

    d = parallel.init_distributed()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    m = parallel.load_fsdp2(model, d, dtype="float32", sharded=sharded)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in m.parameters())
    import torch.distributed as dist

    gathered = [None] * d.world_size
    dist.all_gather_object(gathered, {"rank": d.rank, "rss_before_mb": round(before), "peak_rss_mb": round(peak),
                                      "local_params": local})
    if d.is_main:
        Path(out).write_text(json.dumps(gathered))
    dist.destroy_process_group()
    del torch  # imported first so "before" counts it


def main(argv: list[str] | None = None) -> int:
    from _util import write_result  # noqa: PLC0415

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=13)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/startup_memory.json"))
    a = p.parse_args(argv)
    from paravt.models.tiny import TinyShape, build_tiny

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "wide"
        shape = TinyShape(hidden_size=1024, num_hidden_layers=a.layers, num_attention_heads=8, num_key_value_heads=2,
                          intermediate_size=5120)
        stats = build_tiny(model, seed=0, shape=shape, progress=False)
        n_params = stats.get("params") or stats.get("parameters")
        res = {"machine": os.uname().machine, "cores": os.cpu_count(), "params": n_params,
               "checkpoint_mb": round(sum(f.stat().st_size for f in model.glob("*.safetensors")) / 2**20), "modes": {}}
        for mode in ("whole", "sharded"):
            out = Path(tmp) / f"{mode}.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__,
                   "--rank-main", str(model), mode, str(out)]
            r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if r.returncode:
                print(r.stderr[-3000:], file=sys.stderr)
                return 1
            res["modes"][mode] = json.loads(out.read_text())
    return write_result(a.out, res)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        rank_main(sys.argv[2], sys.argv[3] == "sharded", sys.argv[4])
        sys.exit(0)
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
