"""Varlen text attention for packed rows: ``sdpa_varlen`` (SDPA per sequence) and ``torch_varlen``
(PyTorch's varlen flash kernel on CUDA).

A packed row holds several sequences one after another; their text positions restart at 0
(``paravt.sft.data.collate_packed``, the RL trainer's packs). With ``sdpa`` transformers turns that
into one block-diagonal causal mask over the whole row, builds it as an (L × L) tensor and the kernel
still computes every block of the score matrix, masked or not: a cost of (Σ len)² instead of Σ len².

:func:`varlen_kwargs` reads the sequence bounds once per batch, on the host, from the row's text
positions (where a position does not follow its left neighbour by one: ``transformers.masking_utils``'
own packing detection) and returns the model keywords that carry them: transformers' flash-attention
varlen keywords (``cu_seq_lens_q/k``, ``max_length_q/k``: what ``flash_attention_2`` reads, and what
``torch_varlen`` passes to ``torch.nn.attention.varlen.varlen_attn``) and the bounds as Python ints
(``packed_bounds``, for per-sequence SDPA slicing without a host sync). :func:`packed_call` runs the
model with them and without the (L × L) mask: while it runs, the mask function registered for these
names returns no mask for a batch of one row. The keywords travel with the decoder layers' inputs, so
an activation-checkpointing recompute in backward sees the same bounds.

Without ``packed_bounds`` (generation, padded batches, a caller that passes a pack directly) the
attention falls back to transformers' SDPA with the mask it built, after detecting a pack in the
row's positions (one host read per layer: the slow, correct path).

``default_attn_implementation()`` (:mod:`paravt.models.loading`) picks ``flash_attention_2`` where
flash-attn is installed, else ``sdpa_varlen``. ``torch_varlen`` is opt-in: on CUDA it makes one
kernel call per layer for the whole pack (bf16/fp16); elsewhere it is ``sdpa_varlen``. ``varlen_attn``'s
keywords changed between torch releases, so the call passes only those the installed one accepts and
does the rest by hand (GQA, the softmax scale); what it cannot express (a sliding window on a torch
without ``window_size``) goes to the per-sequence SDPA path, with one warning.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import math
import warnings
from typing import Any

import torch

NAME = "sdpa_varlen"
TORCH_VARLEN = "torch_varlen"
BOUNDS_KWARG = "packed_bounds"
# implementations that attend within each packed sequence at Σ len² cost (plain sdpa/eager: (Σ len)²)
VARLEN_IMPLEMENTATIONS = (NAME, TORCH_VARLEN, "flash_attention_2")

_WARNED: set[str] = set()  # messages already warned about, once per process

_NO_PACK_MASK: contextvars.ContextVar[bool] = contextvars.ContextVar("paravt_no_pack_mask", default=False)
_LEFT_PADS: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar("paravt_left_pads", default=None)


def sequence_starts(position_ids: torch.Tensor) -> list[int]:
    """Start offsets of the packed sequences in one row of text positions (always includes 0), by
    transformers' own packing detection (``masking_utils.find_packed_sequence_indices``)."""
    from transformers.masking_utils import find_packed_sequence_indices  # noqa: PLC0415

    seq = find_packed_sequence_indices(position_ids.reshape(1, -1))
    if seq is None:
        return [0]
    _, counts = torch.unique_consecutive(seq[0], return_counts=True)
    return [0] + torch.cumsum(counts, 0)[:-1].tolist()


def text_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """The text-position row of a batch of one row: ``(4, 1, L)`` Qwen3-VL positions (text row first)
    or ``(1, L)`` plain positions."""
    if position_ids.ndim == 3:
        if position_ids.shape[0] != 4:
            raise ValueError("packed Qwen3-VL positions must be (4, 1, L): text row + M-RoPE")
        return position_ids[0, 0]
    return position_ids.reshape(-1)


def varlen_kwargs(position_ids: torch.Tensor, device: torch.device | str | None = None) -> dict[str, Any]:
    """The keywords that carry one packed row's sequence bounds to every attention layer, computed once
    (one host read of the positions)."""
    pos = text_positions(position_ids.detach().cpu())
    starts = sequence_starts(pos)
    bounds = tuple(starts) + (int(pos.numel()),)
    cu = torch.tensor(bounds, dtype=torch.int32, device=device if device is not None else position_ids.device)
    longest = max(e - s for s, e in zip(bounds, bounds[1:]))
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest,
            BOUNDS_KWARG: bounds}


