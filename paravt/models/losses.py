"""The SFT loss's forward: logits only where the loss reads them.

A pack's supervised tokens (the assistant turns) are a minority of its length: the 8B GPU check's
pack holds 8,519 positions of which 32 are supervised, and the vocabulary projection at every
position plus its fp32 copy is 8,519 × 151,936 × (2 + 4) bytes ≈ 7.8 GB. transformers'
``logits_to_keep`` (a boolean mask over the positions) runs ``lm_head`` on the positions whose next
token is supervised only; the cross entropy over them is the same sum. A packed row (one row with
``position_ids`` and no attention mask, :func:`paravt.sft.data.collate_packed`) runs through
:func:`paravt.models.packed_attention.packed_call`: its sequence bounds computed once, no (L × L) mask.
"""

from __future__ import annotations

import torch

from paravt.models.packed_attention import packed_call


def is_packed_row(batch: dict) -> bool:
    return batch["input_ids"].shape[0] == 1 and "position_ids" in batch and "attention_mask" not in batch


def supervised_ce_sum(model, batch: dict[str, torch.Tensor], ignore_index: int = -100) -> tuple[torch.Tensor, int]:
    """Sum of next-token cross entropy over the supervised positions of ``batch`` (``labels`` popped),
    and their count. Position t predicts token t+1; the logits exist at supervised positions only."""
    labels = batch.pop("labels")
    target = labels[:, 1:]
    sup = target != ignore_index
    keep = torch.nn.functional.pad(sup, (0, 1))  # the last position predicts nothing
    kw = dict(batch, use_cache=False, logits_to_keep=keep.to(batch["input_ids"].device))
    out = packed_call(model, **kw) if is_packed_row(batch) else model(**kw)
    logits = out.logits.float()  # (supervised positions, V), row-major over the batch
    ce = torch.nn.functional.cross_entropy(logits, target[sup].to(logits.device), reduction="sum")
    return ce, int(sup.sum())
