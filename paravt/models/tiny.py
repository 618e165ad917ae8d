"""The embedded default model: a tiny Qwen3-VL built offline and deterministically.

``python -m paravt.models.tiny --out DIR [--seed S]`` writes a directory that loads with the
same functions as Qwen3-VL-8B (:mod:`paravt.models.loading`):

* a byte-level BPE tokenizer trained with ``tokenizers`` on text of the synthetic world
  (prompts, questions, expert traces, timestamps), with Qwen's special tokens and the tags
  ``<think> </think> <tool_call> </tool_call> <tool_response> </tool_response> <answer>
  </answer>`` as non-special added tokens (one id each; they survive ``skip_special_tokens``);
* a Qwen-style chat template (tool messages grouped in a user turn as ``<tool_response>``);
* the image-only Qwen3-VL processor (:mod:`paravt.models.processor`);
* a random-init ``Qwen3VLForConditionalGeneration`` (≈1.7 M parameters by default), optionally given an
  induction (copying) circuit by a short text-only warm-up (``--copy-warmup-steps``, :class:`CopyWarmup`):
  what Qwen3-VL-8B brings from its language pretraining and the main agent needs to read its sub-agents' reports.

Nothing is downloaded. The config fields transformers accepts silently are validated here.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from paravt.core.startup import ready

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]
TAG_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
              "<answer>", "</answer>"]

# Qwen-style template (transformers renders with trim_blocks: a newline right after a block
# tag must be written as an expression). Content is a string or a list of {"type": "text"|"image"|"image_url"|
# "video"|"video_url", ...}: Qwen's video branch, one <|video_pad|> per video, which a server (vLLM) expands per
# frame group; our own episodes send frames as images and never render it.
CHAT_TEMPLATE = (
    "{% macro render(content) %}"
    "{% if content is string %}{{ content }}"
    "{% else %}{% for item in content %}"
    "{% if item.type == 'image' or item.type == 'image_url' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item.type == 'video' or item.type == 'video_url' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif item.type == 'text' %}{{ item.text }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% endmacro %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n<tool_response>\\n' }}{{ render(message.content) }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}"
    "<|im_start|>{{ message.role }}\n{{ render(message.content) }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass
class TinyShape:
    vocab_size: int = 2048  # BPE target; the model's vocab is the tokenizer size rounded up to 64
    vocab_size_exact: bool = False  # True: the model's vocab is vocab_size exactly
    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 16384
    rope_theta: float = 10000.0
    mrope_section: list[int] = field(default_factory=lambda: [6, 5, 5])
    vision_depth: int = 2
    vision_hidden_size: int = 64
    vision_intermediate_size: int = 128
    vision_num_heads: int = 2
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    num_position_embeddings: int = 64
    deepstack_visual_indexes: list[int] = field(default_factory=lambda: [0])
    tie_word_embeddings: bool = True

    def __post_init__(self):
        validate_shape(self)


def validate_shape(s: TinyShape, tokenizer_size: int | None = None) -> None:
    """Checks for fields that transformers accepts silently and that break the model later."""
    errs = []
    if sum(s.mrope_section) != s.head_dim // 2:
        errs.append(f"mrope_section {s.mrope_section} must sum to head_dim/2 = {s.head_dim // 2}")
    if math.isqrt(s.num_position_embeddings) ** 2 != s.num_position_embeddings:
        errs.append(f"num_position_embeddings {s.num_position_embeddings} must be a perfect square")
    if any(i < 0 or i >= s.vision_depth for i in s.deepstack_visual_indexes):
        errs.append(f"deepstack_visual_indexes {s.deepstack_visual_indexes} must be < vision_depth {s.vision_depth}")
    if s.num_attention_heads % s.num_key_value_heads:
        errs.append("num_attention_heads must be a multiple of num_key_value_heads")
    if s.vision_hidden_size % s.vision_num_heads:
        errs.append("vision_hidden_size must be a multiple of vision_num_heads")
    if (s.vision_hidden_size // s.vision_num_heads) % 2:
        errs.append("vision head dim must be even (2-D rotary)")
    if tokenizer_size is not None and s.vocab_size < tokenizer_size:
        errs.append(f"vocab_size {s.vocab_size} < tokenizer size {tokenizer_size}")
    if errs:
        raise ValueError("invalid tiny Qwen3-VL shape: " + "; ".join(errs))


def tiny_8b_structure_shape() -> TinyShape:
    """Qwen3-VL-8B's structure at tiny width (:func:`paravt.models.reference_shapes.qwen3vl_8b_config`), for the
    fast paths' equality tests: untied lm_head; text head_dim 128, GQA 4:1, the 8B's M-RoPE sections and theta;
    vision head_dim 72, the 8B's patch/merge/temporal sizes and position grid; three deepstack levels from
    intermediate blocks (as 8/16/24 of 27) into text layers 0-2, and one text layer without (as the 8B's 3..35)."""
    from paravt.models.reference_shapes import qwen3vl_8b_config  # noqa: PLC0415

    t, v = (c := qwen3vl_8b_config(num_hidden_layers=1)).text_config, c.vision_config
    rope, levels, vision_head_dim = t.rope_parameters, len(v.deepstack_visual_indexes), v.hidden_size // v.num_heads
    return TinyShape(
        hidden_size=128, num_hidden_layers=levels + 1, num_attention_heads=t.num_attention_heads // t.num_key_value_heads,
        num_key_value_heads=1, head_dim=t.head_dim, intermediate_size=384, rope_theta=float(rope["rope_theta"]),
        mrope_section=list(rope["mrope_section"]), vision_depth=levels + 2, vision_hidden_size=2 * vision_head_dim,
        vision_intermediate_size=4 * vision_head_dim, vision_num_heads=2, patch_size=v.patch_size,
        spatial_merge_size=v.spatial_merge_size, temporal_patch_size=v.temporal_patch_size,
        num_position_embeddings=v.num_position_embeddings,
        deepstack_visual_indexes=list(range(1, levels + 1)), tie_word_embeddings=False)


STRUCTURES = {"default": TinyShape, "8b": tiny_8b_structure_shape}  # --structure: the shape each names


# --------------------------------------- Tokenizer ---------------------------------------

def tokenizer_corpus(seed: int) -> list[str]:
    """Deterministic training text: every prompt mode, questions and expert traces of the
    synthetic world, timestamps, clocks and numbers."""
    from paravt.core.prompts import available_modes, clock, format_timestamp, subagent_prompt, system_prompt  # noqa: PLC0415
    from paravt.data.tool_specs import DATA_TOOL_SCHEMAS  # noqa: PLC0415
    from paravt.data.synthetic.traces import expert_trajectory  # noqa: PLC0415
    from paravt.data.synthetic.world import QUESTION_TYPES, WorldConfig, make_question, make_spec  # noqa: PLC0415
    from paravt.core.seeding import py_rng  # noqa: PLC0415

    texts = [system_prompt(m, DATA_TOOL_SCHEMAS) for m in available_modes()]
    for t in range(0, 1300, 5):
        texts.append(format_timestamp(t / 10) + " " + clock(t / 10) + f" [{t / 10:.1f}, {t / 10 + 3:.1f}]")
    cfg = WorldConfig(seed=seed)
    for i in range(60):
        spec = make_spec(cfg, "tokenizer", i)
        r = py_rng(seed, "tok", i)
        texts.append(f"Video: {spec.name}\nDuration: {float(spec.duration):.1f} seconds\n")
        for ev in spec.events:
            for qt in QUESTION_TYPES:
                q = make_question(spec, ev, qt, r)
                texts.append(q["question"])
                traj = expert_trajectory(spec, q, r.choice([4, 8, 16, 32, 64]), cfg)
                for turn in traj["turns"]:
                    texts.extend(turn if isinstance(turn, list) else [turn])
                for s, e in traj["crops"]:
                    texts.append(subagent_prompt(s, e))
    return texts


def build_tokenizer(seed: int = 0, vocab_size: int = 2048):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAG_TOKENS), special_tokens=SPECIAL_TOKENS, min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(tokenizer_corpus(seed), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="left",
        additional_special_tokens=SPECIAL_TOKENS[3:], model_max_length=32768,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


# ---------------------------------- Processor and model ----------------------------------

def build_processor(tokenizer, shape: TinyShape, min_pixels: int = 784, max_pixels: int = 50176):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: PLC0415

    from paravt.models.processor import ParaVTQwen3VLProcessor  # noqa: PLC0415

    ip = Qwen2VLImageProcessorPil(
        min_pixels=min_pixels, max_pixels=max_pixels, patch_size=shape.patch_size,
        temporal_patch_size=shape.temporal_patch_size, merge_size=shape.spatial_merge_size,
        # Normalised so the synthetic world's dark backgrounds sit near 0 and the coloured shapes stand out:
        # with Qwen's (0.5, 0.5) a dark frame is a large constant vector that swamps the content, and the
        # tiny model learned to ignore vision (measured: features varied by <1% across frames after SFT).
        image_mean=[0.1, 0.1, 0.1], image_std=[0.3, 0.3, 0.3],
    )
    return ParaVTQwen3VLProcessor(image_processor=ip, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)


def build_config(shape: TinyShape, tokenizer):
    from transformers import Qwen3VLConfig  # noqa: PLC0415

    validate_shape(shape, len(tokenizer))
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    vocab = max(shape.vocab_size if shape.vocab_size_exact else 0, -(-len(tokenizer) // 64) * 64)
    text = dict(
        vocab_size=vocab, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads, head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings, pad_token_id=ids["<|endoftext|>"],
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta,
                         "mrope_section": list(shape.mrope_section), "mrope_interleaved": True},
        tie_word_embeddings=shape.tie_word_embeddings,
    )
    vision = dict(
        depth=shape.vision_depth, hidden_size=shape.vision_hidden_size,
        intermediate_size=shape.vision_intermediate_size, num_heads=shape.vision_num_heads,
        patch_size=shape.patch_size, spatial_merge_size=shape.spatial_merge_size,
        temporal_patch_size=shape.temporal_patch_size, out_hidden_size=shape.hidden_size,
        num_position_embeddings=shape.num_position_embeddings,
        deepstack_visual_indexes=list(shape.deepstack_visual_indexes),
    )
    cfg = Qwen3VLConfig(
        text_config=text, vision_config=vision,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=shape.tie_word_embeddings,
    )
    cfg.eos_token_id = ids["<|im_end|>"]
    cfg.pad_token_id = ids["<|endoftext|>"]
    return cfg


@dataclass
class CopyWarmup:
    """Language pretraining of the tiny base, reduced to what the agent needs: copying.

    Qwen3-VL-8B arrives with induction heads (it continues a sequence it has seen); a random-init
    model does not, and the agent's data do not grow them in a CPU budget: a main agent without
    them cannot look up what its sub-agents reported (docs/RESULTS.md, "Why the tiny main agent
    cannot copy yet": the reading probe stays at chance). On ``prefix + x + x`` over random
    ordinary tokens, loss on the second ``x`` only, random lengths (no positional shortcut), the
    loss stays at ~6.4 for 1200-1600 steps, then drops (the induction phase change). Measured in
    experiments/exp_lookup.py: after 3000 such steps a text lookup in the world's wording is learnt in
    < 250 steps (accuracy 1.00), without them it stays at chance. ``steps=0``: random init."""

    steps: int = 0  # optimizer steps (0: off)
    lr: float = 2e-3  # AdamW, constant
    batch: int = 16  # sequences per step (one length per step: no padding)
    min_len: int = 8  # length of x (drawn per step)
    max_len: int = 32
    max_prefix: int = 32  # random tokens before the first x (drawn per step, 0..max_prefix)
    # Fraction of the steps whose sequences draw x from a small random alphabet (``alphabet`` tokens per
    # sequence) so that a token repeats inside x and copying it needs the tokens before it, not just
    # the last one (the times "48.0 to 51.5" of a report: one-token induction is ambiguous there).
    small_alphabet_frac: float = 0.0
    alphabet: int = 12

    def __post_init__(self):
        if self.steps < 0 or self.lr <= 0 or self.batch < 1 or not (1 <= self.min_len <= self.max_len) \
                or self.max_prefix < 0 or not (0.0 <= self.small_alphabet_frac <= 1.0) or self.alphabet < 2:
            raise ValueError(f"bad CopyWarmup {self}")


def copy_vocab(tokenizer) -> torch.Tensor:
    """The ordinary token ids (no special or tag token) the copy sequences are drawn from."""
    special = set(tokenizer.all_special_ids) | set(tokenizer.convert_tokens_to_ids(TAG_TOKENS))
    return torch.tensor([i for i in range(len(tokenizer)) if i not in special])


def copy_batch(vocab: torch.Tensor, cfg: CopyWarmup, g: torch.Generator) -> tuple[torch.Tensor, int]:
    """One batch of ``prefix + x + x`` (every draw from ``g``); returns the ids and the index of the
    first position whose logits predict the second ``x`` (its loss covers ``ids[:, start + 1:]``)."""
    n = int(torch.randint(cfg.min_len, cfg.max_len + 1, (1,), generator=g))
    p = int(torch.randint(0, cfg.max_prefix + 1, (1,), generator=g))
    small = cfg.small_alphabet_frac > 0 and float(torch.rand((), generator=g)) < cfg.small_alphabet_frac
    if small:  # each sequence its own alphabet of cfg.alphabet tokens
        alpha = torch.stack([torch.randperm(len(vocab), generator=g)[:cfg.alphabet] for _ in range(cfg.batch)])
        x = vocab[torch.gather(alpha, 1, torch.randint(cfg.alphabet, (cfg.batch, n), generator=g))]
    else:
        x = vocab[torch.randint(len(vocab), (cfg.batch, n), generator=g)]
    pre = vocab[torch.randint(len(vocab), (cfg.batch, p), generator=g)]
    return torch.cat([pre, x, x], 1), p + n - 1


def copy_loss(model, ids: torch.Tensor, start: int) -> torch.Tensor:
    """Mean cross entropy of ``model`` on the second copy of x (:func:`copy_batch`)."""
    logits = model(input_ids=ids, use_cache=False).logits[:, start:-1].float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, start + 1:].reshape(-1))


