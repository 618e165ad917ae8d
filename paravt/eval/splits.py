"""Benchmark splits: one small config each plus a handful of shared loaders.

Each split reads the files **as their publishers distribute them** (the layout that
``huggingface-cli download <repo> --repo-type dataset --local-dir <root>/<dir>`` produces,
archives extracted in place) under ``--data_root``:

| split | publisher files (relative to the split dir) | fields used |
|---|---|---|
| videomme / videomme_sub | ``videomme/test-00000-of-00001.parquet``, ``data/<videoID>.mp4``, ``subtitle/<videoID>.srt`` | videoID, question_id, duration (short/medium/long), task_type, question, options ["A. …"], answer (letter) — lmms-lab/Video-MME card |
| longvideobench | ``lvb_val.json``, ``videos/<video_path>``, ``subtitles/<subtitle_path>`` | video_id, question, candidates, correct_choice (index), duration_group, question_category — longvideobench/LongVideoBench |
| lvbench | ``video_info.meta.jsonl`` (one video per line: key, qa[{uid, question with "(A) …" options, answer, question_type}]), ``videos/<key>.mp4`` | — THUDM/LVBench |
| mlvu | ``MLVU/json/*.json`` (video, duration, question, candidates, answer text, question_type), ``MLVU/video/<task dir>/<video>`` | — MLVU dev |
| mmvu | ``validation.json`` (id, question, choices {A: …}, answer, question_type, video URL, metadata.subject), ``videos/<subject>/<n>.mp4`` | — yale-nlp/MMVU |
| charades_sta | ``charades_sta_test.txt`` ("<vid> <start> <end>##<sentence>"), ``Charades_v1_480/<vid>.mp4`` | — Charades-STA test |
| synthetic | ``paravt_eval_synth.parquet`` (the project's RL-row schema, materialized) | — |

A sample whose video file is missing is **kept** and reported as ``missing_video`` (counted,
never silently dropped).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow.parquet as pq

log = logging.getLogger(__name__)

LETTERS = "ABCDEFGHIJ"


@dataclass
class EvalSample:
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

    @property
    def video_exists(self) -> bool:
        return Path(self.video).is_file()


@dataclass
class SplitConfig:
    name: str
    loader: str
    dir: str  # folder under data_root
    annotation: str
    video_dir: str = ""
    metric: str = "accuracy"  # accuracy | temporal
    subtitles: bool = False
    duration_buckets: list[float] = field(default_factory=list)  # seconds; for splits without a bucket field


def _opts(options: list[str]) -> str:
    out = []
    for i, o in enumerate(options):
        o = str(o).strip()
        out.append(o if re.match(r"^[A-J][.)]\s", o) else f"{LETTERS[i]}. {o}")
    return "\n".join(out)


def _mcq_question(q: str, options: list[str]) -> str:
    return f"{q.strip()}\n{_opts(options)}\nAnswer with the option's letter from the given choices directly."


def _bucket(duration: float | None, edges: list[float]) -> str:
    if duration is None or not edges:
        return ""
    names = ["short", "medium", "long", "very_long"]
    for i, e in enumerate(edges):
        if duration < e:
            return names[i]
    return names[min(len(edges), len(names) - 1)]


def load_videomme(c: SplitConfig, root: Path) -> list[EvalSample]:
    rows = pq.read_table(root / c.annotation).to_pylist()
    out = []
    for r in rows:
        vid = r["videoID"]
        out.append(EvalSample(str(r["question_id"]), c.name, str(root / c.video_dir / f"{vid}.mp4"),
                              _mcq_question(r["question"], list(r["options"])), r["answer"].strip(), "mcq",
                              r.get("duration", ""), r.get("task_type", ""),
                              str(root / "subtitle" / f"{vid}.srt") if c.subtitles else None))
    return out


def load_longvideobench(c: SplitConfig, root: Path) -> list[EvalSample]:
    rows = json.loads((root / c.annotation).read_text())
    out = []
    for i, r in enumerate(rows):
        ans = r["correct_choice"]
        out.append(EvalSample(str(r.get("id", f"{r['video_id']}_{i}")), c.name, str(root / c.video_dir / r["video_path"]),
                              _mcq_question(r["question"], r["candidates"]),
                              LETTERS[ans] if isinstance(ans, int) else str(ans), "mcq",
                              str(r.get("duration_group", "")), r.get("question_category", ""),
                              duration=r.get("duration")))
    return out


def load_lvbench(c: SplitConfig, root: Path) -> list[EvalSample]:
    out = []
    for line in (root / c.annotation).read_text().splitlines():
        if not line.strip():
            continue
        v = json.loads(line)
        dur = (v.get("video_info") or {}).get("duration_minutes")
        dur = float(dur) * 60 if dur is not None else None
        for q in v["qa"]:
            qt = q.get("question_type")
            out.append(EvalSample(str(q["uid"]), c.name, str(root / c.video_dir / f"{v['key']}.mp4"),
                                  q["question"].strip() + "\nAnswer with the option's letter from the given choices directly.",
                                  q["answer"].strip(), "mcq", _bucket(dur, c.duration_buckets),
                                  ",".join(qt) if isinstance(qt, list) else str(qt or ""), duration=dur))
    return out


def load_mlvu(c: SplitConfig, root: Path) -> list[EvalSample]:
    """The multiple-choice tasks of MLVU dev; rows without ``candidates`` (the generation tasks,
    e.g. sub-scene captioning and summarisation) are skipped and counted."""
    out = []
    skipped: dict[str, int] = {}
    for f in sorted((root / c.annotation).glob("*.json")):
        task_dir = f.stem
        for i, r in enumerate(json.loads(f.read_text())):
            cands = r.get("candidates")
            if not isinstance(cands, list) or not cands:
                skipped[f.name] = skipped.get(f.name, 0) + 1
                continue
            ans = LETTERS[cands.index(r["answer"])] if r["answer"] in cands else str(r["answer"])
            dur = r.get("duration")
            out.append(EvalSample(f"{task_dir}_{i}", c.name, str(root / c.video_dir / task_dir / r["video"]),
                                  _mcq_question(r["question"], cands), ans, "mcq", _bucket(dur, c.duration_buckets),
                                  r.get("question_type", task_dir), duration=dur))
    if skipped:
        log.warning("mlvu: skipped %d rows without candidates (not multiple choice): %s",
                    sum(skipped.values()), ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())))
    return out


def load_mmvu(c: SplitConfig, root: Path) -> list[EvalSample]:
    out = []
    for r in json.loads((root / c.annotation).read_text()):
        url = str(r["video"])
        rel = url.split("/resolve/main/", 1)[1] if "/resolve/main/" in url else url.split("videos/", 1)[-1]
        rel = rel if rel.startswith("videos/") else f"videos/{rel}"
        if r.get("question_type") == "multiple-choice":
            choices = r["choices"]
            q = _mcq_question(r["question"], [f"{k}. {v}" for k, v in sorted(choices.items())])
            qt = "mcq"
        else:
            q, qt = r["question"], "oe"
        out.append(EvalSample(str(r["id"]), c.name, str(root / rel), q, r["answer"], qt, "",
                              (r.get("metadata") or {}).get("subject", "")))
    return out


def load_charades(c: SplitConfig, root: Path) -> list[EvalSample]:
    out = []
    for i, line in enumerate((root / c.annotation).read_text().splitlines()):
        if "##" not in line:
            continue
        head, sentence = line.split("##", 1)
        vid, s, e = head.split()
        q = (f"Find the moment in the video that matches: \"{sentence.strip().rstrip('.')}\". "
             "Answer with the start and end time in seconds as [start, end].")
        out.append(EvalSample(f"{vid}_{i}", c.name, str(root / c.video_dir / f"{vid}.mp4"), q, [float(s), float(e)],
                              "tvg", "", "grounding"))
    return out


def load_synthetic(c: SplitConfig, root: Path) -> list[EvalSample]:
    from paravt.data.schema import load_rl_rows  # noqa: PLC0415

    rows, _ = load_rl_rows([root / c.annotation], check_media=False)
    out = []
    for r in rows:
        d = r.extra_info.get("duration")
        ans = r.answer
        if r.question_type == "tvg":
            ans = json.loads(ans) if isinstance(ans, str) else ans
        out.append(EvalSample(r.sample_id, c.name, r.video, r.question, ans, r.question_type,
                              _bucket(d, c.duration_buckets), r.question_type, duration=d,
                              span=r.extra_info.get("span")))
    return out


LOADERS: dict[str, Callable[[SplitConfig, Path], list[EvalSample]]] = {
    "videomme": load_videomme, "longvideobench": load_longvideobench, "lvbench": load_lvbench, "mlvu": load_mlvu,
    "mmvu": load_mmvu, "charades": load_charades, "synthetic": load_synthetic,
}

SPLITS: dict[str, SplitConfig] = {s.name: s for s in [
    SplitConfig("videomme", "videomme", "Video-MME", "videomme/test-00000-of-00001.parquet", "data"),
    SplitConfig("videomme_sub", "videomme", "Video-MME", "videomme/test-00000-of-00001.parquet", "data", subtitles=True),
    SplitConfig("longvideobench", "longvideobench", "LongVideoBench", "lvb_val.json", "videos"),
    SplitConfig("lvbench", "lvbench", "LVBench", "video_info.meta.jsonl", "videos", duration_buckets=[1800, 3600]),
    SplitConfig("mlvu", "mlvu", "MLVU", "MLVU/json", "MLVU/video", duration_buckets=[180, 600]),
    SplitConfig("mmvu", "mmvu", "MMVU", "validation.json", ""),
    SplitConfig("charades_sta", "charades", "Charades-STA", "charades_sta_test.txt", "Charades_v1_480", metric="temporal"),
    SplitConfig("synthetic", "synthetic", "synthetic", "paravt_eval_synth.parquet", "", duration_buckets=[60, 90]),
]}
#: Public sample counts of the paper's splits (the driver warns when a load differs): Video-MME
#: 900 videos x 3 questions, LongVideoBench validation, LVBench, MLVU dev multiple choice
#: (approximate: the release reads the sy1998/MLVU_dev copy), MMVU validation, Charades-STA test.
EXPECTED_COUNTS: dict[str, tuple[int, float]] = {  # split -> (count, relative tolerance)
    "videomme": (2700, 0.0), "videomme_sub": (2700, 0.0), "longvideobench": (1337, 0.0), "lvbench": (1549, 0.0),
    "mlvu": (2200, 0.05), "mmvu": (1000, 0.0), "charades_sta": (3720, 0.0),
}


def count_check(split: str, loaded: int) -> str | None:
    """A warning text when ``loaded`` differs from the split's public count, else None."""
    if split not in EXPECTED_COUNTS:
        return None
    n, tol = EXPECTED_COUNTS[split]
    if abs(loaded - n) <= tol * n:
        return None
    return (f"{split}: loaded {loaded} samples, expected {'~' if tol else ''}{n} (public count); "
            "check the download (missing annotation files, a different version of the split)")


