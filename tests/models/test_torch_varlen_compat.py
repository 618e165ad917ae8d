"""torch_varlen across torch releases: ``varlen_attn`` took ``is_causal`` only in torch 2.9, ``scale`` and
``window_size`` from 2.10, ``enable_gqa`` from 2.12. Stand-ins with those signatures (plain torch ops on
the CPU) must receive only keywords they accept and give the per-sequence SDPA path's output."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

from paravt.models import packed_attention as pa

BOUNDS = (0, 5, 9, 16)
HEADS, KV_HEADS, DIM = 8, 2, 16


def _attend(q, k, v, cu, scale, left):
    """Causal attention within each sequence of (L, heads, d) tensors; ``left`` >= 0: a window of
    ``left`` earlier keys plus the query's own."""
    outs = []
    for s, e in zip(cu.tolist(), cu.tolist()[1:]):
        scores = torch.einsum("qhd,khd->hqk", q[s:e], k[s:e]) * scale
        i = torch.arange(e - s)
        off = i[:, None] - i[None, :]
        keep = (off >= 0) & ((off <= left) if left >= 0 else True)
        outs.append(torch.einsum("hqk,khd->qhd", scores.masked_fill(~keep, float("-inf")).softmax(-1), v[s:e]))
    return torch.cat(outs)


def varlen_2_9(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    assert is_causal and query.shape[1] == key.shape[1], "2.9 has no GQA"
    return _attend(query, key, value, cu_seq_q, query.shape[-1] ** -0.5, -1)


def varlen_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                window_size=(-1, -1)):
    assert window_size[1] == 0 and query.shape[1] == key.shape[1], "2.10/2.11 have no GQA"
    return _attend(query, key, value, cu_seq_q, scale if scale is not None else query.shape[-1] ** -0.5,
                   window_size[0])


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    L = BOUNDS[-1]
    q = torch.randn(1, HEADS, L, DIM, generator=g)
    k, v = (torch.randn(1, KV_HEADS, L, DIM, generator=g) for _ in range(2))
    cu = torch.tensor(BOUNDS, dtype=torch.int32)
    longest = max(e - s for s, e in zip(BOUNDS, BOUNDS[1:]))
    kw = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}
    module = types.SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True)
    return module, q, k, v, kw


@pytest.mark.parametrize("fn", [varlen_2_9, varlen_2_10])
@pytest.mark.parametrize("scaling", [DIM ** -0.5, 0.3])
def test_older_varlen_signatures_match_the_per_sequence_path(monkeypatch, fn, scaling):
    monkeypatch.setattr("torch.nn.attention.varlen.varlen_attn", fn)
    module, q, k, v, kw = _inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = pa._torch_varlen(module, q, k, v, kw, scaling)
    want = pa._per_sequence(module, q, k, v, BOUNDS, 0.0, scaling)
    assert got.shape == want.shape == (1, BOUNDS[-1], HEADS, DIM)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)


def test_sliding_window_goes_to_the_kernel_where_it_has_window_size(monkeypatch):
    monkeypatch.setattr("torch.nn.attention.varlen.varlen_attn", varlen_2_10)
    module, q, k, v, kw = _inputs(1)
    got = pa._torch_varlen(module, q, k, v, {**kw, "sliding_window": 3}, 0.3)
    want = pa._per_sequence(module, q, k, v, BOUNDS, 0.0, 0.3, sliding_window=3)
    ref = _attend(q[0].transpose(0, 1), *(x[0].transpose(0, 1).repeat_interleave(4, 1) for x in (k, v)),
                  kw["cu_seq_lens_q"], 0.3, 2)
    assert torch.allclose(want[0], ref, atol=1e-5, rtol=1e-4)  # the SDPA path honours the window too
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)


def test_sliding_window_without_window_size_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr("torch.nn.attention.varlen.varlen_attn", varlen_2_9)
    monkeypatch.setattr(pa, "_WARNED", set())
    module, q, k, v, kw = _inputs(2)
    with pytest.warns(RuntimeWarning, match="sliding window") as caught:
        for _ in range(3):
            assert pa._torch_varlen(module, q, k, v, {**kw, "sliding_window": 3}, 0.3) is None
    assert len([w for w in caught if "sliding window" in str(w.message)]) == 1