def copy_warmup(model, tokenizer, cfg: CopyWarmup, seed: int, progress: bool = True) -> dict:
    """Train the text stack of ``model`` in place on repeated random-token sequences (every draw from a
    generator seeded with ``seed``); returns the loss curve (means over tenths of the steps)."""
    if cfg.steps == 0:
        return {"steps": 0}
    vocab = copy_vocab(tokenizer)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    model.train()
    losses: list[float] = []
    t0 = time.time()
    try:
        from tqdm import tqdm  # noqa: PLC0415

        steps = tqdm(range(cfg.steps), desc="copy warm-up", disable=not progress, mininterval=2.0)
    except ImportError:  # pragma: no cover
        steps = range(cfg.steps)
    for _ in steps:
        ids, start = copy_batch(vocab, cfg, g)
        loss = copy_loss(model, ids, start)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if hasattr(steps, "set_postfix") and len(losses) % 100 == 0:
            steps.set_postfix(loss=f"{sum(losses[-100:]) / 100:.2f}")
    model.eval()
    k = -(-len(losses) // 10)  # at most 10 points
    curve = [round(sum(losses[i:i + k]) / len(losses[i:i + k]), 3) for i in range(0, len(losses), k)]
    return {"steps": cfg.steps, "loss_first": curve[0], "loss_last": curve[-1], "loss_curve_tenths": curve,
            "seconds": round(time.time() - t0, 1), **{f"cfg_{k_}": v for k_, v in asdict(cfg).items()}}


def build_tiny(out: str | Path, seed: int = 0, shape: TinyShape | None = None,
               warmup: CopyWarmup | None = None, progress: bool = True) -> dict:
    """Build tokenizer, processor and model and save them to ``out``; returns build stats."""
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration  # noqa: PLC0415

    shape = shape or TinyShape()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tokenizer = build_tokenizer(seed, shape.vocab_size)
    t_tok = time.time() - t0
    processor = build_processor(tokenizer, shape)
    config = build_config(shape, tokenizer)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    ready()  # built: the collector runs again for the warm-up (paravt.core.startup)
    if not shape.tie_word_embeddings:
        # A separate lm_head gets rows of norm ~2 (std 2/sqrt(hidden)) instead of HF's 0.02 init: the rows
        # stay apart when SFT freezes them (optim.freeze_lm_head), and the final RMSNorm's output (norm
        # ~sqrt(hidden)) reaches confident logits without first growing its gain 10x.
        with torch.no_grad():
            model.get_output_embeddings().weight.normal_(0.0, 2.0 / shape.hidden_size ** 0.5)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=False, max_new_tokens=256)
    warm = copy_warmup(model, tokenizer, warmup or CopyWarmup(), seed, progress)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    stats = {"parameters": sum(p.numel() for p in model.parameters()), "tokenizer_size": len(tokenizer),
             "tokenizer_seconds": round(t_tok, 2), "build_seconds": round(time.time() - t0, 2),
             "seed": seed, "shape": asdict(shape), "copy_warmup": warm}
    (out / "paravt_tiny.json").write_text(json.dumps(stats, indent=2, sort_keys=True))
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paravt.models.tiny", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (loadable with from_pretrained)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden-size", type=int, default=TinyShape.hidden_size)
    p.add_argument("--layers", type=int, default=TinyShape.num_hidden_layers)
    p.add_argument("--heads", type=int, default=TinyShape.num_attention_heads,
                   help=f"attention heads of the text stack (head_dim {TinyShape.head_dim})")
    p.add_argument("--kv-heads", type=int, default=TinyShape.num_key_value_heads)
    p.add_argument("--intermediate-size", type=int, default=TinyShape.intermediate_size)
    p.add_argument("--copy-warmup-steps", type=int, default=CopyWarmup.steps, help="text-only copy warm-up "
                   "steps growing an induction circuit (0: random init; 3000: ~3 min on 2 cores; default 0)")
    p.add_argument("--copy-small-alphabet", type=float, default=CopyWarmup.small_alphabet_frac,
                   help="fraction of the copy warm-up steps drawn from a small alphabet per sequence (copying "
                        "then needs more than the last token: the times of a report)")
    p.add_argument("--tie-embeddings", action=argparse.BooleanOptionalAction, default=TinyShape.tie_word_embeddings,
                   help="share the input embedding and the lm_head (tied, the small Qwen3s' layout); "
                        "--no-tie-embeddings: separate matrices, as the 8B")
    p.add_argument("--structure", choices=sorted(STRUCTURES), default="default",
                   help="8b: Qwen3-VL-8B's structure at tiny width (the size flags are ignored)")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    shape = TinyShape(hidden_size=a.hidden_size, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, intermediate_size=a.intermediate_size,
                      tie_word_embeddings=a.tie_embeddings) if a.structure == "default" else STRUCTURES[a.structure]()
    warmup = CopyWarmup(steps=a.copy_warmup_steps, small_alphabet_frac=a.copy_small_alphabet)
    stats = build_tiny(a.out, a.seed, shape, warmup, progress=not a.no_progress)
    print(json.dumps({k: v for k, v in stats.items() if k != "shape"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
