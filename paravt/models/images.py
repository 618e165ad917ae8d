"""Images sent with a prompt, preprocessed once.

The overview of one prompt is shared by the n rollouts of its GRPO group and by every turn of
each episode, so its pixel tensors are computed once and cached on the object.
"""

from __future__ import annotations

import base64
import io
from typing import Any, Sequence

from PIL import Image


class ImageInputs:
    """An ordered list of PIL images (in the order of their placeholders in the prompt)."""

    def __init__(self, images: Sequence[Image.Image]):
        self.images = list(images)
        self._tensors = None
        self._tensors_key = None
        self._data_urls: list[str] | None = None

    @classmethod
    def wrap(cls, images: Any) -> "ImageInputs | None":
        if images is None:
            return None
        if isinstance(images, ImageInputs):
            return images
        return cls(images)

    def __len__(self) -> int:
        return len(self.images)

    def __add__(self, other: "ImageInputs | Sequence[Image.Image] | None") -> "ImageInputs":
        """Concatenation; cached tensors are concatenated too (no re-preprocessing)."""
        other = ImageInputs.wrap(other)
        if other is None or not len(other):
            return self
        out = ImageInputs(self.images + other.images)
        if self._tensors is not None and other._tensors is not None and self._tensors_key == other._tensors_key:
            import torch  # noqa: PLC0415

            out._tensors = (torch.cat([self._tensors[0], other._tensors[0]]),
                            torch.cat([self._tensors[1], other._tensors[1]]))
            out._tensors_key = self._tensors_key
        if self._data_urls is not None and other._data_urls is not None:
            out._data_urls = self._data_urls + other._data_urls
        return out

    def tensors(self, processor):
        """(pixel_values, image_grid_thw) from the processor's image processor, cached."""
        key = id(processor.image_processor)
        if self._tensors is None or self._tensors_key != key:
            out = processor.image_processor(images=self.images, return_tensors="pt")
            self._tensors = (out["pixel_values"], out["image_grid_thw"])
            self._tensors_key = key
        return self._tensors

    def data_urls(self, fmt: str = "PNG") -> list[str]:
        """``data:image/png;base64,...`` strings (for HTTP engines), cached."""
        if self._data_urls is None:
            urls = []
            for im in self.images:
                buf = io.BytesIO()
                im.save(buf, format=fmt)
                urls.append(f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode())
            self._data_urls = urls
        return self._data_urls
