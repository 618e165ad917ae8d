"""Prompt encoding with the model's own processor: chat template → token ids with each image's
placeholder expanded to its patch tokens, and the ids of the vision placeholder tokens.

Every stage encodes through these functions (the episode, the SFT packer, the CPU server), so a
prompt has one token sequence everywhere."""

from __future__ import annotations

import asyncio
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from paravt.models.images import ImageInputs

VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")


def images_of(messages: list[dict[str, Any]]) -> list[Any]:
    """The images of ``messages`` in placeholder order."""
    out = []
    for m in messages:
        if isinstance(m.get("content"), list):
            out.extend(i["image"] for i in m["content"] if i.get("type") == "image")
    return out


def encode_text(processor, text: str, images: list[Any] | None) -> tuple[list[int], ImageInputs | None]:
    """Ids of an already rendered ``text``; with images, their pixel tensors are cached on the result."""
    if images:
        imgs = ImageInputs(images)
        out = processor(text=[text], images=imgs.images, return_tensors="pt")
        imgs.cache_tensors(processor, out["pixel_values"], out["image_grid_thw"])
        return out["input_ids"][0].tolist(), imgs
    return processor.tokenizer.encode(text, add_special_tokens=False), None


def encode_prompt(processor, messages: list[dict[str, Any]], prefix: str = "") -> tuple[list[int], ImageInputs | None]:
    """Token ids (image placeholders expanded) of ``messages`` + generation prompt + prefix."""
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + prefix
    return encode_text(processor, text, images_of(messages))


#: Where concurrent prompt encodings run (the sub-agents of a turn): ONE worker, off the asyncio loop.
#: Encoding is the chat template plus the image processor, Python and small torch ops holding the GIL;
#: four 16-frame sub-agent prompts encoded in four threads all finished after ~40 ms, one after
#: another they take ~5 ms each alone, 8-11 ms in an episode (benchmarks/README.md), so the first request
#: reaches the engine at ~11-15 ms instead of ~38 ms. The heavy tensor work inside one encoding still
#: uses torch's intra-op threads, so one worker does not cap a many-core node to one core.
#: ``PARAVT_ENCODE_WORKERS`` sets the worker count. More workers encode a burst faster (64 sixteen-frame
#: prompts: 6.3 s with 1, 3.5 s with 2, 3.3 s with 4 on 2 cores, benchmarks/bench_encode_pool.py), but the
#: order requests then reach the engine depends on thread timing, which changes how the in-process engine
#: batches them, so two runs are no longer guaranteed identical (with 1, the default, they are; not measured).
def encode_workers() -> int:
    try:
        return max(1, int(os.environ.get("PARAVT_ENCODE_WORKERS", "1")))
    except ValueError:
        raise ValueError(f"PARAVT_ENCODE_WORKERS must be an integer >= 1, got {os.environ['PARAVT_ENCODE_WORKERS']!r}") from None


ENCODE_POOL = ThreadPoolExecutor(max_workers=encode_workers(), thread_name_prefix="paravt-encode")


def _after_fork_in_child() -> None:  # a forked child has none of the parent's pool threads
    global ENCODE_POOL
    _INHERITED.append(ENCODE_POOL)
    ENCODE_POOL = ThreadPoolExecutor(max_workers=encode_workers(), thread_name_prefix="paravt-encode")


_INHERITED: list = []
os.register_at_fork(after_in_child=_after_fork_in_child)


async def run_encode(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` (an encoding) in :data:`ENCODE_POOL`, in submission order."""
    pool = ENCODE_POOL  # looked up now: a forked child has its own
    return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args, **kwargs))


def vision_token_ids(tokenizer) -> list[int]:
    """Ids of the vision placeholder tokens; a policy that writes one breaks the next forward."""
    ids = []
    for t in VISION_TOKENS:
        i = tokenizer.convert_tokens_to_ids(t)
        if isinstance(i, int) and i >= 0 and i != tokenizer.unk_token_id:
            ids.append(i)
    return ids


def image_pad_id(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids("<|image_pad|>")


def think_token_ids(tokenizer) -> tuple[int, int] | None:
    """(id of ``<think>``, id of ``</think>``) when both are single tokens (Qwen3-VL, the tiny model)."""
    ids = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    if all(isinstance(i, int) and i >= 0 and i != tokenizer.unk_token_id for i in ids):
        return ids[0], ids[1]
    return None
