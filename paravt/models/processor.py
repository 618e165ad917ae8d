"""An image-only Qwen3-VL processor.

``Qwen3VLProcessor`` insists on a video processor, and Qwen's video processor needs
torchvision, which does not install beside the CPU torch. ParaVT never sends video tensors
(the overview and the crops are frames-as-images with timestamp text, as in the paper §3.1), so an
image-only processor is all the model needs. It is the same class for the tiny model and
any other checkpoint we save; loading a stock Qwen3-VL checkpoint still gives the stock
processor. Importing this module registers the class with ``AutoProcessor``.
"""

from __future__ import annotations

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


AutoProcessor.register(ParaVTImageProcessorConfig, ParaVTQwen3VLProcessor, exist_ok=True)
