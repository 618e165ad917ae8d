"""Images sent with a prompt, preprocessed once.

The overview of one prompt is shared by the n rollouts of its GRPO group and by every turn of
each episode, so its pixel tensors are computed once and cached on the object. The cache is keyed
by the image processor's settings (:func:`processor_key`), not by the processor object: a processor
loaded again with the same settings (another rank, a restarted process) reuses the tensors, and one
with other settings never does.

:meth:`ImageInputs.portable` is the form another process receives: each video frame as where it was
decoded from (:class:`paravt.core.frame_sources.FrameSource`, decoded again on first use), other
images as themselves, no pixel tensors or data URLs (caches the receiver recomputes if it needs them).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from typing import Any, Sequence

from PIL import Image

from paravt.core.frame_sources import FrameSource, decode, source_of


def processor_key(processor) -> str:
    """A stable hash of the image processor's settings (its class and ``to_dict()``: patch, merge and
    temporal patch sizes, pixel bounds, mean/std, resampling, rescaling): equal for equal settings."""
    ip = processor.image_processor
    cfg = {k: v for k, v in ip.to_dict().items() if not k.startswith("_")}
    blob = json.dumps([f"{type(ip).__module__}.{type(ip).__qualname__}", cfg], sort_keys=True, default=repr)
    return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()


class ImageInputs:
    """An ordered list of PIL images (in the order of their placeholders in the prompt)."""

    def __init__(self, images: Sequence[Image.Image]):
        self._images: list[Image.Image] | None = list(images)
        self._entries: list[FrameSource | Image.Image] | None = None  # portable form: decoded on first use
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

    @property
    def images(self) -> list[Image.Image]:
        if self._images is None:  # a portable copy: its frames decoded here, once
            frames = iter(decode([e for e in self._entries if isinstance(e, FrameSource)]))
            self._images = [next(frames) if isinstance(e, FrameSource) else e for e in self._entries]
        return self._images

    def __len__(self) -> int:
        return len(self._images if self._images is not None else self._entries)

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

    def sources(self) -> list[FrameSource]:
        """The frame sources of a portable copy (empty for any other)."""
        return [e for e in self._entries or () if isinstance(e, FrameSource)]

    def portable(self, frame_sources: bool = True) -> "ImageInputs":
        """A copy to send to another process: without pixel tensors or data URLs, and (``frame_sources``)
        each PyAV-decoded video frame as its source instead of its pixels."""
        out = ImageInputs(())
        if self._images is None and frame_sources:  # a portable copy not yet decoded
            out._images, out._entries = None, list(self._entries)
            return out
        entries = [(source_of(im) if frame_sources else None) or im for im in self.images]
        if any(isinstance(e, FrameSource) for e in entries):
            out._images, out._entries = None, entries
        else:
            out._images, out._entries = entries, None
        return out

    def cache_tensors(self, processor, pixel_values, grid) -> None:
        """Keep ``processor``'s (pixel_values, image_grid_thw) of these images (computed elsewhere)."""
        self._tensors, self._tensors_key = (pixel_values, grid), processor_key(processor)

    def tensors(self, processor):
        """(pixel_values, image_grid_thw) from the processor's image processor, cached."""
        key = processor_key(processor)
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
