"""Run under ``torchrun --nproc_per_node=2`` by test_sharded_startup.py (gloo on CPU).

Loads the model at argv[1] twice through :func:`paravt.models.parallel.load_fsdp2`: sharded (meta
init, rank 0 reads, shards broadcast) and whole on every rank; trains each 2 AdamW steps on the same
batch; writes (on rank 0) a JSON of both runs' losses, whether every weight is bitwise equal after
the steps, and whether the broadcast buckets of the sharded model hold exactly the full weights."""

import json
import sys

import torch
import torch.distributed as dist

from paravt.core.weight_sync import unflatten
from paravt.models import parallel


def two_steps(model, ids):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    model.train()
    for _ in range(2):
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
    return losses


def full(model):
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for n, p in model.named_parameters()}


def main():
    path, out = sys.argv[1], sys.argv[2]
    d = parallel.init_distributed()
    torch.manual_seed(0)
    ids = torch.randint(10, 400, (1, 48))
    sharded = parallel.load_fsdp2(path, d, dtype="float32", sharded=True)
    whole = parallel.load_fsdp2(path, d, dtype="float32", sharded=False)
    same_start = all(torch.equal(a, b) for a, b in zip(full(sharded).values(), full(whole).values()))
    bufs_equal = all(torch.equal(a, b) for (_, a), (_, b) in zip(sharded.named_buffers(), whole.named_buffers()))
    la, lb = two_steps(sharded, ids), two_steps(whole, ids)
    fa, fb = full(sharded), full(whole)
    same_end = list(fa) == list(fb) and all(torch.equal(fa[k], fb[k]) for k in fa)
    # the weight-sync buckets of the sharded model = its full weights (gathered on every rank, kept on rank 0)
    buckets = parallel.weight_buckets(sharded, torch.float32, 64 << 10, d.is_main)
    got = {}
    for metas, flat in zip(buckets.plan, buckets):
        if d.is_main:
            got.update({k: v.clone() for k, v in unflatten(flat, metas)})
    if d.is_main:
        buckets_ok = list(got) == list(fa) and all(torch.equal(got[k], fa[k]) for k in fa)
        json.dump({"losses_sharded": la, "losses_whole": lb, "same_start": same_start, "same_end": same_end,
                   "buffers_equal": bufs_equal, "buckets_ok": buckets_ok, "n_buckets": len(buckets.plan)},
                  open(out, "w"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
