"""SFT data path: manifest → rows → messages with frames → token ids + labels → batches.

* Media: ``video_url`` items become timestamped frames-as-images (``<t seconds>`` + image, the
  same representation RL and eval use): ``nframes: K`` → a K-frame overview; ``video_start`` /
  ``video_end`` → that window at ``fps`` (≤ ``max_frames``); otherwise the whole video at
  1 fps, ≤ 64 frames. ``image_url`` items are loaded as images.
* Labels: only assistant tokens are supervised (the assistant content and its ``<|im_end|>``);
  system, user, tool responses and template tokens are -100. Pieces are rendered by the
  model's chat template and tokenised piece by piece at the turn boundaries (the same way
  the episode builds RL sequences), with image placeholders expanded by the processor.
* Batches: padded (``collate_padded``) or packed into one row (``collate_packed``) with
  per-sequence positions: row 0 of the 4-row ``position_ids`` restarts at 0 for every
  sequence, which makes transformers build a block-diagonal causal mask (sdpa / eager) or
  varlen flash-attention, and rows 1–3 are each sequence's own M-RoPE positions.
* Streaming greedy packer (:class:`PackedStream`): rows are taken in a seeded order and
  added to a bin until the next one does not fit; its cursor (the first row not yet
  consumed) is all a checkpoint needs to resume the exact same bins.
* A step (:meth:`PackedStream.step_batches`): this rank's part of the step's ``global_batch_size``
  (:class:`paravt.sft.config.StepSplit`), as the release's loader batches
  ``per_device_train_batch_size`` packs per GPU; with packing each pack is its own micro-batch (one
  forward and backward at a time, so memory is that of one pack), without it the rows are spread
  over the step's passes; the trainer normalises the loss over the supervised tokens of the whole
  step on every rank, which gives the gradient of the global batch on any world size.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from PIL import Image

from paravt.models.tokenize import encode_text
from paravt.core import prompts
from paravt.core.seeding import rng
from paravt.core.video import sample_fps, sample_overview
from paravt.core.video_reader import VideoError, local_path
from paravt.data.schema import DataError, SFTRow, SkipReport, load_sft_rows
from paravt.models.images import ImageInputs
from paravt.sft.config import Shard, VideoSamplingConfig

log = logging.getLogger(__name__)
IGNORE = -100



@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]
    images: ImageInputs | None
    row: str = ""

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def n_supervised(self) -> int:
        return sum(1 for x in self.labels if x != IGNORE)


class SkipRow(Exception):
    """This row cannot be used (missing/corrupt video, too long); the reason is counted."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


# ---------------------------------------------------------------------------------------
# Media and tokenisation
# ---------------------------------------------------------------------------------------

def _url(item: dict[str, Any], key: str) -> str:
    v = item.get(key)
    return v.get("url", "") if isinstance(v, dict) else str(v or "")


