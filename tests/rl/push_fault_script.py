"""Run under ``torchrun --nproc_per_node=2`` by test_push_faults.py (gloo on CPU): the trainer's
broadcast push as the trainer's :class:`EngineSync` runs it, over a tiny FSDP2 model sharded on both ranks.

``argv``: checkpoint, result JSON (written by rank 0), mode:

* ``pack_rank0`` — packing fails on rank 0 at bucket 3 (an out-of-memory in ``flatten``): rank 0
  stops sending and drains, rank 1 iterates every bucket; both must then meet in the next collective
  (a barrier with a short timeout) instead of rank 1 waiting in a gather nobody else runs.
* ``push`` — :meth:`EngineSync.push` (fp32 shards cast to bf16, then gathered;
  packed into two reused buffers while the previous bucket is on the wire) to two receivers in
  other processes, each a member of the weight group driven as :class:`BroadcastPush` drives a
  server. Each receiver saves what it got; rank 0 records when each receiver was paused.
* ``gather_rank1`` — rank 1's gather of bucket 3 fails (an out-of-memory in ``full_tensor``): rank 1
  ends the run with its line in the abort file and exit 3, without waiting for anyone; torchrun ends
  rank 0, which waits in the gather.
"""

import asyncio
import json
import os
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from paravt.models import parallel

RECEIVER = textwrap.dedent("""
    import json, os, sys, time, torch
    from paravt.core.weight_sync import TensorMeta, broadcast, init_weight_group, unflatten
    addr, port, rank, world, name, plan_file, out = sys.argv[1:8]
    g = init_weight_group(addr, int(port), int(rank), int(world), name, "gloo", 60)
    while not os.path.exists(plan_file):
        time.sleep(0.01)
    plan = [[TensorMeta.from_json(m) for m in b] for b in json.load(open(plan_file))]
    got = {}
    for metas in plan:
        flat = torch.empty(sum(m.nbytes for m in metas), dtype=torch.uint8)
        broadcast(g, flat, 60)
        got.update({k: v.clone() for k, v in unflatten(flat, metas)})
    torch.save(got, out)
""")


class LocalReceiver:
    """One member of the weight group in another process, driven as BroadcastPush drives a server."""

    def __init__(self, tmp: Path, k: int):
        self.plan_file, self.out, self.proc = tmp / f"plan{k}.json", tmp / f"got{k}.pt", None
        self.receiving = None
        self.paused = None

    async def weight_workers(self) -> int:
        return 1

    async def init_weight_group(self, addr, port, offset, world, name, backend, timeout_s, join_timeout_s=None):
        self.proc = await asyncio.create_subprocess_exec(sys.executable, "-c", RECEIVER, addr, str(port), str(offset),
                                                         str(world), name, str(self.plan_file), str(self.out))

    async def begin_broadcast(self, plan, version, group_name):
        start = time.monotonic()
        await asyncio.sleep(0.3)  # a server's pause takes a while: they must overlap, not queue
        self.paused = (start, time.monotonic())
        tmp = self.plan_file.with_suffix(".tmp")
        tmp.write_text(json.dumps([[m.to_json() for m in b] for b in plan]))
        os.replace(tmp, self.plan_file)
        self.receiving = asyncio.ensure_future(self.proc.wait())

    def bucket_request(self, index):
        return None

    async def end_broadcast(self, version, ok=True):
        if ok and await self.receiving != 0:
            raise RuntimeError(f"receiver {self.out.name} failed")


class Handle:
    def __init__(self, receivers):
        from paravt.engines.weight_push import BroadcastPush

        self.receivers = receivers
        self.broadcaster = BroadcastPush("gloo", "127.0.0.1", 60, join_timeout_s=60)

    def push_weights(self, buckets, version):
        asyncio.run(self.broadcaster.push(self.receivers, ["http://127.0.0.1:1"], buckets, version))


def trainer(model, dist_info, tmp):
    """The trainer's EngineSync of a recipe with a broadcast push (1 MiB buckets, gloo) to these receivers."""
    from paravt.core.config import load_config
    from paravt.rl.config import RLConfig
    from paravt.rl.engine_sync import EngineSync

    cfg = load_config(RLConfig, None, ["model_path=unused", "train_data=[unused.parquet]", "rollout.engine=sglang",
                                       "rollout.weight_sync=broadcast", "rollout.sync_backend=gloo",
                                       "rollout.sync_address=127.0.0.1", "rollout.bucket_mb=1",
                                       "rollout.sync_timeout_s=60", "rollout.control_timeout_s=60"])
    sync = EngineSync(cfg, dist_info, tmp, processor=None, save=lambda: "none (this script keeps no checkpoint)")
    assert sync.update.transport == "broadcast" and sync.update.bucket_bytes == 1 << 20
    sync.handle = Handle([LocalReceiver(tmp, 0), LocalReceiver(tmp, 1)]) if dist_info.is_main else None
    return sync


def main():
    path, out, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    d = parallel.init_distributed()
    model = parallel.load_fsdp2(path, d, dtype="float32", sharded=True)
    res = {}
    if mode == "pack_rank0":
        buckets = parallel.weight_buckets(model, torch.float32, 64 << 10, d.is_main)
        sent, error = 0, None
        if d.is_main:
            def pack(tensors, _flatten=buckets._pack, **kw):
                if sent == 2:
                    raise MemoryError("flatten: out of memory (injected)")
                return _flatten(tensors, **kw)
            buckets._pack = pack
            try:
                for _ in buckets:
                    sent += 1
            except MemoryError as exc:
                error = str(exc)
        else:
            for _ in buckets:
                pass
        buckets.drain()
        res = {"sent": sent, "error": error, "n_buckets": len(buckets.plan)}
    elif mode == "push":
        t = trainer(model, d, out.parent)
        t.push(model, 7)
        if d.is_main:
            want = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().to(torch.bfloat16)
                    for n, p in model.named_parameters()}
            got = [torch.load(r.out) for r in t.handle.receivers]
            res = {"exact": [list(g) == list(want) and all(torch.equal(g[k], want[k]) for k in want) for g in got],
                   "dtypes": sorted({str(v.dtype) for g in got for v in g.values()}),
                   "paused": [r.paused for r in t.handle.receivers], "n_tensors": len(want)}
        else:
            want = {n: p.full_tensor() for n, p in model.named_parameters()}  # rank 0's check gathers too
    elif mode == "gather_rank1":
        from paravt.models.stage_main import RunAborted, end_stopped_run

        real = parallel.weight_buckets

        def failing(*a, **kw):
            b = real(*a, **kw)
            gather = b._gather

            def g(i):
                if i == 2 and d.rank == 1:
                    raise torch.OutOfMemoryError("full_tensor: out of memory (injected on rank 1)")
                return gather(i)
            b._gather = g
            return b
        parallel.weight_buckets = failing
        t = trainer(model, d, out.parent)
        try:
            t.push(model, 7)
        except RunAborted as exc:
            end_stopped_run(exc, "push_fault_script", d.is_main)
        res = {"unexpected": "the push returned"}
    # the next collective of the step: every rank reaches it, well within the group's own timeout
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))
    dist.barrier(group=group)
    if d.is_main:
        json.dump(res, open(out, "w"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
