"""What one benchmark item is and how a benchmark split is described: the types the split registry
(:mod:`paravt.eval.splits`), the per-benchmark row loaders (:mod:`paravt.eval.loaders`) and the Hub
access (:mod:`paravt.eval.hub`) share."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LETTERS = "ABCDEFGHIJ"
MCQ_SUFFIX = "Answer with the option's letter from the given choices directly."
LETTER_PREFIX = re.compile(r"^\(?([A-J])[.):]\s*")


@dataclass
class BenchmarkItem:
    """One question of a benchmark split with its video and gold answer, as the eval driver runs it."""

    id: str
    split: str
    video: str
    question: str  # question text with the options appended
    answer: Any  # option letter (mcq) or [start, end] (tvg) or text (oe)
    question_type: str = "mcq"
    duration_bucket: str = ""
    task: str = ""
    subtitle: str | None = None
    duration: float | None = None
    span: list[float] | None = None  # where the asked event happens, when known (the viewer draws it)
    options: list[str] = field(default_factory=list)  # mcq: option texts in letter order (A first), letters stripped

    @property
    def video_exists(self) -> bool:
        return Path(self.video).is_file()


@dataclass(frozen=True)
class Layout:
    name: str  # hub | publisher | ...
    annotation: str  # path or glob under the split root ("MLVU/json" is a folder)
    loader: str  # key of LOADERS


@dataclass(frozen=True)
class HubSource:
    repo_id: str  # the dataset id the authors' release loads
    split: str  # the `datasets` split it loads
    annotations: tuple[str, ...]  # allow_patterns of the annotation files
    media: tuple[str, ...]  # allow_patterns of the videos/subtitles (archives or plain files)
    media_dir: str  # where the archives are extracted, under HF_HOME (lmms-eval's folder)


@dataclass
class SplitConfig:
    name: str
    dir: str  # folder under data_root
    layouts: tuple[Layout, ...]
    hub: HubSource | None = None
    metric: str = "accuracy"  # accuracy | temporal
    subtitles: bool = False
    duration_buckets: list[float] = field(default_factory=list)  # seconds; for splits without a bucket field
    about: str = ""


@dataclass
class Roots:
    """Where a split's annotation was found and where its videos are looked up (first hit wins)."""
    ann: Path
    media: list[Path]
    source: str = "local"  # local | hub

    def find(self, rel: str, alternatives: tuple[str, ...] = ()) -> str:
        rel = str(rel).lstrip("/")
        for name in (rel, *alternatives):
            for m in self.media:
                if (m / name).is_file():
                    return str(m / name)
        return str(self.media[0] / rel)
