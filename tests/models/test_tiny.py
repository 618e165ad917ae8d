import json

import pytest
import torch

from paravt.core.prompts import THINK_PREFIX, build_messages
from paravt.core.video import sample_overview
from paravt.data.schema import load_rl_rows
from paravt.models.tiny import TAG_TOKENS, TinyShape, build_tiny, validate_shape
from paravt.data.tool_specs import DATA_TOOL_SCHEMAS


def test_build_is_deterministic(tmp_path):
    a = build_tiny(tmp_path / "a", seed=1)
    b = build_tiny(tmp_path / "b", seed=1)
    assert a["parameters"] == b["parameters"] and 1_000_000 <= a["parameters"] <= 5_000_000
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.parametrize("kw,msg", [
    ({"mrope_section": [6, 5, 4]}, "mrope_section"),
    ({"num_position_embeddings": 60}, "perfect square"),
    ({"deepstack_visual_indexes": [2]}, "deepstack"),
    ({"num_key_value_heads": 3}, "multiple"),
])
def test_shape_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        TinyShape(**kw)
    with pytest.raises(ValueError, match="vocab_size"):
        validate_shape(TinyShape(vocab_size=100), tokenizer_size=700)


def test_tokenizer_tags_and_specials(tiny):
    _, proc = tiny
    tok = proc.tokenizer
    for t in TAG_TOKENS:
        ids = tok.encode(t, add_special_tokens=False)
        assert len(ids) == 1, t
        assert tok.decode(ids, skip_special_tokens=True) == t  # tags survive skip_special_tokens
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.padding_side == "left"
    assert tok.decode(tok.encode("<|im_end|>"), skip_special_tokens=True) == ""
    assert tok.tokenize("12.5") == ["1", "2", ".", "5"]  # digits are single tokens


