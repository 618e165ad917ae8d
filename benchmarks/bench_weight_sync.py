"""Seconds per weight push: ``disk`` (an HF export the server reloads) against ``broadcast``
(buckets over a process group), two parts.

* ``--part tiny``: the tiny model (fp32, as the CPU recipe trains it) pushed to a REAL vLLM rollout
  server (CPU build, ``.venv-vllm``) through the project's own clients, ``--repeats`` times each;
  ``disk`` = export_hf + reload, ``broadcast`` = bucket gathers + the transfer + load. The server is
  checked to hold each version.
* ``--part 8b``: a state dict with Qwen3-VL-8B's parameter names and shapes (random bf16, ~17.5 GB in
  all, made and dropped bucket by bucket: no machine here holds it twice) sent from one local process
  to another over gloo with :mod:`paravt.core.weight_sync`. Reported: transfer GB/s, and the
  host-side work around it (making the bucket stands in for gather + cast; packing into the flat
  bucket; the receiver's unpacking into named tensors) that a GPU node pays in device memory instead.

    .venv-cpu/bin/python benchmarks/bench_weight_sync.py --part tiny --model runs/quickstart/sft/final
    .venv-cpu/bin/python benchmarks/bench_weight_sync.py --part 8b [--bucket-mb 1024]
    .venv-cpu/bin/python benchmarks/bench_weight_sync.py --part fsdp --repeats 3 [--layers 6]

* ``--part fsdp``: two FSDP2 trainer ranks holding Qwen3-VL-8B at full width (``--layers`` text
  layers, the whole vision tower, a 32,768-token vocabulary; fp32 shards, as the trainer keeps them) push bf16 to one receiver
  over the weight group, the push as it was (gather fp32, cast, fresh bucket, no overlap) against
  the push as the trainer runs it (cast before the gather, two reused buffers, next gather
  overlapping the send). Seconds per push, and scaled per parameter to 8.77 B.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def part_tiny(model: str, repeats: int, python: str) -> dict:
    import torch

    from paravt.engines.factory import EngineHandle
    from paravt.engines.vllm import VLLMEngine, VLLMServer, VLLMServerConfig
    from paravt.engines.weight_update import WeightUpdate
    from paravt.models import parallel
    from paravt.models.loading import load_model, load_processor
    from paravt.models.tokenize import image_pad_id

    proc = load_processor(model)
    m = load_model(model, dtype="float32")
    d = parallel.init_distributed()
    res: dict = {"model_params": sum(p.numel() for p in m.parameters())}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = VLLMServerConfig(model_path=model, python=python, port=parallel.free_port(), dtype="float32",
                               enforce_eager=True, cpu_kvcache_space_gb=1, served_model_name="paravt-tiny", rollout=True,
                               log_file=f"{tmp}/vllm.log")
        srv = VLLMServer(cfg).start()
        try:
            h = EngineHandle("vllm", None, cfg.url, [srv], image_pad_id(proc.tokenizer), model_name="paravt-tiny")
            updates = {"disk": WeightUpdate.from_disk(), "broadcast": WeightUpdate.broadcast("gloo", timeout_s=120, join_timeout_s=120)}

            def held() -> int:
                async def go():
                    e = VLLMEngine(cfg.url, model="paravt-tiny")
                    try:
                        return await e.server_version()
                    finally:
                        await e.close()
                return asyncio.run(go())

            v = 0
            for mode in ("disk", "broadcast"):
                h.weight_update = updates[mode]
                times = []
                for _ in range(repeats + 1):  # the first is a warm-up (the group is created by broadcast's)
                    v += 1
                    t0 = time.perf_counter()
                    if mode == "disk":
                        path = parallel.export_hf(m, proc, Path(tmp) / f"v{v:06d}", d, dtype=torch.float32)
                        h.push_weights(path, v)
                    else:
                        h.push_weights(parallel.weight_buckets(m, torch.float32, 1 << 30, True), v)
                    times.append(time.perf_counter() - t0)
                    assert held() == v
                times = times[1:]
                res[mode] = {"median_s": round(statistics.median(times), 4), "min_s": round(min(times), 4),
                             "max_s": round(max(times), 4), "repeats": repeats}
            h.stop()
        finally:
            srv.stop()
    return res


def _receiver(port: int, plan_file: str, out_file: str) -> None:
    import torch

    from paravt.core.weight_sync import TensorMeta, broadcast, init_weight_group, unflatten

    plan = [[TensorMeta.from_json(m) for m in b] for b in json.loads(Path(plan_file).read_text())]
    g = init_weight_group("127.0.0.1", port, 1, 2, "bench", "gloo", 600)
    recv = unpack = 0.0
    for metas in plan:
        flat = torch.empty(sum(m.nbytes for m in metas), dtype=torch.uint8)
        t0 = time.perf_counter()
        broadcast(g, flat, 600)
        t1 = time.perf_counter()
        n = sum(t.numel() for _, t in unflatten(flat, metas))  # the loader's view of each tensor
        recv += t1 - t0
        unpack += time.perf_counter() - t1
        del flat, n
    Path(out_file).write_text(json.dumps({"recv_s": recv, "unpack_s": unpack}))


def part_8b(bucket_mb: int, layers: int) -> dict:
    import torch

    from paravt.core.weight_sync import TensorMeta, broadcast, flatten, init_weight_group, plan_buckets
    from paravt.models.parallel import free_port
    from paravt.models.reference_shapes import param_shapes, qwen3vl_8b_config

    shapes = param_shapes(qwen3vl_8b_config(num_hidden_layers=layers))
    plan = plan_buckets([TensorMeta(n, "bfloat16", s) for n, s in shapes], bucket_mb << 20)
    total = sum(m.nbytes for b in plan for m in b)
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "plan.json").write_text(json.dumps([[m.to_json() for m in b] for b in plan]))
        port = free_port()
        p = subprocess.Popen([sys.executable, __file__, "--receiver", str(port), f"{tmp}/plan.json", f"{tmp}/recv.json"],
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        g = init_weight_group("127.0.0.1", port, 0, 2, "bench", "gloo", 600)
        make = pack = send = 0.0
        gen = torch.Generator().manual_seed(0)
        t_all = time.perf_counter()
        for metas in plan:
            t0 = time.perf_counter()
            ts = [torch.empty(m.shape, dtype=torch.bfloat16).uniform_(-0.05, 0.05, generator=gen) for m in metas]
            t1 = time.perf_counter()
            flat = flatten(ts)
            del ts
            t2 = time.perf_counter()
            broadcast(g, flat, 600)
            t3 = time.perf_counter()
            del flat
            make, pack, send = make + t1 - t0, pack + t2 - t1, send + t3 - t2
        wall = time.perf_counter() - t_all
        assert p.wait(timeout=600) == 0
        recv = json.loads(Path(tmp, "recv.json").read_text())
    gb = total / 1e9
    return {"params": sum(int(torch.Size(s).numel()) for _, s in shapes), "bytes_gb": round(gb, 2),
            "tensors": len(shapes), "buckets": len(plan), "bucket_mb": bucket_mb, "text_layers": layers,
            "make_s (stands in for gather + cast)": round(make, 2), "pack_s": round(pack, 2),
            "send_s": round(send, 2), "send_gb_per_s": round(gb / send, 2), "recv_unpack_s": round(recv["unpack_s"], 2),
            "wall_s": round(wall, 2), "wall_minus_make_s": round(wall - make, 2)}


def part_fsdp(bucket_mb: int, layers: int, repeats: int) -> dict:
    """Two FSDP2 trainer ranks + one receiver at 8B width: the push before and after the bf16 cast
    moved ahead of the gather, the buffers were preallocated and the next gather overlapped the send
    (:mod:`_push_fsdp_worker`)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "res.json"
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(Path(__file__).with_name("_push_fsdp_worker.py")), "--layers", str(layers),
                        "--bucket-mb", str(bucket_mb), "--repeats", str(repeats), "--tmp", tmp, "--out", str(out)],
                       check=True, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
        res = json.loads(out.read_text())
    full = 8.77e9  # Qwen3-VL-8B's parameters: the per-parameter rate scaled to the whole model
    for arm, ts in res.pop("times_s").items():
        med = statistics.median(ts)
        res[arm] = {"median_s": round(med, 2), "runs_s": [round(t, 2) for t in ts],
                    "bf16_gb_per_s": round(res["bf16_bytes_gb"] / med, 3),
                    "scaled_to_8b_s": round(med * full / res["params"], 1)}
    res.update({"text_layers": layers, "bucket_mb": bucket_mb, "trainer_ranks": 2, "receivers": 1,
                "speedup": round(res["before"]["median_s"] / res["after"]["median_s"], 2)})
    return res


def main(argv: list[str] | None = None) -> int:
    from _util import write_result  # noqa: PLC0415

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["tiny", "8b", "fsdp"], required=True)
    p.add_argument("--model", default="runs/quickstart/sft/final", help="tiny: the checkpoint the server starts from")
    p.add_argument("--python", default=str(ROOT / ".venv-vllm/bin/python"), help="tiny: vLLM's interpreter")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--bucket-mb", type=int, default=1024)
    p.add_argument("--layers", type=int, default=None,
                   help="8b: text layers (default 36 = the full model); fsdp: text layers (default 6, 24 GB machines)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.part == "tiny":
        res = part_tiny(a.model, a.repeats, a.python)
    elif a.part == "8b":
        res = part_8b(a.bucket_mb, a.layers or 36)
    else:
        res = part_fsdp(a.bucket_mb, a.layers or 6, a.repeats)
    res.update({"machine": os.uname().machine, "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d")})
    return write_result(a.out or ROOT / f"benchmarks/results/weight_sync_{a.part}.json", res)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--receiver":
        _receiver(int(sys.argv[2]), sys.argv[3], sys.argv[4])
        sys.exit(0)
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