@contextlib.contextmanager
def no_pack_mask():
    """While inside, the mask functions of ``sdpa_varlen``/``torch_varlen`` build no mask for a batch of
    one row (the attention reads ``packed_bounds`` instead). Per thread (a context variable)."""
    token = _NO_PACK_MASK.set(True)
    try:
        yield
    finally:
        _NO_PACK_MASK.reset(token)


def packed_call(model, **inputs):
    """``model(**inputs)`` for one packed row (``position_ids`` required): bounds once, no (L × L) mask."""
    kw = varlen_kwargs(inputs["position_ids"], inputs["input_ids"].device)
    inputs.pop("attention_mask", None)
    with no_pack_mask():
        return model(**inputs, **kw)


@contextlib.contextmanager
def left_padded(pads: list[int] | tuple[int, ...]):
    """While inside, a causal forward over the whole of a left-padded batch from its first position (a
    generation's prefill: as many queries as keys) attends row by row over each row's own tokens, ``pads[i]``
    padding positions skipped, with SDPA's causal kernel and no mask; the padding positions' outputs are
    zeros. transformers would build a (batch, 1, L, L) mask and SDPA would compute every block of it, masked
    or not: ~3.8x the time at L = 3,700 (benchmarks/README.md). Rows without padding get the same numbers as
    with the mask; padded rows differ in the last float bits (another kernel). Later forwards (one query a
    row: decoding) keep transformers' mask. Per thread (a context variable)."""
    token = _LEFT_PADS.set(tuple(int(p) for p in pads))
    try:
        yield
    finally:
        _LEFT_PADS.reset(token)


def _is_left_padded_prefill(batch: int, q_length: int, kv_length: int) -> bool:
    """A prefill of the batch :func:`left_padded` describes, with some padding (without any, transformers'
    own path is already one causal call for the whole batch)."""
    pads = _LEFT_PADS.get()
    return pads is not None and len(pads) == batch and q_length == kv_length > 1 and any(pads)


def _mask(*args, batch_size: int = 1, **kwargs):
    from transformers.masking_utils import sdpa_mask  # noqa: PLC0415

    if _NO_PACK_MASK.get() and batch_size == 1:
        return None
    if (_is_left_padded_prefill(batch_size, kwargs.get("q_length", -1), kwargs.get("kv_length", -2))
            and not kwargs.get("q_offset") and not kwargs.get("kv_offset")):
        return None  # the attention reads the rows' padding from left_padded()
    return sdpa_mask(*args, batch_size=batch_size, **kwargs)


def _left_padded_rows(module, query, key, value, dropout, scaling, **kwargs):
    """Causal SDPA per row over its tokens after its padding (:func:`left_padded`); (batch, L, heads, d)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: PLC0415

    out = query.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
    for b, p in enumerate(_LEFT_PADS.get()):
        if p < query.shape[2]:
            o, _ = sdpa_attention_forward(module, query[b:b + 1, :, p:], key[b:b + 1, :, p:], value[b:b + 1, :, p:],
                                          None, dropout=dropout, scaling=scaling, is_causal=True, **kwargs)
            out[b, p:] = o[0]
    return out


def _window_mask(length: int, window: int, device: torch.device) -> torch.Tensor:
    """(length × length) boolean mask: causal, and each query sees at most ``window`` keys (itself
    included), transformers' ``sliding_window`` convention."""
    i = torch.arange(length, device=device)
    offset = i[:, None] - i[None, :]
    return (offset >= 0) & (offset < window)


