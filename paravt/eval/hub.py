"""Hugging Face Hub access of the benchmark splits, below both :mod:`paravt.eval.splits` (which looks
a split up in the cache) and :mod:`paravt.eval.fetch` (the download CLI): a split's snapshot from the
Hub cache (``huggingface_hub.snapshot_download``), its archives found and extracted (resumable, content
checked), and where its media land; :class:`HubConfig` is where a split is looked up (the eval config's
``hub``). Knows a split only through its :class:`HubSource` fields."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from paravt.core.config import check_choices, choice
from paravt.data.archives import extract, find_archives
from paravt.eval.sample import SplitConfig


def hf_home() -> Path:
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser()


class HubUnavailable(RuntimeError):
    """The split is not in the cache and could not (or may not) be downloaded."""


Source = Literal["auto", "local", "hub"]


@dataclass
class HubConfig:
    """Where a split is looked up when data_root/<dir> does not hold it (python -m paravt.eval.fetch)."""
    source: str = choice(Source)  # auto: data_root first, then the Hugging Face cache | local: data_root only | hub: the cache only
    download: bool = False  # true: download + extract a split the cache lacks on first use (the release does; GBs)
    cache_dir: str | None = None  # Hub cache; null: HF_HUB_CACHE, else $HF_HOME/hub
    media_root: str | None = None  # extracted videos; null: $HF_HOME/<the split's media dir> (lmms-eval's folders)
    progress: bool = True  # progress bars of downloads and extraction

    def __post_init__(self):
        check_choices(self, "hub")


def snapshot(c: SplitConfig, *, download: bool = False, cache_dir: str | None = None, with_media: bool = False) -> Path:
    """The local snapshot folder of the split's Hub dataset (annotations, plus the media files
    when ``with_media``): from the cache, or downloaded when ``download`` (HF_HUB_OFFLINE=1 keeps
    it offline). HubUnavailable, one line, when it cannot be had."""
    if c.hub is None:
        raise HubUnavailable(f"split {c.name} has no Hub dataset")
    try:
        from huggingface_hub import snapshot_download  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - a dependency of transformers
        raise HubUnavailable(f"huggingface_hub is not installed ({exc})") from None
    patterns = list(c.hub.annotations) + (list(c.hub.media) if with_media else [])
    try:
        path = snapshot_download(c.hub.repo_id, repo_type="dataset", allow_patterns=patterns,
                                 cache_dir=cache_dir, local_files_only=not download)
    except Exception as exc:  # noqa: BLE001 - LocalEntryNotFound, IncompleteSnapshot, gated, HTTP, OS errors
        msg = " ".join(str(exc).split())[:400]
        hint = "" if download else " (not in the cache; python -m paravt.eval.fetch downloads it)"
        raise HubUnavailable(f"{c.hub.repo_id}: {type(exc).__name__}: {msg}{hint}") from None
    return Path(path)


def media_dir(c: SplitConfig, media_root: str | None = None) -> Path:
    assert c.hub is not None
    return Path(media_root).expanduser() if media_root else hf_home() / c.hub.media_dir


def prepare(c: SplitConfig, *, download: bool, cache_dir: str | None = None, media_root: str | None = None,
            progress: bool = True, counts: dict[str, dict[str, int]] | None = None) -> Path:
    """The split's snapshot with its media, archives extracted (what the driver does on first use
    with ``hub.download=true``)."""
    snap = snapshot(c, download=download, cache_dir=cache_dir, with_media=True)
    dest = media_dir(c, media_root)
    assert c.hub is not None
    for a in find_archives(snap, c.hub.media):
        done = extract(a, dest, progress)
        if counts is not None:
            counts[a.name] = done
    return snap


