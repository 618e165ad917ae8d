"""sdpa_varlen: attention within each packed sequence gives the logits of plain SDPA with its
block-diagonal mask, runs one kernel call per sequence, and leaves every other input to SDPA. The packed
equality runs on both tiny models, the 8B-structured one also in bf16 (:mod:`tests.models.tiny_cases`)."""

import pytest
import torch

from paravt.data.schema import load_sft_rows
from paravt.models.packed_attention import NAME, sequence_starts
from paravt.sft.data import ExampleBuilder, VideoSamplingConfig, collate_packed, collate_padded
from tests.models.tiny_cases import CASE_IDS, CASES, assert_close, case_for


def test_sequence_starts_are_where_positions_restart():
    assert sequence_starts(torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])) == [0, 3, 5]
    assert sequence_starts(torch.arange(7)[None]) == [0]
    assert sequence_starts(torch.tensor([[5, 6, 0, 1]])) == [0, 2]


def _models(path, dtype="float32"):
    from paravt.models.loading import default_attn_implementation, load_model

    assert default_attn_implementation() == NAME  # no CUDA flash-attn here: the default
    return load_model(path, dtype, attn_implementation="sdpa").eval(), load_model(path, dtype).eval()


@pytest.fixture(scope="module")
def models(tiny_dir):
    return _models(tiny_dir)


def _logits(model, batch):
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits


@pytest.mark.parametrize("which", CASES, ids=CASE_IDS)
def test_packed_rows_match_sdpa_and_take_one_call_per_sequence(which, request, world, monkeypatch):
    case = case_for(request, *which, world)
    plain, varlen = _models(case.path, case.dtype)
    assert varlen.config._attn_implementation == NAME
    proc, exs = case.processor, case.examples
    itid = varlen.config.image_token_id
    packed = collate_packed(exs, proc, itid, varlen.model.get_rope_index)

    import transformers.integrations.sdpa_attention as sdpa_mod
    seen, real = [], sdpa_mod.sdpa_attention_forward

    def spy(module, query, *a, **k):
        seen.append(query.shape[2])
        return real(module, query, *a, **k)
    monkeypatch.setattr(sdpa_mod, "sdpa_attention_forward", spy)
    got = _logits(varlen, packed)
    lengths = [len(e) for e in exs]
    n_layers = varlen.config.text_config.num_hidden_layers
    assert sum(s in lengths for s in seen) >= n_layers * len(lengths)  # each sequence alone, in every text layer
    assert packed["input_ids"].shape[1] not in seen  # never the whole row
    monkeypatch.setattr(sdpa_mod, "sdpa_attention_forward", real)
    want = _logits(plain, packed)
    assert_close(got, want, case.dtype, atol=1e-5, rtol=1e-4)


def test_padded_batches_and_single_sequences_are_plain_sdpa(models, tiny, world):
    plain, varlen = models
    _, proc = tiny
    rows = load_sft_rows([world / "local" / "paravt_sft_synth.parquet"])[0]
    b = ExampleBuilder(proc, VideoSamplingConfig(), 8192)
    exs = [b(r) for r in rows[:3]]
    itid = varlen.config.image_token_id
    padded = collate_padded(exs, proc, proc.tokenizer.pad_token_id, itid)
    mask = padded["attention_mask"].bool()
    assert torch.allclose(_logits(varlen, padded)[mask], _logits(plain, padded)[mask], atol=1e-5, rtol=1e-4)
    one = collate_padded(exs[:1], proc, proc.tokenizer.pad_token_id, itid)
    assert torch.allclose(_logits(varlen, one), _logits(plain, one), atol=1e-5, rtol=1e-4)


def test_a_left_padded_prefill_attends_row_by_row_without_a_mask(models, tiny, world, monkeypatch):
    """Under left_padded() (the in-process engine's prefill): each row's causal attention over its own tokens, one
    call per row and text layer, no mask; the logits at every real token are plain SDPA's with its (B, 1, L, L) mask."""
    from paravt.models.packed_attention import left_padded

    plain, varlen = models
    _, proc = tiny
    rows = load_sft_rows([world / "local" / "paravt_sft_synth.parquet"])[0]
    b = ExampleBuilder(proc, VideoSamplingConfig(), 8192)
    exs = [b(r) for r in rows[:3]]
    lengths = [len(e) for e in exs]
    assert len(set(lengths)) == 3
    batch = collate_padded(exs, proc, proc.tokenizer.pad_token_id, varlen.config.image_token_id)
    L = max(lengths)
    pads = [L - n for n in lengths]
    for key in ("input_ids", "attention_mask", "mm_token_type_ids", "labels"):  # right padding -> left padding
        batch[key] = torch.stack([row.roll(p) for row, p in zip(batch[key], pads)])
    mask = batch["attention_mask"].bool()
    assert not mask[:, -1].logical_not().any() and pads[lengths.index(L)] == 0

    import transformers.integrations.sdpa_attention as sdpa_mod
    seen, real = [], sdpa_mod.sdpa_attention_forward

    def spy(module, query, key, value, attention_mask, *a, **k):
        seen.append((query.shape[0], query.shape[2], attention_mask is None))
        return real(module, query, key, value, attention_mask, *a, **k)
    monkeypatch.setattr(sdpa_mod, "sdpa_attention_forward", spy)
    with left_padded(pads):
        got = _logits(varlen, batch)
    text = [s for s in seen if s[1] in lengths]
    assert sorted(text) == sorted((1, n, True) for n in lengths for _ in range(varlen.config.text_config.num_hidden_layers))
    assert not any(s[1] == L and s[0] == len(exs) for s in seen)  # never the padded batch as a whole
    monkeypatch.setattr(sdpa_mod, "sdpa_attention_forward", real)
    want = _logits(plain, batch)
    assert torch.isfinite(got).all()
    assert torch.allclose(got[mask], want[mask], atol=1e-5, rtol=1e-4)


def _graph_nodes(t: torch.Tensor) -> list[str]:
    names, stack, seen = [], [t.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.append(type(fn).__name__)
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return names


def test_a_packed_row_splits_once_per_tensor_and_its_gradients_equal_slicing_each_sequence():
    """A packed row is cut into its sequences by one split per q/k/v (whose backward is one concatenation),
    not a slice per sequence (whose backward writes a zero tensor of the whole row for each): the same
    output and bit-for-bit the same gradients as attending over slices of each sequence."""
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from paravt.models.packed_attention import BOUNDS_KWARG, varlen_attention_forward

    module = torch.nn.Module()
    module.config, module.is_causal, module.num_key_value_groups = SimpleNamespace(_attn_implementation=NAME), True, 2
    bounds = (0, 5, 12, 13, 20, 31)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 31, 8, generator=g, requires_grad=True) for h in (4, 2, 2))
    out, _ = varlen_attention_forward(module, q, k, v, None, **{BOUNDS_KWARG: bounds})
    weights = torch.randn(out.shape, generator=g)
    (out * weights).sum().backward()
    nodes = _graph_nodes(out)
    assert "SliceBackward0" not in nodes and nodes.count("SplitWithSizesBackward0") == 3

    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = torch.cat([sdpa_attention_forward(module, q2[:, :, s:e], k2[:, :, s:e], v2[:, :, s:e], None,
                                            is_causal=True)[0] for s, e in zip(bounds, bounds[1:])], dim=1)
    (ref * weights).sum().backward()
    assert torch.equal(out, ref)
    for got, want in ((q, q2), (k, k2), (v, v2)):
        assert torch.equal(got.grad, want.grad)
