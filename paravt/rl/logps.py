"""The trainer's log-probabilities of a token sequence: the one computation that the PPO ratio,
the KL terms, GTR's NLL, the logprob-gap metrics and the GPU numerics check all share."""

from __future__ import annotations

from typing import Any, Sequence

import torch


def forward_logps(model, input_ids: Sequence[int], images, processor, image_token_id: int, vision_ids: torch.Tensor,
                  temperature: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p of each next token, entropy) at every position of ``input_ids`` (position t predicts
    token t+1) under ``softmax(logits / temperature)`` with the vision placeholders banned: the
    distribution every engine samples from (they are never text), whose logprobs the engines report."""
    ids = torch.tensor([list(input_ids)], device=device)
    kw: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                          "mm_token_type_ids": (ids == image_token_id).long(), "use_cache": False}
    if images is not None and len(images):
        pv, grid = images.tensors(processor)
        kw["pixel_values"], kw["image_grid_thw"] = pv.to(device), grid.to(device)
    # One fp32 copy of the logits is all the graph keeps: scaled and masked in place, log p taken as
    # x_t - logsumexp(x) (no [T, V] log-softmax, no exp of it), the entropy (a metric) without a graph
    # in chunks. At 8B (V = 151,936) over a 6,000-token sequence that is ~3.6 GB instead of ~6x that.
    logits = model(**kw).logits[0, :-1].to(torch.float32, copy=True).div_(max(temperature, 1e-6))
    vis = vision_ids.to(logits.device)
    logits.index_fill_(1, vis, float("-inf"))
    target = ids[0, 1:]
    lse = torch.logsumexp(logits, -1)
    logp = logits.gather(1, target[:, None]).squeeze(1) - lse
    # context positions followed by an image placeholder (never a policy token): a finite 0, so masked
    # sums and ratios stay finite
    logp = torch.where(torch.isin(target, vis), torch.zeros_like(logp), logp)
    return logp, entropy(logits.detach(), lse.detach())


@torch.no_grad()
def entropy(logits: torch.Tensor, lse: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Entropy of softmax(logits) per row, ``chunk`` rows at a time (one [chunk, V] temporary)."""
    out = torch.empty(logits.shape[0], dtype=logits.dtype, device=logits.device)
    for i in range(0, logits.shape[0], chunk):
        lp = logits[i:i + chunk] - lse[i:i + chunk, None]
        p = lp.exp()
        out[i:i + chunk] = -torch.where(p > 0, p * lp, torch.zeros_like(p)).sum(-1)
    return out
