"""Row schemas of the released parquets and loaders that skip rows with missing videos.

* SFT rows: ``messages`` (a JSON string or nested lists of ``{role, content}``; content is a
  string or a list of items ``{"type": "text"|"image_url"|"video_url", ...}``) and
  optionally ``videos`` (list of ``{"video": path}``).
* RL rows: ``prompt`` (list of ``{role, content}``; a ``<video>`` placeholder in the text
  marks the video), ``videos`` (list of ``{"video": path}``) and ``extra_info`` (a JSON
  string or a dict with at least ``answer`` and ``question_type`` ∈ {mcq, tvg, oe}).

Loaders report every skipped row with its file, row index and reason, and count them.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import pyarrow.parquet as pq

from paravt.core.scoring import QUESTION_TYPES, parse_gold_span
from paravt.core.video_reader import local_path

log = logging.getLogger(__name__)
VIDEO_PLACEHOLDER = "<video>"


class RowError(ValueError):
    """A row that does not follow the schema; the message names the file and row, ``reason`` is the
    short kind counted in the skip report ("answer is null", "no video", ...)."""

    def __init__(self, message: str, reason: str = "malformed row"):
        super().__init__(message)
        self.reason = reason


class DataError(ValueError):
    """A data file that cannot be used at all (not a parquet, missing columns, no usable rows): one
    line naming the file and what was expected."""


REQUIRED_COLUMNS = {"RLRow": ("prompt", "videos", "extra_info"), "SFTRow": ("messages", "videos")}


@dataclass
class SkipReport:
    total: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        if len(self.examples) < 20:
            self.examples.append(f"{where}: {reason}")

    def summary(self) -> str:
        parts = ", ".join(f"{n} {r}" for r, n in sorted(self.skipped.items()))
        return (f"kept {self.kept}/{self.total} rows" + (f"; skipped {parts}" if parts else "")
                + (f" (first: {self.examples[0]})" if self.examples else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "kept": self.kept, "skipped": dict(self.skipped), "examples": self.examples}


def _maybe_json(value: Any, what: str, where: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise RowError(f"{where}: {what} is not valid JSON ({exc})") from exc
    return value


def _videos(value: Any, where: str) -> list[dict[str, Any]]:
    value = _maybe_json(value, "videos", where)
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise RowError(f"{where}: 'videos' must be a list of {{'video': path}}")
    out = []
    for v in value:
        if isinstance(v, str):
            v = {"video": v}
        if not isinstance(v, dict) or not isinstance(v.get("video"), str):
            raise RowError(f"{where}: bad entry in 'videos': {v!r}")
        out.append(dict(v))
    return out


@dataclass
class RLRow:
    prompt: list[dict[str, Any]]
    videos: list[dict[str, Any]]
    extra_info: dict[str, Any]
    where: str = ""

    @property
    def question(self) -> str:
        """The user text with the ``<video>`` placeholder removed."""
        texts = []
        for m in self.prompt:
            if m.get("role") == "user":
                c = m.get("content")
                texts.append(c if isinstance(c, str) else " ".join(i.get("text", "") for i in c or [] if isinstance(i, dict)))
        return "\n".join(texts).replace(VIDEO_PLACEHOLDER, "").strip()

    @property
    def answer(self) -> Any:
        return self.extra_info["answer"]

    @property
    def question_type(self) -> str:
        return self.extra_info["question_type"]

    @property
    def video(self) -> str:
        return local_path(self.videos[0]["video"])

    @property
    def sample_id(self) -> str:
        return str(self.extra_info.get("id") or self.extra_info.get("index") or self.where)

    @classmethod
    def from_record(cls, rec: dict[str, Any], where: str) -> "RLRow":
        prompt = rec.get("prompt")
        if isinstance(prompt, str) and prompt.lstrip().startswith("["):
            prompt = _maybe_json(prompt, "prompt", where)
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if not isinstance(prompt, (list, tuple)) or not prompt:
            raise RowError(f"{where}: 'prompt' must be a non-empty list of {{role, content}}")
        prompt = [dict(m) for m in prompt]
        for m in prompt:
            if "role" not in m or "content" not in m:
                raise RowError(f"{where}: prompt message without role/content: {m!r}")
        extra = _maybe_json(rec.get("extra_info"), "extra_info", where)
        if not isinstance(extra, dict):
            raise RowError(f"{where}: 'extra_info' must be a dict or a JSON object string")
        if "answer" not in extra:
            raise RowError(f"{where}: extra_info has no 'answer'", "no answer")
        ans = extra["answer"]
        if ans is None or (isinstance(ans, str) and not ans.strip()):
            raise RowError(f"{where}: extra_info.answer is null or empty", "answer is null")
        if isinstance(ans, bool) or not isinstance(ans, (str, int, float, list, tuple)):
            raise RowError(f"{where}: extra_info.answer must be text, a number or a [start, end] span, "
                           f"got {type(ans).__name__}", "answer has a wrong type")
        qt = extra.get("question_type", "oe")
        if qt not in QUESTION_TYPES:
            raise RowError(f"{where}: question_type {qt!r} not in {QUESTION_TYPES}", "unknown question_type")
        if qt == "tvg" and not (isinstance(ans, (list, tuple)) and len(ans) == 2
                                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in ans)):
            if not isinstance(ans, str):
                raise RowError(f"{where}: a tvg answer must be a [start, end] span, got {ans!r}",
                               "answer has a wrong type")
            try:  # a span written as text ("[12.0, 30.5]", "12.0 - 30.5 seconds") must parse as one
                parse_gold_span(_maybe_json(ans, "answer", where) if ans.lstrip().startswith("[") else ans)
            except (ValueError, TypeError, RowError):
                raise RowError(f"{where}: a tvg answer must be a [start, end] span, got {ans[:80]!r}",
                               "tvg answer is not a span") from None
        dur = extra.get("duration")
        if dur is not None and (isinstance(dur, bool) or not isinstance(dur, (int, float)) or not dur > 0):
            raise RowError(f"{where}: extra_info.duration must be a positive number of seconds, got {dur!r}",
                           "duration is not a number")
        extra["question_type"] = qt
        videos = _videos(rec.get("videos"), where)
        if not videos:
            raise RowError(f"{where}: row has no video", "no video")
        return cls(prompt=prompt, videos=videos, extra_info=extra, where=where)

@dataclass
class SFTRow:
    messages: list[dict[str, Any]]
    videos: list[dict[str, Any]]
    where: str = ""

    @classmethod
    def from_record(cls, rec: dict[str, Any], where: str) -> "SFTRow":
        msgs = _maybe_json(rec.get("messages"), "messages", where)
        if not isinstance(msgs, (list, tuple)) or not msgs:
            raise RowError(f"{where}: 'messages' must be a non-empty list")
        msgs = [_clean_message(m, where) for m in msgs]
        if not any(m["role"] == "assistant" for m in msgs):
            raise RowError(f"{where}: no assistant message to supervise")
        return cls(messages=msgs, videos=_videos(rec.get("videos"), where), where=where)

    def media_paths(self) -> list[str]:
        paths = [local_path(v["video"]) for v in self.videos]
        for m in self.messages:
            if isinstance(m["content"], list):
                for item in m["content"]:
                    for key in ("video_url", "image_url"):
                        if item.get("type") == key:
                            paths.append(local_path(_item_url(item, key)))
        return list(dict.fromkeys(paths))


def _item_url(item: dict[str, Any], key: str) -> str:
    v = item.get(key)
    return v.get("url", "") if isinstance(v, dict) else str(v or "")


def _clean_message(m: Any, where: str) -> dict[str, Any]:
    """Drop the null fields that nested parquet structs add to every content item."""
    if not isinstance(m, dict) or "role" not in m:
        raise RowError(f"{where}: message without a role: {m!r}")
    content = m.get("content")
    if isinstance(content, (list, tuple)):
        content = [{k: v for k, v in dict(i).items() if v is not None} for i in content]
    out = {"role": m["role"], "content": content if content is not None else ""}
    if m.get("weight") is not None:  # an assistant turn's loss weight: 0 (context only) or 1 (axolotl's "weight")
        if m["weight"] not in (0, 1) or m["role"] != "assistant":
            raise RowError(f"{where}: weight must be 0 or 1 on an assistant message, got {m['weight']!r} on {m['role']}")
        out["weight"] = int(m["weight"])
    return out


def iter_parquet_records(paths: Iterable[str | Path]) -> Iterator[tuple[dict[str, Any], str]]:
    """(record, "file:row N") for every row of every parquet; a missing file is logged and skipped."""
    for path in paths:
        path = Path(path)
        if not path.is_file():
            log.warning("parquet shard %s is missing: skipped", path)
            continue
        try:
            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a file that is not a parquet
            raise DataError(f"{path}: not a readable parquet file ({type(exc).__name__}: "
                            f"{' '.join(str(exc).split())[:200]})") from None
        for i, rec in enumerate(table.to_pylist()):
            yield rec, f"{path}:row {i}"


def check_columns(path: str | Path, required: Iterable[str]) -> None:
    """The parquet at ``path`` has every ``required`` column (DataError naming the missing ones)."""
    try:
        names = pq.read_schema(path).names
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{path}: not a readable parquet file ({type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:200]})") from None
    missing = [c for c in required if c not in names]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing}; expected {list(required)}, found {names}")


def _load(cls, paths, check_media: bool, report: SkipReport | None, require_rows: bool = True):
    report = report if report is not None else SkipReport()
    rows = []
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    for p in paths:
        if Path(p).is_file():
            check_columns(p, REQUIRED_COLUMNS[cls.__name__])
    for rec, where in iter_parquet_records(paths):
        report.total += 1
        try:
            row = cls.from_record(rec, where)
        except RowError as exc:
            report.skip(exc.reason, str(exc))
            continue
        except (TypeError, AttributeError, KeyError) as exc:  # a column of the wrong type
            report.skip("malformed row", f"{where}: {type(exc).__name__}: {exc}")
            continue
        media = [row.video] if cls is RLRow else row.media_paths()
        missing = [p for p in media if check_media and not Path(p).is_file()]
        if missing:
            report.skip("missing video", f"{where}: {missing[0]}")
            continue
        rows.append(row)
        report.kept += 1
    if report.skipped:
        log.warning("%s", report.summary())
    if not rows and require_rows:
        raise DataError(f"no usable rows in {', '.join(map(str, paths)) or '(no files)'}: {report.summary()}")
    return rows, report


def load_rl_rows(paths, check_media: bool = True, report: SkipReport | None = None) -> tuple[list[RLRow], SkipReport]:
    return _load(RLRow, paths, check_media, report)


def load_sft_rows(paths, check_media: bool = True, report: SkipReport | None = None,
                  require_rows: bool = True) -> tuple[list[SFTRow], SkipReport]:
    return _load(SFTRow, paths, check_media, report, require_rows)
