"""What an eval split's records add up to: per-sample scoring fields, the split summary (lost samples
count as wrong in the headline numbers), the markdown table over rows and channels, and the lost-work
check that decides the exit code."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from paravt.core.scoring import extract_mcq_letter, recall_at
from paravt.core.scoring import score as score_completion

if TYPE_CHECKING:
    from paravt.eval.sample import BenchmarkItem

def bootstrap_stderr(values: list[float], seed: int = 0, n_boot: int = 1000) -> float:
    """Standard error of the mean by a seeded bootstrap (as lmms-eval reports per metric)."""
    import numpy as np  # noqa: PLC0415

    if len(values) < 2:
        return 0.0
    x = np.asarray(values, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(n_boot, len(x)))
    return float(x[idx].mean(axis=1).std(ddof=1))


def answer_readable(rec: dict[str, Any], qtype: str) -> bool:
    """The scored record holds an answer of the question's kind (mcq: a letter; tvg: a span; oe: text)."""
    if qtype == "mcq":
        return extract_mcq_letter(rec.get("pred") or "") is not None
    if qtype == "tvg":
        return rec.get("pred_span") is not None
    return bool(str(rec.get("pred") or "").strip())


def score(sample: BenchmarkItem, completion: str) -> dict[str, Any]:
    """The record fields of :func:`paravt.core.scoring.score` (``score``: correct for mcq/oe, IoU for tvg)."""
    sc = score_completion(completion, sample.answer, sample.question_type, "f1")
    if sample.question_type == "tvg":
        return {"pred": sc.pred, "pred_span": sc.span, "iou": sc.value, "score": sc.value}
    return {"pred": sc.pred, "correct": sc.value, "score": sc.value}


def summarize(records: list[dict[str, Any]], metric: str = "accuracy") -> dict[str, Any]:
    """A split's summary. Samples that did not run (video missing, engine/server/tool failure) are
    **lost**: the headline numbers (``accuracy``, ``mIoU``, ``score``) count them as wrong, over every
    sample, as the paper's tables do; ``*_ran`` are the same numbers over the samples that ran."""
    done = [r for r in records if not r.get("missing_video") and not r.get("error")]
    n = len(done)
    out: dict[str, Any] = {"n": len(records), "evaluated": n,
                           "missing_video": sum(bool(r.get("missing_video")) for r in records),
                           "errors": sum(bool(r.get("error")) for r in records)}
    out["lost"] = len(records) - n
    lost = [r for r in records if r.get("missing_video") or r.get("error")]
    if lost:
        r0 = lost[0]
        out["first_error"] = (str(r0["error"]) if r0.get("error") else f"video not found: {r0['missing_video']}")[:500]
    cls = [r for r in done if r["question_type"] != "tvg"]
    tvg = [r for r in done if r["question_type"] == "tvg"]
    n_cls_all = sum(r["question_type"] != "tvg" for r in records)
    n_tvg_all = sum(r["question_type"] == "tvg" for r in records)
    if cls:
        out["accuracy_ran"] = sum(r["correct"] for r in cls) / len(cls)
        out["accuracy"] = sum(r["correct"] for r in cls) / n_cls_all
        judged = [r for r in cls if "judge_correct" in r or "judge_error" in r]
        if judged:  # the judge fallback, beside the strict score (paravt.eval.judge)
            out["judge"] = {"consulted": len(judged), "chose_letter": sum(bool(r.get("judge_pred")) for r in judged),
                            "chose_none": sum(r.get("judge_pred") == "" for r in judged),
                            "errors": sum("judge_error" in r for r in judged)}
            out["accuracy_with_judge"] = sum(r["correct"] or r.get("judge_correct", 0.0) for r in cls) / n_cls_all
    elif n_cls_all:
        out["accuracy"] = 0.0
    if tvg:
        ious = [r["iou"] for r in tvg]
        out["mIoU_ran"] = sum(ious) / len(ious)
        out["mIoU"] = sum(ious) / n_tvg_all
        out.update(recall_at(ious + [0.0] * (n_tvg_all - len(ious))))
    elif n_tvg_all:
        out["mIoU"] = 0.0
    out["score_ran"] = sum(r["score"] for r in done) / n if n else 0.0
    out["score"] = sum(r["score"] for r in done) / len(records) if records else 0.0
    out["avg_tool_calls"] = sum(r["tool_calls"] for r in done) / n if n else 0.0
    out["tool_usage_rate"] = sum(r["tool_calls"] > 0 for r in done) / n if n else 0.0
    out["format_compliance"] = sum(r.get("well_formed", False) for r in done) / n if n else 0.0
    # the policy's choice and what it earned: score of the episodes that called a tool vs those that
    # answered without one (over a sampled eval: P(call) and the payoff of calling)
    called = [r["score"] for r in done if r["tool_calls"] > 0]
    skipped = [r["score"] for r in done if r["tool_calls"] == 0]
    out["calling"] = {"n": len(called), "score": sum(called) / len(called) if called else None}
    out["skipping"] = {"n": len(skipped), "score": sum(skipped) / len(skipped) if skipped else None}
    draws = {str(r.get("id")).rpartition("#s")[0] for r in records if "#s" in str(r.get("id"))}
    if draws:
        out["questions"] = len(draws)
    per_sample = {"score": [r["score"] for r in done], "accuracy": [float(r["correct"]) for r in cls],
                  "mIoU": [r["iou"] for r in tvg], "tool_usage_rate": [float(r["tool_calls"] > 0) for r in done],
                  "format_compliance": [float(r.get("well_formed", False)) for r in done]}
    out["stderr"] = {k: bootstrap_stderr(v) for k, v in per_sample.items() if k in out and v}
    for key in ("question_type", "duration_bucket", "task"):
        groups = defaultdict(list)
        for r in done:
            if r.get(key):
                groups[r[key]].append(r)
        if len(groups) > 1 or (groups and key != "question_type"):
            out[f"by_{key}"] = {g: {"n": len(v), "score": sum(x["score"] for x in v) / len(v)}
                                for g, v in sorted(groups.items())}
    return out


