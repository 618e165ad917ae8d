"""``sdpa_varlen``: PyTorch SDPA that attends within each packed sequence only.

A packed SFT row holds several sequences one after another; their text positions restart at 0
(``paravt.sft.data.collate_packed``). With ``sdpa`` transformers turns that into one
block-diagonal causal mask over the whole row, and the kernel still computes every block of the
(L × L) score matrix, masked or not: on CPU the text attention of a ~2,000-token pack was most of
an SFT step. This implementation finds the sequence starts in ``position_ids`` (where a position
does not follow its left neighbour by one: ``transformers.masking_utils``' own packing detection) and
runs causal SDPA on each sequence alone: the same attention (masked scores are exactly zero
weight either way), a cost of Σ len² instead of (Σ len)².

Everything else falls back to transformers' own ``sdpa`` path with the mask it built: a batch of
more than one row, a single sequence, a key/value cache (generation), the vision tower (it splits
its own windows). It is registered under one name for the attention and for the mask (the sdpa
mask), so ``attn_implementation="sdpa_varlen"`` selects both; ``default_attn_implementation()``
picks it where flash-attention-2 is not available.
"""

from __future__ import annotations

import torch

NAME = "sdpa_varlen"


def sequence_starts(position_ids: torch.Tensor) -> list[int]:
    """Start offsets of the packed sequences in one row of text positions (always includes 0), by
    transformers' own packing detection (``masking_utils.find_packed_sequence_indices``)."""
    from transformers.masking_utils import find_packed_sequence_indices  # noqa: PLC0415

    seq = find_packed_sequence_indices(position_ids.reshape(1, -1))
    if seq is None:
        return [0]
    _, counts = torch.unique_consecutive(seq[0], return_counts=True)
    return [0] + torch.cumsum(counts, 0)[:-1].tolist()


def sdpa_varlen_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                  attention_mask: torch.Tensor | None, dropout: float = 0.0,
                                  scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' attention-interface signature; q/k/v are (batch, heads, length, head_dim)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: PLC0415

    position_ids = kwargs.get("position_ids")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    length = query.shape[2]
    starts = None
    if (position_ids is not None and causal and query.shape[0] == 1 and key.shape[2] == length
            and position_ids.numel() == length):
        starts = sequence_starts(position_ids)
    if starts is None or len(starts) < 2:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    kwargs.pop("position_ids", None)
    outs = []
    for s, e in zip(starts, starts[1:] + [length]):
        out, _ = sdpa_attention_forward(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None,
                                        dropout=dropout, scaling=scaling, is_causal=True, **kwargs)
        outs.append(out)  # (batch, len, heads, head_dim)
    return torch.cat(outs, dim=1), None


def register() -> str:
    """Make ``attn_implementation="sdpa_varlen"`` known to transformers (idempotent); returns the name."""
    from transformers import AttentionInterface  # noqa: PLC0415
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: PLC0415

    AttentionInterface.register(NAME, sdpa_varlen_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
