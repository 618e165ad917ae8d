"""The trainer's log-probabilities of a token sequence: the one computation that the PPO ratio,
the KL terms, GTR's NLL, the logprob-gap metrics and the GPU numerics check all share."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from paravt.models.positions import mrope_positions


def forward_logps(model, input_ids: Sequence[int], images, processor, image_token_id: int, vision_ids: torch.Tensor,
                  temperature: float, device: torch.device, positions: Sequence[int] | None = None,
                  with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p of each next token, entropy) at every position of ``input_ids`` (position t predicts
    token t+1) under ``softmax(logits / temperature)`` with the vision placeholders banned: the
    distribution every engine samples from (they are never text), whose logprobs the engines report.

    ``positions`` (the positions whose next token the loss reads, e.g. a sample's policy tokens): the
    vocabulary projection runs on those rows only (``logits_to_keep``) and the outputs hold 0 elsewhere;
    None: every position. ``with_entropy=False`` (the reference model, proximal re-scores): no entropy."""
    ids = torch.tensor([list(input_ids)])
    grid = None
    kw: dict[str, Any] = {}
    if images is not None and len(images):
        pv, grid = images.tensors(processor)
        kw["pixel_values"], kw["image_grid_thw"] = pv.to(device), grid.to(device)
    # positions from the CPU ids: the model computing them from device ids reads them back (host syncs)
    kw["position_ids"] = mrope_positions(model, ids, image_token_id, grid).to(device)
    ids = ids.to(device)
    kw.update(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=(ids == image_token_id).long(),
              use_cache=False)
    n = ids.shape[1] - 1
    idx = None
    if positions is not None:
        idx = torch.as_tensor(list(positions), dtype=torch.long).to(device)
        kw["logits_to_keep"] = idx
    logits = model(**kw).logits.squeeze(0)  # a view: its backward allocates nothing
    return logps_from_logits(logits if idx is not None else logits[:-1], ids[0, 1:], vision_ids, temperature,
                             idx, n, with_entropy)


def logps_from_logits(logits: torch.Tensor, targets: torch.Tensor, vision_ids: torch.Tensor, temperature: float,
                      idx: torch.Tensor | None, n: int, with_entropy: bool = True
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p (and entropy) of ``targets[idx]`` from ``logits`` (one row per kept position, in ``idx``'s
    order; ``idx`` None: every one of the ``n`` positions), scattered into length-``n`` tensors."""
    logp, ent = kept_logps(logits, targets if idx is None else targets[idx], vision_ids, temperature, with_entropy)
    if idx is None:
        return logp, ent
    return scatter(logp, idx, n), None if ent is None else scatter(ent, idx, n)


def kept_logps(logits: torch.Tensor, targets: torch.Tensor, vision_ids: torch.Tensor, temperature: float,
               with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p (and entropy) of ``targets`` (one per row of ``logits``): 1-D, one value per row."""
    # One fp32 copy of the kept logits is all the graph keeps: scaled and masked in place, log p taken as
    # x_t - logsumexp(x) (no [T, V] log-softmax, no exp of it), the entropy (a metric) without a graph
    # in chunks. At 8B (V = 151,936) over 6,000 kept positions that is ~3.6 GB instead of ~6x that.
    logits = logits.to(torch.float32, copy=True).div_(max(temperature, 1e-6))
    vis = vision_ids.to(logits.device)
    logits.index_fill_(1, vis, float("-inf"))
    lse = torch.logsumexp(logits, -1)
    logp = logits.gather(1, targets[:, None]).squeeze(1) - lse
    # context positions followed by an image placeholder (never a policy token): a finite 0, so masked
    # sums and ratios stay finite
    logp = torch.where(torch.isin(targets, vis), torch.zeros_like(logp), logp)
    ent = entropy(logits.detach(), lse.detach()) if with_entropy else None
    return logp, ent


def scatter(values: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    """A length-``n`` tensor holding ``values`` at ``idx`` and 0 elsewhere (differentiable in ``values``)."""
    return torch.zeros(n, dtype=values.dtype, device=values.device).index_put((idx,), values)


@torch.no_grad()
def entropy(logits: torch.Tensor, lse: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Entropy of softmax(logits) per row, ``chunk`` rows at a time (one [chunk, V] temporary)."""
    out = torch.empty(logits.shape[0], dtype=logits.dtype, device=logits.device)
    for i in range(0, logits.shape[0], chunk):
        lp = logits[i:i + chunk] - lse[i:i + chunk, None]
        p = lp.exp()
        out[i:i + chunk] = -torch.where(p > 0, p * lp, torch.zeros_like(p)).sum(-1)
    return out