def headline(summary: dict[str, Any]) -> float | None:
    if "accuracy" in summary and "mIoU" in summary:  # mixed split (synthetic): mean score
        return summary["score"]
    for k in ("accuracy", "mIoU"):
        if k in summary:
            return summary[k]
    return None


def markdown_table(merged: dict[str, Any]) -> str:
    splits = sorted({s for row in merged.values() for ch in row.values() for s in ch})
    lines = ["| row | channel | " + " | ".join(splits) + " |", "|---|---|" + "---|" * len(splits)]
    for row, chans in merged.items():
        for ch, res in chans.items():
            cells = []
            for s in splits:
                v = headline(res.get(s, {})) if s in res else None
                extra = res.get(s, {})
                tools = extra.get("avg_tool_calls")
                cells.append("" if v is None else f"{100 * v:.1f}" + (f" ({tools:.1f} calls)" if tools else ""))
            lines.append(f"| {row} | {ch} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def lost_work(results: dict[str, dict[str, Any]], max_error_fraction: float = 0.0) -> list[str]:
    """One line per split that lost work: it did not run, it had no samples, or more of its samples
    were lost (video missing; engine, server, video or tool failure) than ``max_error_fraction`` allows."""
    out = []
    for split, r in results.items():
        if "n" not in r:
            out.append(f"{split}: did not run: {r.get('error', 'unknown error')}")
        elif r["n"] == 0:
            out.append(f"{split}: no samples to evaluate")
        elif r.get("lost", r.get("errors", 0)) > max_error_fraction * r["n"]:
            out.append(f"{split}: {r.get('lost', r.get('errors', 0))} of {r['n']} samples lost "
                       f"({r.get('missing_video', 0)} without their video, {r.get('errors', 0)} failed; "
                       f"max_error_fraction={max_error_fraction:g}); first: {r.get('first_error')}")
    return out