def expand_media(messages: list[dict[str, Any]], video: VideoSamplingConfig) -> list[dict[str, Any]]:
    """Replace video_url / image_url items by frames-as-images (+ timestamps) / images."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            items: list[dict[str, Any]] = []
            for it in content:
                t = it.get("type")
                if t == "video_url":
                    path = local_path(_url(it, "video_url"))
                    if it.get("nframes"):
                        frames = sample_overview(path, int(it["nframes"]), video.factor, video.min_pixels, video.max_pixels,
                                                 video.decoder)
                    else:
                        frames = sample_fps(path, float(it.get("fps") or video.fps), int(it.get("max_frames") or video.max_frames),
                                            video.min_frames, it.get("video_start"), it.get("video_end"), video.factor,
                                            video.min_pixels, video.max_pixels, video.decoder)
                    items.extend(prompts.frames_content(frames))
                elif t == "image_url":
                    path = local_path(_url(it, "image_url"))
                    try:
                        items.append({"type": "image", "image": Image.open(path).convert("RGB")})
                    except OSError as exc:
                        raise VideoError(f"cannot open image {path}: {exc}") from exc
                else:
                    items.append(it)
            content = items
        out.append({**m, "content": content})  # other keys ("weight") kept
    return out


def _n_images(text: str) -> int:
    return text.count("<|image_pad|>")


def tokenize_conversation(processor, messages: list[dict[str, Any]]) -> Example:
    """Token ids and labels; only assistant turns (content + ``<|im_end|>``) are supervised, except
    those marked ``"weight": 0`` (kept as context)."""
    render = processor.apply_chat_template
    full = render(messages, tokenize=False, add_generation_prompt=False)
    images = [i["image"] for m in messages if isinstance(m["content"], list) for i in m["content"]
              if i.get("type") == "image"]
    pieces: list[tuple[str, bool]] = []  # (text, supervised)
    pos = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or m.get("weight", 1) == 0:  # weight 0: context only (as axolotl's)
            continue
        start = len(render(messages[:i], tokenize=False, add_generation_prompt=True)) if i else 0
        through = render(messages[: i + 1], tokenize=False, add_generation_prompt=False)
        if not full.startswith(through) or start < pos:
            raise ValueError("chat template is not prefix-stable; cannot locate assistant turns")
        end = len(through)
        eos = through.rfind("<|im_end|>")
        sup_end = eos + len("<|im_end|>") if eos >= start else end
        pieces.append((full[pos:start], False))
        pieces.append((full[start:sup_end], True))
        pos = sup_end
    pieces.append((full[pos:], False))

    ids: list[int] = []
    labels: list[int] = []
    img_inputs: ImageInputs | None = None
    k = 0
    for text, sup in pieces:
        if not text:
            continue
        n = _n_images(text)
        if sup and n:
            raise ValueError("an assistant turn contains an image placeholder")
        piece_ids, piece_imgs = encode_text(processor, text, images[k:k + n] if n else None)
        k += n
        ids.extend(piece_ids)
        labels.extend(piece_ids if sup else [IGNORE] * len(piece_ids))
        if piece_imgs is not None:
            img_inputs = piece_imgs if img_inputs is None else img_inputs + piece_imgs
    if k != len(images):
        raise ValueError(f"{len(images)} images but {k} placeholders")
    return Example(ids, labels, img_inputs)


class ExampleBuilder:
    """SFTRow → Example, with the reasons rows are skipped counted (:class:`paravt.sft.example_cache.CachedBuilder`
    keeps what it builds across epochs)."""

    def __init__(self, processor, video: VideoSamplingConfig, max_length: int):
        self.processor, self.video, self.max_length = processor, video, max_length
        self.skipped: Counter = Counter()

    def __call__(self, row: SFTRow) -> Example:
        try:
            msgs = expand_media(row.messages, self.video)
        except VideoError as exc:
            self.skipped["missing or corrupt video"] += 1
            raise SkipRow("missing or corrupt video", f"{row.where}: {exc}") from exc
        ex = tokenize_conversation(self.processor, msgs)
        ex.row = row.where
        if len(ex) > self.max_length:
            self.skipped["longer than max_length"] += 1
            raise SkipRow("longer than max_length", f"{row.where}: {len(ex)} > {self.max_length} tokens")
        if ex.n_supervised == 0:
            self.skipped["no supervised tokens"] += 1
            raise SkipRow("no supervised tokens", row.where)
        return ex


# ---------------------------------------------------------------------------------------
# Manifest
# ---------------------------------------------------------------------------------------


class MissingShardError(FileNotFoundError):
    """A required SFT shard matches no file (a wrong name would silently drop its rows)."""


def load_manifest(shards: list[Shard], check_media: bool = True) -> tuple[list[SFTRow], SkipReport, list[str]]:
    """Rows of every shard. A required shard that matches no file raises :class:`MissingShardError`
    naming every such shard (the authors' loader logs and skips, so a misspelt name loses its
    rows silently); an ``optional: true`` shard is logged, skipped and returned in ``missing``."""
    rows: list[SFTRow] = []
    report = SkipReport()
    absent = [sh for sh in shards if not Path(sh.path).is_file()]
    required = [sh for sh in absent if not sh.optional]
    if required:
        names = ", ".join(f"{sh.path} ({sh.name or '-'})" for sh in required)
        raise MissingShardError(f"SFT manifest: {len(required)} required shard(s) match no file: {names}. "
                                "Fix the path/name, or mark the entry `optional: true` to skip it.")
    missing = []
    for sh in shards:
        if sh in absent:
            log.warning("SFT shard %s (%s) is missing and optional: skipped", sh.path, sh.name or "-")
            missing.append(sh.path)
            continue
        got, _ = load_sft_rows([sh.path], check_media=check_media, report=report, require_rows=False)
        rows.extend(got[: sh.max_rows] if sh.max_rows else got)
    if not rows:
        raise DataError(f"SFT data: no usable rows in {', '.join(sh.path for sh in shards)}: {report.summary()}")
    return rows, report, missing


# ---------------------------------------------------------------------------------------
# Ordering and packing
# ---------------------------------------------------------------------------------------

def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    return rng(seed, "sft-order", epoch).permutation(n).tolist()


@dataclass
class StreamState:
    epoch: int = 0
    cursor: int = 0  # position in this rank's share of the epoch order: first row not yet consumed

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}


@dataclass
class PackedStream:
    """Deterministic stream of micro-batches (lists of Examples) for one data-parallel rank.

    ``pack=True``: greedy bins of at most ``max_length`` tokens; ``pack=False``: ``batch_size`` examples
    per micro-batch (:meth:`step_batches` gives a step's)."""

    rows: list[SFTRow]
    build: Callable[[SFTRow], Example]
    seed: int
    max_length: int
    pack: bool = True
    batch_size: int = 1
    rank: int = 0
    world_size: int = 1
    state: StreamState = field(default_factory=StreamState)
    first_skip: str | None = None  # the first row skipped while building examples (named when none is usable)
    _held: tuple[SFTRow, Example] | None = field(default=None, repr=False)  # (row, its example) left for the next bin

    def _share(self, epoch: int) -> list[int]:
        return epoch_order(len(self.rows), self.seed, epoch)[self.rank::self.world_size]

    def step_batches(self, sizes: list[int]) -> list[list[Example]]:
        """This rank's micro-batches of one optimizer step (:meth:`paravt.sft.config.StepSplit.micro_sizes`):
        with packing one bin per entry of ``sizes``; without, micro-batches of that many rows."""
        return [self.next_batch(None if self.pack else n) for n in sizes]

    def next_batch(self, rows: int | None = None) -> list[Example]:
        """The next bin (packing) or the next ``rows`` (default ``batch_size``) rows; an epoch's last may be short."""
        rows = rows or self.batch_size
        batch: list[Example] = []
        n_tok = 0
        empty_epochs = 0
        while True:
            share = self._share(self.state.epoch)
            if self.state.cursor >= len(share):
                if batch:
                    return batch  # the epoch's last, partial bin
                self.state.epoch += 1
                self.state.cursor = 0
                empty_epochs += 1
                if empty_epochs > 2:
                    raise DataError(f"no usable SFT rows: every one of {len(self.rows)} row(s) was skipped when "
                                    f"building examples; first: {self.first_skip or 'unknown'}")
                continue
            row = self.rows[share[self.state.cursor]]
            try:
                # the row that did not fit the last bin opens this one: built once, not again
                held, self._held = self._held, None
                ex = held[1] if held is not None and held[0] is row else self.build(row)
            except SkipRow as exc:
                log.debug("skip %s", exc)
                if self.first_skip is None:
                    self.first_skip = " ".join(str(exc).split())[:300]
                self.state.cursor += 1
                continue
            empty_epochs = 0
            if self.pack:
                if batch and n_tok + len(ex) > self.max_length:
                    self._held = (row, ex)
                    return batch  # the row stays unconsumed: it opens the next bin
                batch.append(ex)
                n_tok += len(ex)
                self.state.cursor += 1
            else:
                batch.append(ex)
                self.state.cursor += 1
                if len(batch) == rows:
                    return batch


# ---------------------------------------------------------------------------------------
# Collation
# ---------------------------------------------------------------------------------------

def _images(examples: list[Example], processor) -> dict[str, torch.Tensor]:
    pv, grids = [], []
    for ex in examples:
        if ex.images is not None and len(ex.images):
            p, g = ex.images.tensors(processor)
            pv.append(p)
            grids.append(g)
    if not pv:
        return {}
    return {"pixel_values": torch.cat(pv), "image_grid_thw": torch.cat(grids)}


def collate_padded(examples: list[Example], processor, pad_id: int, image_token_id: int) -> dict[str, torch.Tensor]:
    L = max(len(e) for e in examples)
    B = len(examples)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    labels = torch.full((B, L), IGNORE, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e)
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
        attn[i, :n] = 1
    batch = {"input_ids": ids, "labels": labels, "attention_mask": attn,
             "mm_token_type_ids": (ids == image_token_id).long() * attn}
    batch.update(_images(examples, processor))
    return batch


def collate_packed(examples: list[Example], processor, image_token_id: int,
                   rope_index: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One row holding every example; per-sequence text and M-RoPE positions; no attention mask."""
    ids_l, labels_l, text_pos, mrope = [], [], [], []
    for e in examples:
        ids = torch.tensor([e.input_ids])
        mm = (ids == image_token_id).long()
        grid = e.images.tensors(processor)[1] if e.images is not None and len(e.images) else None
        pos3, _ = rope_index(ids, mm, image_grid_thw=grid)
        lab = list(e.labels)
        lab[0] = IGNORE  # never predict a sequence's first token from the previous sequence
        ids_l.append(ids[0])
        labels_l.append(torch.tensor(lab))
        text_pos.append(torch.arange(len(e)))
        mrope.append(pos3[:, 0])
    input_ids = torch.cat(ids_l)[None]
    position_ids = torch.cat([torch.cat(text_pos)[None], torch.cat(mrope, dim=1)], dim=0)[:, None, :]
    batch = {"input_ids": input_ids, "labels": torch.cat(labels_l)[None], "position_ids": position_ids,
             "mm_token_type_ids": (input_ids == image_token_id).long()}
    batch.update(_images(examples, processor))
    return batch


def padding_stats(examples: list[Example], packed: bool, max_length: int) -> dict[str, float]:
    real = sum(len(e) for e in examples)
    total = max(real, 1) if packed else max((len(e) for e in examples), default=0) * len(examples)
    return {"real_tokens": real, "batch_tokens": total, "padding_fraction": 1 - real / max(total, 1),
            "fill_of_max_length": real / max_length if packed else float("nan")}


__all__ = ["Example", "ExampleBuilder", "IGNORE", "PackedStream", "Shard", "SkipRow", "StreamState", "VideoSamplingConfig",
           "MissingShardError", "collate_packed", "collate_padded", "epoch_order", "expand_media", "load_manifest", "padding_stats",
           "tokenize_conversation"]
