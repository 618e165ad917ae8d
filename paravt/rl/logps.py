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
    logits = model(**kw).logits[0, :-1].float() / max(temperature, 1e-6)
    logits = logits.index_fill(1, vision_ids.to(logits.device), float("-inf"))
    target = ids[0, 1:]
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(1, target[:, None]).squeeze(1)
    # context positions followed by an image placeholder (never a policy token): a finite 0, so masked
    # sums and ratios stay finite
    logp = torch.where(torch.isin(target, vision_ids.to(target.device)), torch.zeros_like(logp), logp)
    p_all = logp_all.exp()
    ent = -torch.where(p_all > 0, p_all * logp_all, torch.zeros_like(p_all)).sum(-1)
    return logp, ent
