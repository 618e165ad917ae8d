"""An image-only Qwen3-VL processor.

``Qwen3VLProcessor`` insists on a video processor, and Qwen's video processor needs
torchvision, which does not install beside the CPU torch. ParaVT never sends video tensors
(the overview and the crops are frames-as-images with timestamp text, as in the paper §3.1), so an
image-only processor is all the model needs. It is the same class for the tiny model and
any other checkpoint we save; loading a stock Qwen3-VL checkpoint still gives the stock
processor. :func:`register` makes ``AutoProcessor`` build it for our checkpoints
(:mod:`paravt.models.loading` calls it once, in every process that loads a processor).
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoProcessor, PretrainedConfig
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor


class ParaVTImageProcessorConfig(PretrainedConfig):
    """Only a registry key for :class:`ParaVTQwen3VLProcessor` (no model uses it)."""

    model_type = "paravt_qwen3_vl_image_only"


class ParaVTQwen3VLProcessor(Qwen3VLProcessor):
    """Qwen3VLProcessor with an image processor and a tokenizer, and no video processor."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # ProcessorMixin pairs positional sub-processors with get_attributes(), which reads
        # this signature: (image_processor, tokenizer). The missing video processor is dropped.
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    def __call__(self, images=None, text=None, videos=None, **kwargs):
        if videos is not None:
            raise ValueError(
                "ParaVTQwen3VLProcessor is image-only: send video as timestamped frames "
                "(paravt.core.prompts.frames_content), not as a video tensor"
            )
        return super().__call__(images=images, text=text, **kwargs)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save as usual, plus a ``video_preprocessor_config.json`` for servers that decode video
        themselves (vLLM builds the stock Qwen3VLProcessor, video processor included, from the
        checkpoint: without this file it refuses to start)."""
        out = super().save_pretrained(save_directory, *args, **kwargs)
        write_video_processor_config(self.image_processor, save_directory)
        return out


def write_video_processor_config(image_processor, save_directory, max_frames: int = 768) -> Path:
    """``video_preprocessor_config.json`` for the stock ``Qwen3VLVideoProcessor``, matching the image
    processor: patch/merge/temporal sizes and normalisation, and its per-frame pixel bounds turned
    into Qwen3-VL's whole-clip budget (``size`` bounds t·h·w: one temporal patch of the smallest
    frame up to ``max_frames`` of the largest)."""
    ip = image_processor
    size = ip.size or {}
    lo, hi = int(size.get("shortest_edge", 784)), int(size.get("longest_edge", 50176))
    cfg = {
        "video_processor_type": "Qwen3VLVideoProcessor", "processor_class": "Qwen3VLProcessor",
        "patch_size": ip.patch_size, "temporal_patch_size": ip.temporal_patch_size, "merge_size": ip.merge_size,
        "image_mean": list(ip.image_mean), "image_std": list(ip.image_std), "do_normalize": True,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_resize": True, "do_convert_rgb": True,
        "size": {"shortest_edge": lo * ip.temporal_patch_size, "longest_edge": hi * max_frames},
        "do_sample_frames": True, "fps": 2, "min_frames": 4, "max_frames": max_frames,
        "cap_pixels_per_frame": False,
    }
    path = Path(save_directory) / "video_preprocessor_config.json"
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    return path


def register() -> None:
    """``AutoProcessor.from_pretrained`` builds :class:`ParaVTQwen3VLProcessor` for a checkpoint saved with it
    (idempotent)."""
    AutoProcessor.register(ParaVTImageProcessorConfig, ParaVTQwen3VLProcessor, exist_ok=True)
