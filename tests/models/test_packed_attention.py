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
