"""Run under ``torchrun --nproc_per_node=2`` by test_push_faults.py (gloo on CPU).

The trainer's broadcast push as ``RLTrainer._push_weights`` runs it, with packing failing on rank 0
at bucket 2 (an out-of-memory in ``flatten``): rank 0 stops sending and drains, rank 1 iterates
every bucket. Both must then meet in the next collective (a barrier with a short timeout) instead
of rank 1 waiting in a gather nobody else runs. Writes (rank 0) a JSON of what happened."""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from paravt.models import parallel


def main():
    path, out = sys.argv[1], sys.argv[2]
    d = parallel.init_distributed()
    model = parallel.load_fsdp2(path, d, dtype="float32", sharded=True)
    buckets = parallel.weight_buckets(model, torch.float32, 64 << 10, d.is_main)
    sent, error = 0, None
    if d.is_main:
        def pack(tensors, _flatten=buckets._pack):
            if sent == 2:
                raise MemoryError("flatten: out of memory (injected)")
            return _flatten(tensors)
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
    # the next collective of the step: every rank reaches it, well within the group's own timeout
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))
    dist.barrier(group=group)
    if d.is_main:
        json.dump({"sent": sent, "error": error, "n_buckets": len(buckets.plan)}, open(out, "w"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
