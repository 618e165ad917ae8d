"""On CUDA: the fast attention paths against the slow ones they replace, at bf16 on the tiny model.
``torch_varlen`` (one ``varlen_attn`` call per layer for a pack) is opt-in until this passes on a card."""

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _pack(model, tiny, world):
    from paravt.data.schema import load_sft_rows
    from paravt.sft.data import ExampleBuilder, VideoSamplingConfig, collate_packed

    _, proc = tiny
    rows = load_sft_rows([world / "local" / "paravt_sft_synth.parquet"])[0]
    b = ExampleBuilder(proc, VideoSamplingConfig(), 8192)
    batch = collate_packed([b(r) for r in rows[:4]], proc, model.config.image_token_id, model.model.get_rope_index)
    batch.pop("labels")
    return {k: v.cuda() for k, v in batch.items()}


@pytest.mark.parametrize("attn", ["torch_varlen", "sdpa_varlen"])
def test_packed_logits_equal_the_masked_sdpa_path_on_cuda(tiny_dir, tiny, world, attn):
    from paravt.models.loading import load_model
    from paravt.models.packed_attention import packed_call

    fast = load_model(tiny_dir, dtype="bfloat16", attn_implementation=attn, device="cuda").eval()
    slow = load_model(tiny_dir, dtype="bfloat16", attn_implementation="sdpa", device="cuda").eval()
    batch = _pack(fast, tiny, world)
    with torch.no_grad():
        got = packed_call(fast, **dict(batch)).logits.float()
        want = slow(**batch).logits.float()
    assert (got - want).abs().max() < 0.1 and (got - want).abs().mean() < 0.01
