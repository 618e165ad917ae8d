import json

import pytest
import torch

from paravt.data.schema import load_sft_rows
from paravt.sft.data import (IGNORE, ExampleBuilder, PackedStream, SkipRow, StreamState, VideoSamplingConfig,
                             collate_packed, collate_padded, tokenize_conversation)


@pytest.fixture(scope="module")
def rows(world):
    return load_sft_rows([world / "local" / "paravt_sft_synth.parquet"])[0]


def _main_rows(rows):
    return [r for r in rows if r.messages[0]["role"] == "system"]


def _multi_turn(tiny, rows):
    """(processor, an ExampleBuilder, a main-agent row with two or more assistant turns)."""
    _, proc = tiny
    multi = next(r for r in _main_rows(rows) if sum(m["role"] == "assistant" for m in r.messages) >= 2)
    return proc, ExampleBuilder(proc, VideoSamplingConfig(), 8192), multi


def test_labels_cover_exactly_the_assistant_turns(tiny, rows):
    proc, b, multi = _multi_turn(tiny, rows)
    tok = proc.tokenizer
    ex = b(multi)
    # supervised spans, in order
    spans, cur = [], []
    for t, lab in zip(ex.input_ids, ex.labels):
        if lab != IGNORE:
            assert lab == t
            cur.append(t)
        elif cur:
            spans.append(cur)
            cur = []
    if cur:
        spans.append(cur)
    assistant = [m["content"][0]["text"] for m in multi.messages if m["role"] == "assistant"]
    assert [tok.decode(s) for s in spans] == [a + "<|im_end|>" for a in assistant]
    # everything else (system, user, frames, tool responses, template) is masked
    masked = tok.decode([t for t, lab in zip(ex.input_ids, ex.labels) if lab == IGNORE])
    assert "<tool_response>" in masked and "<|im_start|>assistant\n" in masked and "Video:" in masked
    assert "<tool_response>" not in "".join(tok.decode(s) for s in spans)
    n_img = sum(t == proc.image_token_id for t in ex.input_ids)
    assert n_img == 4 * len(ex.images) and len(ex.images) == json.loads(json.dumps(multi.messages))[1]["content"][1]["nframes"]


def test_weight_zero_turns_are_context_only(tiny, rows):
    """An assistant turn marked "weight": 0 stays in the ids as context, unsupervised; the rest as before."""
    import copy

    proc, b, multi = _multi_turn(tiny, rows)
    tok = proc.tokenizer
    full = b(multi)
    marked = copy.deepcopy(multi)
    first = next(m for m in marked.messages if m["role"] == "assistant")
    first["weight"] = 0
    ex = b(marked)
    assert ex.input_ids == full.input_ids
    sup = tok.decode([t for t, lab in zip(ex.input_ids, ex.labels) if lab != IGNORE])
    assert first["content"][0]["text"] not in sup and sup.endswith("</answer><|im_end|>")
    assert sum(lab != IGNORE for lab in ex.labels) < sum(lab != IGNORE for lab in full.labels)


def test_subagent_rows_supervise_the_summary(tiny, rows):
    _, proc = tiny
    sub = next(r for r in rows if r.messages[0]["role"] == "user")
    ex = ExampleBuilder(proc, VideoSamplingConfig(), 8192)(sub)
    sup = proc.tokenizer.decode([t for t, lab in zip(ex.input_ids, ex.labels) if lab != IGNORE])
    assert sup == sub.messages[1]["content"][0]["text"] + "<|im_end|>"
    assert 1 <= len(ex.images) <= 16


def test_packed_loss_equals_padded_loss(tiny, rows):
    model, proc = tiny
    b = ExampleBuilder(proc, VideoSamplingConfig(), 8192)
    exs = [b(r) for r in rows[:5]]
    itid = model.config.image_token_id

    def ce(batch):
        labels = batch.pop("labels")
        with torch.no_grad():
            logits = model(**batch, use_cache=False).logits[:, :-1].float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                                 ignore_index=IGNORE, reduction="sum")
    padded = ce(collate_padded(exs, proc, proc.tokenizer.pad_token_id, itid))
    packed = ce(collate_packed(exs, proc, itid, model.model.get_rope_index))
    single = sum(ce(collate_padded([e], proc, proc.tokenizer.pad_token_id, itid)) for e in exs)
    assert torch.allclose(packed, padded, rtol=1e-4) and torch.allclose(packed, single, rtol=1e-4)


def test_stream_is_deterministic_and_resumable(tiny, rows):
    _, proc = tiny
    b = ExampleBuilder(proc, VideoSamplingConfig(), 1500)

    def take(stream, n):
        return [[e.row for e in stream.next_batch()] for _ in range(n)]
    a = take(PackedStream(rows, b, 3, 1500), 6)
    s = PackedStream(rows, b, 3, 1500)
    first = take(s, 3)
    resumed = PackedStream(rows, b, 3, 1500, state=StreamState(**s.state.to_dict()))
    assert first + take(resumed, 3) == a
    assert take(PackedStream(rows, b, 4, 1500), 6) != a
    r0, r1 = PackedStream(rows, b, 3, 1500, rank=0, world_size=2), PackedStream(rows, b, 3, 1500, rank=1, world_size=2)
    assert not set(sum(take(r0, 2), [])) & set(sum(take(r1, 2), []))  # ranks see disjoint rows


def test_skips_are_counted(tiny, rows, tmp_path):
    _, proc = tiny
    b = ExampleBuilder(proc, VideoSamplingConfig(), 400)  # most main rows are longer than 400 tokens
    long_row = max(_main_rows(rows)[:10], key=lambda r: len(json.dumps(r.messages)))
    with pytest.raises(SkipRow, match="longer than max_length"):
        b(long_row)
    import copy
    gone = copy.deepcopy(rows[0])
    gone.messages[1]["content"][1]["video_url"]["url"] = str(tmp_path / "gone.mp4")
    with pytest.raises(SkipRow, match="gone.mp4"):
        b(gone)
    assert b.skipped == {"longer than max_length": 1, "missing or corrupt video": 1}


def test_tokenize_rejects_images_in_assistant_turns(tiny):
    _, proc = tiny
    from PIL import Image
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "image", "image": Image.new("RGB", (64, 64))}]}]
    with pytest.raises(ValueError, match="assistant turn contains an image"):
        tokenize_conversation(proc, msgs)
