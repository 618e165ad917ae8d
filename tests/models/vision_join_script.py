"""Run under ``torchrun --nproc_per_node=2`` by test_vision_join.py (gloo on CPU).

FSDP2 over two ranks on the tiny model at argv[1]: rank 0's batch shows an image, rank 1's is text only.
Each rank runs one training step (forward, backward, clip, AdamW) and writes ``<argv[2]>.<rank>`` (JSON):
its loss and the same batch's loss on the plain model (the same weights, no FSDP, no vision pass for a
text-only batch), how often its forward ran the vision tower, and whether every FSDP gradient equals the
mean over the ranks of the plain model's gradients (a parameter a rank's plain forward leaves without a
gradient counts 0 there)."""

import json
import sys

import torch
import torch.distributed as dist

from paravt.models import parallel
from paravt.models.loading import load_model
from paravt.models.losses import supervised_ce_sum


def batch(config, rank: int) -> dict[str, torch.Tensor]:
    text = torch.randint(10, 400, (16,), generator=torch.Generator().manual_seed(rank)).tolist()
    if rank == 1:  # text only
        ids = torch.tensor([text])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids,
                "mm_token_type_ids": torch.zeros_like(ids)}
    vis = config.vision_config
    grid = torch.tensor([[2, 4, 4]])  # two temporal patches of a 4 x 4 grid: 8 merged tokens
    merged = int(grid.prod()) // vis.spatial_merge_size ** 2
    ids = torch.tensor([text[:4] + [config.vision_start_token_id] + [config.image_token_id] * merged
                        + [config.vision_end_token_id] + text[4:]])
    pixels = torch.randn(int(grid.prod()), vis.in_channels * vis.temporal_patch_size * vis.patch_size ** 2,
                         generator=torch.Generator().manual_seed(7))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids, "pixel_values": pixels,
            "image_grid_thw": grid, "mm_token_type_ids": (ids == config.image_token_id).long()}


def main():
    path, out = sys.argv[1], sys.argv[2]
    d = parallel.init_distributed(timeout_s=60)  # a rank left alone in a collective fails within a minute
    model = parallel.load_fsdp2(path, d, dtype="float32")
    plain = load_model(path)
    b = batch(plain.config, d.rank)
    calls = []
    model.model.visual.register_forward_pre_hook(lambda m, a: calls.append(1))
    model.train()
    plain.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ce, n = supervised_ce_sum(model, dict(b))
    (ce / n).backward()
    ce_plain, _ = supervised_ce_sum(plain, dict(b))
    (ce_plain / n).backward()
    grads_match, worst = True, 0.0
    plain_params = dict(plain.named_parameters())
    for name, p in model.named_parameters():
        g = plain_params[name].grad
        mean = (g.clone() if g is not None else torch.zeros_like(plain_params[name])).contiguous()
        dist.all_reduce(mean)
        mean /= d.world_size
        got = p.grad.full_tensor() if p.grad is not None else torch.zeros_like(mean)
        worst = max(worst, float((got - mean).abs().max()))
        grads_match &= torch.allclose(got, mean, rtol=1e-4, atol=1e-6)
    parallel.clip_grad_norm(model.parameters(), 1.0)  # the rest of a training step: collectives too
    opt.step()
    res = {"rank": d.rank, "ce": float(ce.detach()), "ce_plain": float(ce_plain.detach()), "visual_calls": len(calls),
           "has_image": "pixel_values" in b, "grads_match": bool(grads_match), "worst_grad_diff": worst}
    with open(f"{out}.{d.rank}", "w") as fh:
        json.dump(res, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
