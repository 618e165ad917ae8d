"""Loading helpers shared by the tiny model and Qwen3-VL-8B: one path for both."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from paravt.core.config import check_dtype
from paravt.models import packed_attention, processor, vision_attention

packed_attention.register()  # attn_implementation="sdpa_varlen" in every process that loads or builds a model
processor.register()  # AutoProcessor builds the image-only processor of our checkpoints

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}  # the names of paravt.core.config.DTYPE_NAMES


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    check_dtype(name)
    return DTYPES[name]


def default_attn_implementation() -> str:
    """flash_attention_2 on CUDA when flash-attn is installed, else ``sdpa_varlen`` (SDPA within each
    packed sequence: :mod:`paravt.models.packed_attention`)."""
    if torch.cuda.is_available():
        try:
            import flash_attn  # noqa: F401, PLC0415

            return "flash_attention_2"
        except ImportError:
            pass
    return packed_attention.NAME


ROTARY_BUFFERS = ("inv_freq", "original_inv_freq")  # rotary frequencies: transformers computes them in fp32


def cast_keeping_rotary_fp32(model, dtype: str | torch.dtype):
    """``model.to(dtype)`` with every rotary frequency buffer (text and vision) left as it was, fp32: what
    ``load_model(..., dtype=...)`` gives (from_pretrained builds them in fp32 whatever the weights' dtype),
    so a cast copy computes the same rotary angles as a loaded engine or the FSDP2 trainer, whose mixed
    precision casts parameters only. Returns the model."""
    keep = [(m, name, buf) for m in model.modules() for name, buf in m.named_buffers(recurse=False)
            if name in ROTARY_BUFFERS]
    model.to(resolve_dtype(dtype))
    for m, name, buf in keep:
        setattr(m, name, buf)  # the tensor from before the cast: same device, fp32
    return model


def load_model(path: str | Path, dtype: str | torch.dtype = "float32", attn_implementation: str | None = None,
               device: str | torch.device | None = None, **kwargs: Any):
    """A ``Qwen3VLForConditionalGeneration`` (or any image-text-to-text model) from a directory or hub id."""
    from transformers import AutoModelForImageTextToText  # noqa: PLC0415

    attn = attn_implementation or default_attn_implementation()
    if Path(str(path)).exists() and not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json: not a saved model directory")
    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=resolve_dtype(dtype),
                                                        attn_implementation=attn, **kwargs)
    vision_attention.install(model)  # one attention call per block for frames of one size, linear patch embedding
    if device is not None:
        model.to(device)
    return model


def load_processor(path: str | Path, min_pixels: int | None = None, max_pixels: int | None = None):
    """The processor saved with a model (image-only for ParaVT checkpoints, stock for Qwen's)."""
    from transformers import AutoProcessor  # noqa: PLC0415

    proc = AutoProcessor.from_pretrained(str(path))
    if not hasattr(proc, "image_processor"):
        raise TypeError(f"{path}: AutoProcessor returned {type(proc).__name__}, not a multimodal processor")
    ip = proc.image_processor
    if min_pixels is not None or max_pixels is not None:
        size = dict(getattr(ip, "size", {}) or {})
        if min_pixels is not None:
            size["shortest_edge"] = min_pixels
        if max_pixels is not None:
            size["longest_edge"] = max_pixels
        ip.size = size
    return proc


def enable_activation_checkpointing(model) -> None:
    """Recompute each layer's activations in backward (non-reentrant). transformers >= 5.23 names it
    ``activation_checkpointing_enable`` and warns on the old name; older 5.x only has the old one."""
    kw = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
