"""One loader per benchmark layout: the annotation rows a publisher (or the Hub copy) ships, read into
:class:`~paravt.eval.sample.BenchmarkItem` objects with options lettered A, B, C, ... and the gold as a
letter, a span or a text. Which loader reads which file is the split registry's business
(:data:`paravt.eval.splits.SPLITS`, ``Layout.loader``)."""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pyarrow.parquet as pq

from paravt.eval.sample import LETTER_PREFIX, LETTERS, MCQ_SUFFIX, BenchmarkItem, Roots, SplitConfig

log = logging.getLogger(__name__)

def _clean_options(options: list[Any]) -> list[str]:
    """Option texts with their own letter prefix removed ("A. 1." -> "1.", "(B) blue" -> "blue"),
    only when the prefix is the option's own letter (so a doubled or shuffled letter stays visible)."""
    out = []
    for i, o in enumerate(options):
        o = str(o).strip()
        m = LETTER_PREFIX.match(o)
        if m and i < len(LETTERS) and m.group(1) == LETTERS[i]:
            o = o[m.end():].strip()
        out.append(o)
    return out


def _mcq_question(q: str, options: list[str]) -> str:
    body = "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))
    return f"{q.strip()}\n{body}\n{MCQ_SUFFIX}"


def _inline_options(question: str) -> list[str]:
    """The option lines of a question that carries its options inline: "(A) red" (LVBench) or
    "A. red" (the synthetic world)."""
    out = [ln.strip() for ln in question.splitlines()[1:] if re.match(r"^(\([A-J]\)|[A-J][.)])\s", ln.strip())]
    return _clean_options(out)


def _bucket(duration: float | None, edges: list[float]) -> str:
    if duration is None or not edges:
        return ""
    names = ["short", "medium", "long", "very_long"]
    for i, e in enumerate(edges):
        if duration < e:
            return names[i]
    return names[min(len(edges), len(names) - 1)]


def _rows(path: Path | list[Path]) -> list[dict[str, Any]]:
    """Rows of a parquet file, a JSON list or a JSON-lines file; of every shard, in order, for a list."""
    if isinstance(path, list):
        return [r for p in path for r in _rows(p)]
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    if path.suffix == ".jsonl":
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    return json.loads(path.read_text())


def _letter_of(answer: Any, options: list[str]) -> str:
    """The gold letter: a letter as given, an index, or the text of one option."""
    if isinstance(answer, bool):
        return str(answer)
    if isinstance(answer, int):
        return LETTERS[answer] if 0 <= answer < len(LETTERS) else str(answer)
    a = str(answer).strip()
    if a in options:
        return LETTERS[options.index(a)]
    m = LETTER_PREFIX.match(a + " ")
    return m.group(1) if m and len(a.strip("().: ")) == 1 else a


# ---------------------------------------------------------------------------------- loaders
def load_videomme(c: SplitConfig, roots: Roots, ann: Path) -> list[BenchmarkItem]:
    out = []
    for r in _rows(ann):
        vid = r["videoID"]
        opts = _clean_options(list(r["options"]))
        out.append(BenchmarkItem(str(r["question_id"]), c.name,
                              roots.find(f"data/{vid}.mp4", (f"data/{vid}.MP4", f"data/{vid}.mkv")),
                              _mcq_question(r["question"], opts), str(r["answer"]).strip(), "mcq",
                              r.get("duration", ""), r.get("task_type", ""),
                              roots.find(f"subtitle/{vid}.srt") if c.subtitles else None, options=opts))
    return out


def _lvb_sample(c: SplitConfig, roots: Roots, r: dict[str, Any], i: int, options: list[Any]) -> BenchmarkItem:
    opts = _clean_options(options)
    return BenchmarkItem(str(r.get("id", f"{r['video_id']}_{i}")), c.name, roots.find(f"videos/{r['video_path']}"),
                      _mcq_question(r["question"], opts), _letter_of(r["correct_choice"], opts), "mcq",
                      str(r.get("duration_group", "")), r.get("question_category", ""),
                      duration=r.get("duration"), options=opts)


def load_longvideobench(c: SplitConfig, roots: Roots, ann: Path) -> list[BenchmarkItem]:
    """lvb_val.json (``candidates``) or the Hub's validation parquet (``option0..option4``, "N/A" unused)."""
    out = []
    for i, r in enumerate(_rows(ann)):
        cands = r.get("candidates")
        if cands is None:
            cands = [r[f"option{k}"] for k in range(5) if r.get(f"option{k}") not in (None, "", "N/A")]
        out.append(_lvb_sample(c, roots, r, i, list(cands)))
    return out


