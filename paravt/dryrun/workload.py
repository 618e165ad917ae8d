"""The model and the inputs of a dry run: the recipe's model at its width (fake parameters), and one
step's data at the recipe's sizes, in the step code's own types (SFT ``Example``s, RL ``Sample``s).

Token ids are drawn from a seeded generator (their values do not change any figure); the layout is
that of a real prompt: text, then each frame as a timestamp and ``<|vision_start|>`` + its image
placeholders + ``<|vision_end|>``, then the answer. The text around the frames is sized on the GPU
check's 64-frame overview prompt (4,244 tokens at 50,176 pixels a frame): :data:`FRAME_TEXT` tokens a
frame (its timestamp) and :data:`PROMPT_TEXT` for the system prompt, the question and the tool schema.
Frames are square at ``max_pixels`` (the grid the image processor gives a frame at that budget).
Pixels are fake tensors of the processor's shape ``(patches, channels × temporal patch × patch²)``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from paravt.core.startup import ready
from paravt.models.images import ImageInputs

PROMPT_TEXT = 468  # system prompt, question, tool schema (tokens)
FRAME_TEXT = 8  # a frame's timestamp (tokens)


def model_config(path: str | None, layers: int | None = None, reference: str | None = None):
    """The ``config.json`` at ``path`` (a file or its directory), else the published config of Qwen3-VL-
    ``reference`` ("2b", "4b", "8b"; default "8b": ``paravt.models.reference_shapes``), at ``layers`` text
    layers when given. Nothing is downloaded."""
    if path is None:
        from paravt.models.reference_shapes import qwen3vl_config  # noqa: PLC0415

        cfg = qwen3vl_config(reference or "8b")
    else:
        from transformers import AutoConfig  # noqa: PLC0415

        p = Path(path)
        cfg = AutoConfig.from_pretrained(str(p.parent if p.is_file() else p))
    if layers is not None:
        cfg = copy.deepcopy(cfg)
        t = cfg.text_config
        t.num_hidden_layers = layers
        if getattr(t, "layer_types", None):
            t.layer_types = (list(t.layer_types) * layers)[:layers]
    return cfg


def text_layers(cfg) -> int:
    return int(cfg.text_config.num_hidden_layers)


def build_model(cfg, attn: str, gradient_checkpointing: bool, dtype: torch.dtype = torch.float32):
    """The model as the trainers build it before loading weights (``parallel.load_fsdp2``: from the
    config, the batched vision attention, activation checkpointing, no KV cache), its tensors fake:
    call inside the fake mode."""
    from transformers import AutoModelForImageTextToText  # noqa: PLC0415

    from paravt.models import vision_attention  # noqa: PLC0415
    from paravt.models.loading import enable_activation_checkpointing  # noqa: PLC0415

    model = AutoModelForImageTextToText.from_config(cfg, dtype=dtype, attn_implementation=attn)
    vision_attention.install(model)
    if gradient_checkpointing:
        enable_activation_checkpointing(model)
    model.config.use_cache = False
    ready()  # the first model built: the modules are loaded, the collector runs again (paravt.core.startup)
    return model


def blocks(model) -> dict[torch.nn.Module, tuple[str, int]]:
    """The text layers and vision blocks, as (kind, index)."""
    inner = getattr(model, "model", model)
    out = {m: ("text layer", i) for i, m in enumerate(inner.language_model.layers)}
    visual = getattr(inner, "visual", None)
    if visual is not None:
        out.update({m: ("vision block", i) for i, m in enumerate(visual.blocks)})
    return out


@dataclass
class FrameShape:
    h: int  # patches
    w: int
    merge: int
    patch_dim: int

    @property
    def patches(self) -> int:
        return self.h * self.w

    @property
    def tokens(self) -> int:
        return self.patches // (self.merge * self.merge)


def frame_shape(vision_config, max_pixels: int) -> FrameShape:
    """The patch grid of a square frame at ``max_pixels``: its side the largest multiple of patch × merge
    that fits (the image processor's rounding), at least one merged token."""
    p, m = int(vision_config.patch_size), int(vision_config.spatial_merge_size)
    side = max(p * m, int(math.isqrt(int(max_pixels)) // (p * m)) * p * m)
    dim = int(vision_config.in_channels) * int(vision_config.temporal_patch_size) * p * p
    return FrameShape(side // p, side // p, m, dim)


class DryImages(ImageInputs):
    """A prompt's frames: stand-in PIL images (1 × 1, one colour per frame: the trainer's image
    de-duplication keys on them) and the processor's tensors given directly (fake pixels, real grid)."""

    def __init__(self, key: int, frames: int, shape: FrameShape):
        super().__init__([Image.new("RGB", (1, 1), ((key >> 8) & 255, key & 255, f & 255)) for f in range(frames)])
        self._pv = torch.zeros(frames * shape.patches, shape.patch_dim)  # fake under the fake mode
        self._grid = torch.tensor([[1, shape.h, shape.w]] * frames)

    def tensors(self, processor):
        return self._pv, self._grid


def prompt_ids(cfg, frames: int, shape: FrameShape, g: torch.Generator, text: int = PROMPT_TEXT) -> list[int]:
    """A prompt of ``text`` text tokens and ``frames`` timestamped frames."""
    def words(n: int) -> list[int]:
        return torch.randint(1000, 100000, (n,), generator=g).tolist()

    ids = words(text)
    for _ in range(frames):
        ids += words(FRAME_TEXT) + [cfg.vision_start_token_id] + [cfg.image_token_id] * shape.tokens + \
            [cfg.vision_end_token_id]
    return ids


def prompt_len(frames: int, shape: FrameShape, text: int = PROMPT_TEXT) -> int:
    return text + frames * (FRAME_TEXT + 2 + shape.tokens)


def sft_examples(cfg, max_length: int, frames: int, shape: FrameShape, answer: int, seed: int,
                 prompts: list[tuple[int, int]] | None = None):
    """One pack of ``max_length`` tokens: examples of ``frames`` frames and ``answer`` supervised tokens
    while a whole one fits, then one with as many frames as fit beside ``answer`` tokens, its answer
    filling the pack to ``max_length``. ``prompts`` [(frames, answer), ...] gives the examples instead."""
    from paravt.sft.data import IGNORE, Example  # noqa: PLC0415

    g = torch.Generator().manual_seed(seed)
    if prompts is None:
        prompts, room = [], max_length
        per_frame = FRAME_TEXT + 2 + shape.tokens
        while room >= prompt_len(frames, shape) + answer:
            prompts.append((frames, answer))
            room -= prompt_len(frames, shape) + answer
        k = min(frames, (room - PROMPT_TEXT - answer) // per_frame)
        if k >= 1:
            prompts.append((k, room - prompt_len(k, shape)))
        elif prompts:  # no room for another framed example: the last answer fills the pack
            prompts[-1] = (prompts[-1][0], prompts[-1][1] + room)
        else:
            prompts.append((0, max(1, max_length - PROMPT_TEXT)))
    out = []
    for i, (k, a) in enumerate(prompts):
        ids = prompt_ids(cfg, k, shape, g)
        ans = torch.randint(1000, 100000, (a,), generator=g).tolist()
        out.append(Example(ids + ans, [IGNORE] * len(ids) + ans, DryImages(i, k, shape) if k else None))
    return out


def rl_samples(cfg, prompts: int, n_samples: int, frames: int, shape: FrameShape, answer: int, seed: int):
    """A step's samples: ``prompts`` groups of ``n_samples`` rollouts, each the group's overview prompt of
    ``frames`` frames (shared images, as a GRPO group shares its overview) and ``answer`` policy tokens;
    advantages alternate in sign."""
    from paravt.rl.rollout import Sample  # noqa: PLC0415

    g = torch.Generator().manual_seed(seed)
    out = []
    for p in range(prompts):
        ids = prompt_ids(cfg, frames, shape, g)
        images = DryImages(p, frames, shape)
        for j in range(n_samples):
            ans = torch.randint(1000, 100000, (answer,), generator=g).tolist()
            n = len(ids) + answer
            out.append(Sample(ids + ans, [0] * len(ids) + [1] * answer, [-1.0] * n, images, 1.0 if j % 2 else -1.0))
    return out


def vision_ids(cfg) -> torch.Tensor:
    """The vision placeholder ids (the trainer bans them from the policy's distribution)."""
    ids = [cfg.image_token_id, getattr(cfg, "video_token_id", None), cfg.vision_start_token_id, cfg.vision_end_token_id]
    return torch.tensor([i for i in ids if i is not None], dtype=torch.long)
