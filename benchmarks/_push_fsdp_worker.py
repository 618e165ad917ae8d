"""One trainer rank of ``bench_weight_sync.py --part fsdp`` (run under ``torchrun --nproc_per_node=2``).

Qwen3-VL-8B at full width (``--layers`` text layers, the full vision tower, a ``--vocab``-token
vocabulary), built on the meta
device, sharded with the trainer's own FSDP2 wrapping over gloo and filled with seeded random fp32
shards: every rank holds half of each parameter, as the 8B trainer does. Trainer rank 0 then pushes
the policy to one receiver (another process, a member of the weight group) in bf16, ``--repeats``
times per arm, arms alternating:

* ``before``: each parameter gathered in fp32, then cast to bf16, packed into a fresh bucket, sent;
  the next bucket's gathers wait for the send (the project's push before the change).
* ``after``: the project's push as the trainer runs it: shards cast to bf16 before the gather
  (:func:`paravt.models.parallel.weight_buckets`), packed into two reused buffers, the next bucket
  gathered while the current one is sent (:class:`paravt.engines.weight_push.BroadcastPush`).

* ``cast_only``: ``before`` with the shards cast to bf16 before the gather (what the cast alone buys).

The receiver allocates each bucket from the plan; rank 0 writes the seconds per push of each arm as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import textwrap
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECEIVER = textwrap.dedent("""
    import json, os, sys, time, torch
    from paravt.core.weight_sync import TensorMeta, broadcast, init_weight_group
    addr, port, rank, world, name, tmp = sys.argv[1:7]
    g = init_weight_group(addr, int(port), int(rank), int(world), name, "gloo", 900)
    n = 0
    while True:
        plan_file = os.path.join(tmp, f"plan{n}.json")
        while not os.path.exists(plan_file):
            if os.path.exists(os.path.join(tmp, "stop")):
                sys.exit(0)
            time.sleep(0.005)
        plan = [[TensorMeta.from_json(m) for m in b] for b in json.load(open(plan_file))]
        for metas in plan:
            flat = torch.empty(sum(m.nbytes for m in metas), dtype=torch.uint8)
            broadcast(g, flat, 900)
            del flat
        open(os.path.join(tmp, f"done{n}"), "w").close()
        n += 1
""")


class Receiver:
    """The receiving process, driven as :class:`BroadcastPush` drives a rollout server's client."""

    def __init__(self, tmp: Path):
        self.tmp, self.proc, self.receiving, self.n = tmp, None, None, 0

    async def weight_workers(self) -> int:
        return 1

    async def init_weight_group(self, addr, port, offset, world, name, backend, timeout_s, join_timeout_s=None):
        self.proc = await asyncio.create_subprocess_exec(sys.executable, "-c", RECEIVER, addr, str(port), str(offset),
                                                         str(world), name, str(self.tmp),
                                                         env={**os.environ, "PYTHONPATH": str(ROOT)})

    def announce(self, plan) -> None:
        tmp = self.tmp / "plan.tmp"
        tmp.write_text(json.dumps([[m.to_json() for m in b] for b in plan]))
        os.replace(tmp, self.tmp / f"plan{self.n}.json")

    def wait_done(self) -> None:
        while not (self.tmp / f"done{self.n}").exists():
            time.sleep(0.005)
        self.n += 1

    async def begin_broadcast(self, plan, version, group_name):
        self.announce(plan)

    def bucket_request(self, index):
        return None

    async def end_broadcast(self, version, ok=True):
        await asyncio.to_thread(self.wait_done)


def build(layers: int, vocab: int, d):
    from transformers import AutoModelForImageTextToText

    from paravt.models import parallel
    from paravt.models.reference_shapes import qwen3vl_8b_config

    config = qwen3vl_8b_config(num_hidden_layers=layers)
    # The embedding and lm_head at the full 151,936-token vocabulary are 2.5 GB each in fp32: gathered
    # in fp32 (the "before" arm) beside gloo's copies they exhaust a 24 GB machine. A 32,768-token
    # vocabulary keeps every other shape; rates are per parameter.
    config.text_config.vocab_size = vocab
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    model = parallel.wrap_fsdp2(model, d)
    model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(1000 + d.rank)
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().uniform_(-0.05, 0.05, generator=g)
    return model


def push_before(model, plan, group, is_main: bool, receiver: Receiver | None, cast_first: bool = False) -> None:
    """Gather fp32, cast, pack into a fresh tensor, send; one bucket after the other. ``cast_first``:
    the same, but each shard cast to bf16 before its gather (the cast alone, without the overlap)."""
    from paravt.core.weight_sync import broadcast, flatten

    if is_main:
        receiver.announce(plan)
    params = iter(model.named_parameters())
    for metas in plan:
        tensors = []
        for _ in metas:
            _, p = next(params)
            t = p.detach().to(torch.bfloat16).full_tensor() if cast_first else p.detach().full_tensor().to(torch.bfloat16)
            if is_main:
                tensors.append(t)
        if is_main:
            flat = flatten(tensors)
            del tensors
            broadcast(group, flat, 900)
            del flat
    if is_main:
        receiver.wait_done()


def main() -> None:
    from paravt.engines.weight_push import BroadcastPush
    from paravt.models import parallel

    a = argparse.ArgumentParser()
    a.add_argument("--layers", type=int, default=6)
    a.add_argument("--vocab", type=int, default=32768)
    a.add_argument("--bucket-mb", type=int, default=1024)
    a.add_argument("--repeats", type=int, default=2)
    a.add_argument("--tmp", required=True)
    a.add_argument("--out", required=True)
    args = a.parse_args()
    d = parallel.init_distributed()
    t0 = time.perf_counter()
    model = build(args.layers, args.vocab, d)
    built = time.perf_counter() - t0
    receiver = Receiver(Path(args.tmp)) if d.is_main else None
    bp = BroadcastPush("gloo", "127.0.0.1", 900, join_timeout_s=120) if d.is_main else None
    times: dict[str, list[float]] = {"after": [], "before": [], "cast_only": []}
    plan = None
    for r in range(args.repeats + 1):  # round 0 is a warm-up (it forms the group)
        for arm in ("after", "before", "cast_only"):
            dist.barrier()
            t = time.perf_counter()
            if arm == "after":
                buckets = parallel.weight_buckets(model, torch.bfloat16, args.bucket_mb << 20, d.is_main)
                plan = buckets.plan
                if d.is_main:
                    asyncio.run(bp.push([receiver], ["http://127.0.0.1:1"], buckets, r))
                buckets.drain()
            else:
                push_before(model, plan, bp.group if d.is_main else None, d.is_main, receiver, arm == "cast_only")
            dist.barrier()
            if r:
                times[arm].append(time.perf_counter() - t)
    if d.is_main:
        (Path(args.tmp) / "stop").touch()
        nbytes = sum(m.nbytes for b in plan for m in b)
        params = sum(p.numel() for p in model.parameters())
        Path(args.out).write_text(json.dumps({"params": params, "bf16_bytes_gb": round(nbytes / 1e9, 3),
                                              "buckets": len(plan), "build_s": round(built, 1), "times_s": times}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