def test_processor_class_and_chat_template(tiny, tiny_dir):
    _, proc = tiny
    assert type(proc).__name__ == "ParaVTQwen3VLProcessor"
    cfg = json.loads((tiny_dir / "processor_config.json").read_text())
    assert cfg["processor_class"] == "ParaVTQwen3VLProcessor"
    msgs = [{"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "<1.0 seconds>"}, {"type": "image"}, {"type": "text", "text": "Q"}]},
            {"role": "assistant", "content": "<think>\nx\n</think>\n<tool_call>\n{}\n</tool_call>"},
            {"role": "tool", "content": "r1"}, {"role": "tool", "content": [{"type": "text", "text": "r2"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n<1.0 seconds><|vision_start|><|image_pad|>"
                    "<|vision_end|>Q<|im_end|>\n<|im_start|>assistant\n<think>\nx\n</think>\n<tool_call>\n{}\n"
                    "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n"
                    "<tool_response>\nr2\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="image-only"):
        proc(text=["x"], videos=[[1]])


def test_forward_and_generate_with_frames(tiny, world):
    model, proc = tiny
    rows, _ = load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])
    frames = sample_overview(rows[0].video, 4)
    msgs = build_messages("agentic_general", rows[0].question, frames, "v.mp4", 60.0, tool_schemas=DATA_TOOL_SCHEMAS)
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) + THINK_PREFIX
    inp = proc(text=[text], images=[f.image for f in frames], return_tensors="pt")
    assert inp["image_grid_thw"].tolist() == [[1, 4, 4]] * 4  # 64×64 frame → 4 tokens
    assert int((inp["input_ids"] == model.config.image_token_id).sum()) == 16
    with torch.no_grad():
        logits = model(**inp).logits
    assert logits.shape[:2] == inp["input_ids"].shape and torch.isfinite(logits).all()
    g = model.generate(**inp, max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True)
    assert g.sequences.shape[1] <= inp["input_ids"].shape[1] + 8 and len(g.logits) >= 1


def test_copy_warmup_is_seeded_and_recorded(tmp_path):
    """The copy warm-up (the tiny base's induction circuit) trains the text stack only, with every
    draw from the seed: two builds are byte-identical, the loss curve is in paravt_tiny.json, and the
    weights differ from the random init (the vision tower does not)."""
    from safetensors.torch import load_file

    from paravt.models.tiny import CopyWarmup

    build_tiny(tmp_path / "a", seed=1, warmup=CopyWarmup(steps=12, batch=4), progress=False)
    build_tiny(tmp_path / "b", seed=1, warmup=CopyWarmup(steps=12, batch=4), progress=False)
    build_tiny(tmp_path / "c", seed=1)
    assert (tmp_path / "a/model.safetensors").read_bytes() == (tmp_path / "b/model.safetensors").read_bytes()
    rec = json.loads((tmp_path / "a/paravt_tiny.json").read_text())["copy_warmup"]
    assert rec["steps"] == 12 and len(rec["loss_curve_tenths"]) == 6 and rec["loss_first"] > 5.0
    assert json.loads((tmp_path / "c/paravt_tiny.json").read_text())["copy_warmup"] == {"steps": 0}
    wa, wc = load_file(tmp_path / "a/model.safetensors"), load_file(tmp_path / "c/model.safetensors")
    changed = {k for k in wa if not torch.equal(wa[k], wc[k])}
    assert any("language_model" in k for k in changed) and not any(".visual." in k for k in changed)
    with pytest.raises(ValueError, match="CopyWarmup"):
        CopyWarmup(steps=10, min_len=9, max_len=8)


def test_cli_shape_flags(tmp_path):
    """The width knobs of `python -m paravt.models.tiny` reach the saved config (and a bad one is refused)."""
    from transformers import AutoConfig

    from paravt.models.tiny import main

    assert main(["--out", str(tmp_path / "w"), "--hidden-size", "256", "--heads", "8", "--kv-heads", "4",
                 "--intermediate-size", "768", "--no-progress"]) == 0
    cfg = AutoConfig.from_pretrained(tmp_path / "w").text_config
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size) == (256, 8, 4, 768)
    assert json.loads((tmp_path / "w" / "paravt_tiny.json").read_text())["shape"]["num_attention_heads"] == 8
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        main(["--out", str(tmp_path / "bad"), "--heads", "6", "--kv-heads", "4", "--no-progress"])


def test_untied_embeddings_stay_untied_through_save_and_load(tmp_path):
    """--no-tie-embeddings: the lm_head is its own matrix (the 8B's layout) after from_pretrained, and a
    training step moves one without the other."""
    import torch

    from paravt.models.loading import load_model
    from paravt.models.tiny import main

    assert main(["--out", str(tmp_path / "u"), "--no-tie-embeddings", "--no-progress"]) == 0
    m = load_model(tmp_path / "u")
    emb, head = m.get_input_embeddings().weight, m.get_output_embeddings().weight
    assert emb.data_ptr() != head.data_ptr() and not torch.equal(emb, head)
    assert 1.5 < head.norm(dim=-1).mean().item() < 2.5  # rows of norm ~2 (a frozen head must reach confident logits)
    assert json.loads((tmp_path / "u" / "paravt_tiny.json").read_text())["shape"]["tie_word_embeddings"] is False
    before = emb.detach().clone()
    loss = m(input_ids=torch.tensor([[5, 6, 7, 8]]), labels=torch.tensor([[5, 6, 7, 8]])).loss
    loss.backward()
    assert emb.grad is not None and head.grad is not None and not torch.equal(emb.grad, head.grad)
    assert torch.equal(emb.detach(), before)


def test_copy_batch_small_alphabet_repeats_tokens(tiny_dir):
    """small_alphabet_frac=1: every sequence's x comes from 12 tokens of its own, so tokens repeat
    inside x (copying needs more than the last token); the second half is the first; seeded."""
    from paravt.models.loading import load_processor
    from paravt.models.tiny import CopyWarmup, copy_batch, copy_vocab
    vocab = copy_vocab(load_processor(tiny_dir).tokenizer)
    cfg = CopyWarmup(batch=8, min_len=30, max_len=30, max_prefix=0, small_alphabet_frac=1.0)
    ids, start = copy_batch(vocab, cfg, torch.Generator().manual_seed(3))
    again, _ = copy_batch(vocab, cfg, torch.Generator().manual_seed(3))
    assert torch.equal(ids, again) and start == 29
    x, y = ids[:, :30], ids[:, 30:]
    assert torch.equal(x, y)
    assert all(len(set(row.tolist())) <= 12 for row in x)
    wide, _ = copy_batch(vocab, CopyWarmup(batch=8, min_len=30, max_len=30, max_prefix=0), torch.Generator().manual_seed(3))
    assert sum(len(set(row.tolist())) for row in wide[:, :30]) > 8 * 25  # the full vocabulary rarely repeats