PAPER_SPLITS = ["videomme", "videomme_sub", "longvideobench", "lvbench", "mlvu", "mmvu", "charades_sta"]


def load_split(name: str, data_root: str | Path, path_override: str | None = None) -> list[EvalSample]:
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; known: {sorted(SPLITS)}")
    c = SPLITS[name]
    root = Path(path_override) if path_override else Path(data_root) / c.dir
    ann = root / c.annotation
    if not ann.exists():
        raise FileNotFoundError(f"split {name}: annotation file {ann} not found (download the dataset under "
                                f"{root} or pass split_paths.{name}=DIR)")
    return LOADERS[c.loader](c, root)


def read_srt(path: str | Path, max_chars: int | None = None) -> str:
    """The whole subtitle text of an .srt file, one cue line per line (indices, timestamps and
    markup dropped), as the authors pass it for Video-MME with subtitles (the split that carries
    the headline 69.4). ``max_chars`` cuts it (off by default)."""
    p = Path(path)
    if not p.is_file():
        return ""
    lines = []
    for block in re.split(r"\n\s*\n", p.read_text(encoding="utf-8", errors="replace").strip()):
        for ln in block.strip().splitlines()[2:]:  # [index, "a --> b", text...]
            ln = re.sub(r"<[^>]+>", "", ln).strip()
            if ln:
                lines.append(ln)
    text = "\n".join(lines)
    return text[:max_chars] if max_chars else text