def _lvbench_sample(c: SplitConfig, roots: Roots, qa: dict[str, Any], video_rel: str, dur: float | None) -> BenchmarkItem:
    qt = qa.get("question_type")
    return BenchmarkItem(str(qa["uid"]), c.name, roots.find(video_rel), qa["question"].strip() + "\n" + MCQ_SUFFIX,
                      str(qa["answer"]).strip(), "mcq", _bucket(dur, c.duration_buckets),
                      ",".join(qt) if isinstance(qt, (list, tuple)) else str(qt or ""), duration=dur,
                      options=_inline_options(qa["question"]))


def _minutes(info: Any) -> float | None:
    d = (info or {}).get("duration_minutes") if isinstance(info, dict) else None
    return float(d) * 60 if d is not None else None


def load_lvbench(c: SplitConfig, roots: Roots, ann: Path) -> list[BenchmarkItem]:
    """THUDM/LVBench: one video per line (key, video_info, qa[{uid, question with "(A) …" lines, answer}])."""
    out = []
    for v in _rows(ann):
        dur = _minutes(v.get("video_info"))
        out += [_lvbench_sample(c, roots, q, f"videos/{v['key']}.mp4", dur) for q in v["qa"]]
    return out


def load_lvbench_hub(c: SplitConfig, roots: Roots, ann: Path) -> list[BenchmarkItem]:
    """lmms-lab/LVBench: one question per row (uid, question, answer, question_type, video_path, video_info)."""
    return [_lvbench_sample(c, roots, r, r["video_path"], _minutes(r.get("video_info"))) for r in _rows(ann)]


def _stem_without_options(question: str, options: list[str]) -> str:
    """The question's stem: option lines it already carries ("(A) red" / "A. red" after the first
    line) are removed when they are these ``options``, so the prompt lists each option once."""
    lines = question.strip().splitlines()
    inline = [i for i, ln in enumerate(lines) if i and re.match(r"^(\([A-J]\)|[A-J][.)])\s", ln.strip())]
    if inline and _clean_options([lines[i].strip() for i in inline]) == options:
        return "\n".join(ln for i, ln in enumerate(lines) if i not in inline).strip()
    return question


def _mlvu_sample(c: SplitConfig, roots: Roots, r: dict[str, Any], sid: str, video_rel: str, task: str) -> BenchmarkItem:
    """An MLVU row either way it is written: ``question`` a bare stem or already ending with the
    ``(A) …`` option lines; ``answer`` the option's text or its letter."""
    opts = _clean_options(list(r["candidates"]))
    dur = r.get("duration")
    return BenchmarkItem(sid, c.name, roots.find(video_rel), _mcq_question(_stem_without_options(r["question"], opts), opts),
                      _letter_of(r["answer"], opts), "mcq", _bucket(dur, c.duration_buckets), task,
                      duration=dur, options=opts)


def _skip_generation_rows(rows: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """MLVU's generation tasks (sub-scene captioning, summarisation) have no candidates: skipped, counted."""
    keep = [(k, r) for k, r in rows if isinstance(r.get("candidates"), (list, tuple)) and len(r["candidates"])]
    skipped = Counter(k for k, r in rows if not (isinstance(r.get("candidates"), (list, tuple)) and len(r["candidates"])))
    if skipped:
        log.warning("mlvu: skipped %d rows without candidates (not multiple choice): %s",
                    sum(skipped.values()), ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())))
    return keep


def load_mlvu(c: SplitConfig, roots: Roots, ann: Path) -> list[BenchmarkItem]:
    """MLVU/MVLU (the publisher): MLVU/json/<n>_<task>.json, MLVU/video/<n>_<task>/<video>."""
    rows = [(f.stem, r) for f in sorted(ann.glob("*.json")) for r in json.loads(f.read_text())]
    index = Counter()
    out = []
    for task_dir, r in _skip_generation_rows(rows):
        i = index[task_dir]
        index[task_dir] += 1
        out.append(_mlvu_sample(c, roots, r, f"{task_dir}_{i}", f"MLVU/video/{task_dir}/{r['video']}",
                                r.get("question_type", task_dir)))
    return out