def _per_sequence(module, query, key, value, bounds, dropout, scaling, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: PLC0415

    window = kwargs.get("sliding_window")
    # One split per tensor, not a slice per sequence: a slice's backward writes a zero tensor of the whole
    # row for each sequence, the split's is one concatenation (the same gradient; a tiny SFT step ~5% faster).
    sizes = [e - s for s, e in zip(bounds, bounds[1:])]
    outs = []
    for n, q, k, v in zip(sizes, query.split(sizes, 2), key.split(sizes, 2), value.split(sizes, 2)):
        mask = None if window is None or window >= n else _window_mask(n, window, query.device)
        out, _ = sdpa_attention_forward(module, q, k, v, mask, dropout=dropout, scaling=scaling,
                                        is_causal=mask is None, **kwargs)
        outs.append(out)  # (batch, len, heads, head_dim)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


@functools.lru_cache(maxsize=None)
def _keywords(fn) -> frozenset[str]:
    """The parameter names of a ``varlen_attn``: they differ by torch release (2.9: ``is_causal``;
    2.10/2.11: ``scale``, ``window_size``; 2.12+: also ``enable_gqa``). Cached per function object."""
    return frozenset(inspect.signature(fn).parameters)


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _torch_varlen(module, query, key, value, kwargs, scaling):
    """One ``varlen_attn`` call over the whole row: q/k/v (1, heads, L, d) -> (1, L, heads, d), with only
    the keywords this torch's ``varlen_attn`` accepts; the others are done by hand (GQA: k/v heads
    repeated; scale: q pre-multiplied so the kernel's default 1/sqrt(d) gives it). None where this
    torch cannot express the attention (a sliding window, or no causal switch): the caller then takes
    the per-sequence SDPA path."""
    from torch.nn.attention import varlen  # noqa: PLC0415

    fn = varlen.varlen_attn
    accepts = _keywords(fn)
    window = kwargs.get("sliding_window")
    call: dict[str, Any] = {}
    if "window_size" in accepts:  # (left, right): (-1, 0) is causal, (W - 1, 0) a causal window of W keys
        call["window_size"] = (-1 if window is None else window - 1, 0)
    elif window is None and "is_causal" in accepts:
        call["is_causal"] = True
    else:
        what = "a sliding window" if window is not None else "causal attention"
        _warn_once(f"this torch's varlen_attn cannot express {what}: torch_varlen attends per sequence with SDPA")
        return None
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (L, heads, d)
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in accepts:
            call["enable_gqa"] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if scaling is not None:
        if "scale" in accepts:
            call["scale"] = scaling
        else:
            factor = scaling * math.sqrt(q.shape[-1])
            if not math.isclose(factor, 1.0, rel_tol=1e-6):
                q = q * factor
    out = fn(q, k.contiguous(), v.contiguous(), kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"],
             kwargs["max_length_q"], kwargs["max_length_k"], **call)
    return out[None]


def varlen_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             is_causal: bool | None = None, **kwargs):
    """transformers' attention-interface signature; q/k/v are (batch, heads, length, head_dim)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: PLC0415

    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    length = query.shape[2]
    single_row = causal and query.shape[0] == 1 and key.shape[2] == length
    bounds = kwargs.pop(BOUNDS_KWARG, None)
    if bounds is not None and single_row and bounds[-1] == length:
        kwargs.pop("position_ids", None)
        if (getattr(module.config, "_attn_implementation", None) == TORCH_VARLEN and query.is_cuda
                and query.dtype in (torch.bfloat16, torch.float16) and "cu_seq_lens_q" in kwargs):
            out = _torch_varlen(module, query, key, value, kwargs, scaling)
            if out is not None:
                return out, None
        return _per_sequence(module, query, key, value, bounds, dropout, scaling, **kwargs), None
    position_ids = kwargs.get("position_ids")
    if single_row and position_ids is not None and position_ids.numel() == length:
        starts = sequence_starts(position_ids)  # no bounds given: detect a pack (a host read per layer)
        if len(starts) > 1:
            kwargs.pop("position_ids", None)
            return _per_sequence(module, query, key, value, tuple(starts) + (length,), dropout, scaling,
                                 **kwargs), None
    if causal and attention_mask is None and _is_left_padded_prefill(query.shape[0], length, key.shape[2]):
        return _left_padded_rows(module, query, key, value, dropout, scaling, **kwargs), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def register() -> str:
    """Make ``attn_implementation="sdpa_varlen"`` and ``"torch_varlen"`` known to transformers (idempotent);
    returns the default name."""
    from transformers import AttentionInterface  # noqa: PLC0415
    from transformers.masking_utils import AttentionMaskInterface  # noqa: PLC0415

    for name in (NAME, TORCH_VARLEN):
        AttentionInterface.register(name, varlen_attention_forward)
        AttentionMaskInterface.register(name, _mask)
    return NAME