def load_mlvu_hub(c: SplitConfig, roots: Roots, ann: Path) -> list[BenchmarkItem]:
    """sy1998/MLVU_dev: one question per row (video_name, duration, question, candidates, answer text,
    task_type, question_id); its zips extract to <video_name>."""
    out = []
    for i, (task, r) in enumerate(_skip_generation_rows([(str(r.get("task_type", "")), r) for r in _rows(ann)])):
        sid = str(r.get("question_id") or f"{task or 'mlvu'}-{i}")
        out.append(_mlvu_sample(c, roots, r, sid, r["video_name"], task))
    return out


def load_mmvu(c: SplitConfig, roots: Roots, ann: Path) -> list[BenchmarkItem]:
    out = []
    for r in _rows(ann):
        url = str(r["video"])
        rel = url.split("/resolve/main/", 1)[1] if "/resolve/main/" in url else url.split("videos/", 1)[-1]
        rel = rel if rel.startswith("videos/") else f"videos/{rel}"
        opts: list[str] = []
        if r.get("question_type") == "multiple-choice":
            choices = {k: v for k, v in (r.get("choices") or {}).items() if v not in (None, "")}
            keys = sorted(choices)
            opts = [str(choices[k]).strip() for k in keys]
            q, qt, ans = _mcq_question(r["question"], opts), "mcq", str(r["answer"]).strip()
            if keys != list(LETTERS[:len(keys)]):  # choices keyed other than A, B, C...: the check reports it
                opts = [f"{k}. {v}" for k, v in zip(keys, opts)]
        else:
            q, qt, ans = r["question"], "oe", r["answer"]
        out.append(BenchmarkItem(str(r["id"]), c.name, roots.find(rel), q, ans, qt, "",
                              (r.get("metadata") or {}).get("subject", "") or r.get("subject", ""), options=opts))
    return out


def _charades_question(sentence: str) -> str:
    return (f"Find the moment in the video that matches: \"{sentence.strip().rstrip('.')}\". "
            "Answer with the start and end time in seconds as [start, end].")


def load_charades(c: SplitConfig, roots: Roots, ann: Path) -> list[BenchmarkItem]:
    """The original Charades-STA test file: "<vid> <start> <end>##<sentence>" per line."""
    out = []
    for i, line in enumerate(ann.read_text().splitlines()):
        if "##" not in line:
            continue
        head, sentence = line.split("##", 1)
        vid, s, e = head.split()
        out.append(BenchmarkItem(f"{vid}_{i}", c.name, roots.find(f"Charades_v1_480/{vid}.mp4"), _charades_question(sentence),
                              [float(s), float(e)], "tvg", "", "grounding"))
    return out


def load_charades_hub(c: SplitConfig, roots: Roots, ann: Path) -> list[BenchmarkItem]:
    """lmms-lab/charades_sta: video ("<vid>.mp4"), caption, timestamp (two float16). float16 holds
    24.3 as 24.296875: the original annotations have one decimal, so the span is rounded to it."""
    out = []
    for i, r in enumerate(_rows(ann)):
        span = [round(float(t), 1) for t in r["timestamp"]]
        out.append(BenchmarkItem(f"{Path(r['video']).stem}_{i}", c.name, roots.find(f"Charades_v1_480/{r['video']}"),
                              _charades_question(r["caption"]), span, "tvg", "", "grounding"))
    return out


def load_synthetic(c: SplitConfig, roots: Roots, ann: Path) -> list[BenchmarkItem]:
    from paravt.data.schema import load_rl_rows  # noqa: PLC0415

    rows, _ = load_rl_rows([ann], check_media=False)
    out = []
    for r in rows:
        d = r.extra_info.get("duration")
        ans = r.answer
        if r.question_type == "tvg" and isinstance(ans, str):
            try:
                ans = json.loads(ans)
            except ValueError:
                pass  # not a span: check_sample drops the row and counts it
        out.append(BenchmarkItem(r.sample_id, c.name, r.video, r.question, ans, r.question_type,
                              _bucket(d, c.duration_buckets), r.question_type, duration=d,
                              span=r.extra_info.get("span"),
                              options=_inline_options(r.question) if r.question_type == "mcq" else []))
    return out


LOADERS: dict[str, Callable[[SplitConfig, Roots, Path], list[BenchmarkItem]]] = {
    "videomme": load_videomme, "longvideobench": load_longvideobench, "lvbench": load_lvbench,
    "lvbench_hub": load_lvbench_hub, "mlvu": load_mlvu, "mlvu_hub": load_mlvu_hub, "mmvu": load_mmvu,
    "charades": load_charades, "charades_hub": load_charades_hub, "synthetic": load_synthetic,
}
