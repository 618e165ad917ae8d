"""The quickstart report: one Markdown file + PNG curves from the stages' own outputs.

    python -m paravt.analysis.report OUT_DIR
    python -m paravt.analysis.report --gtr OUT_DIR     (the GTR ablation of experiments/ablate_gtr.sh)

Reads ``OUT/eval/summary_all.json`` (eval driver), ``OUT/rl_vanilla/metrics.jsonl`` and
``OUT/rl_paragrpo/metrics.jsonl`` (RL), ``OUT/sft/metrics.jsonl`` (SFT), ``OUT/probe_*.json``
(:mod:`paravt.analysis.probe`: what the sub-agents see), ``OUT/stage_seconds.tsv`` and ``OUT/machine_speed.json``
(:mod:`paravt.core.machine_speed`, for the header); writes
``OUT/report.md`` and ``OUT/report_curves.png``; prints the results table.

The paper's effects are differences between cells evaluated on the SAME held-out questions, so
the report also gives each planned comparison as a paired difference with a 95% bootstrap
interval over questions (``paired_delta``): with 30 questions one question moves a score by 3.3
points, and a difference whose interval contains 0 is reported as not shown.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

from paravt.core.machine_speed import describe as describe_speed
from paravt.core.metrics import read_jsonl
from paravt.core.seeding import rng

ROWS = [("sft-notool", "SFT, no tools"), ("sft-tool", "SFT, with tools"), ("vanilla-tool", "vanilla GRPO"),
        ("paragrpo-tool", "PARA-GRPO")]
# (what the paper says, row B, K of B, row A, K of A): the effect is B - A on the same questions.
COMPARISONS = [("tools help at small K (SFT)", "sft-tool", 4, "sft-notool", 4),
               ("4 frames with tools vs 64 without (SFT)", "sft-tool", 4, "sft-notool", 64),
               ("4 frames with tools (PARA-GRPO) vs 64 without (SFT)", "paragrpo-tool", 4, "sft-notool", 64),
               ("PARA-GRPO vs vanilla GRPO", "paragrpo-tool", 4, "vanilla-tool", 4),
               ("PARA-GRPO vs vanilla GRPO", "paragrpo-tool", 64, "vanilla-tool", 64),
               ("RL vs SFT (PARA-GRPO)", "paragrpo-tool", 4, "sft-tool", 4)]
#: An effect on score is stated only when both arms follow their format this often: a comparison with an
#: arm that cannot answer (it opens a tool call it may not make) measures format, not evidence.
MIN_COMPLIANCE = 0.9
CURVES = ["format/compliance", "tools/call_frequency", "reward/acc", "reward/total"]


def _cell(summary: dict, key: str, pct: bool = True) -> str:
    v = summary.get(key)
    if v is None:
        return ""
    return f"{100 * v:.1f}" if pct else f"{v:.2f}"


def _by_type(summary: dict, qtype: str) -> str:
    v = summary.get("by_question_type", {}).get(qtype, {}).get("score")
    return "" if v is None else f"{100 * v:.1f}"


def results_table(summary_all: dict) -> str:
    lines = ["| model | K | score | mcq acc | oe acc | tvg IoU | format compliance | tool-call freq. | calls / episode |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, label in ROWS:
        for k in (4, 64):
            s = summary_all.get(f"{key}-K{k}", {}).get("image_url", {}).get("synthetic")
            if not s:
                continue
            lines.append(f"| {label} | {k} | {_cell(s, 'score')} | {_by_type(s, 'mcq')} | {_by_type(s, 'oe')} | "
                         f"{_by_type(s, 'tvg')} | {_cell(s, 'format_compliance')} | "
                         f"{_cell(s, 'tool_usage_rate')} | {_cell(s, 'avg_tool_calls', pct=False)} |")
    return "\n".join(lines) + "\n"


def paired_delta(a: dict[str, float], b: dict[str, float], n_boot: int = 10000, seed: int = 0) -> dict:
    """Mean of ``b[q] - a[q]`` over the questions both cells answered, with a 95% percentile
    bootstrap interval (questions resampled with replacement; the draw is seeded by ``seed``)
    and the counts of questions where B scored higher / lower than A."""
    ids = sorted(set(a) & set(b))
    if not ids:
        return {"n": 0}
    import numpy as np  # noqa: PLC0415

    d = np.array([float(b[q]) - float(a[q]) for q in ids])
    boots = d[rng("paired_delta", seed).integers(0, len(d), size=(n_boot, len(d)))].mean(1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"n": len(ids), "delta": float(d.mean()), "lo": float(lo), "hi": float(hi),
            "b_better": int((d > 0).sum()), "a_better": int((d < 0).sum())}


def per_question(out: Path, row: str, key: str = "score") -> dict[str, float]:
    """``{question id: key}`` from the eval driver's per-question file of one row (``well_formed`` as 0/1)."""
    p = out / "eval" / row / "image_url" / "synthetic.jsonl"
    return {r["id"]: float(r.get(key) or 0.0) for r in read_jsonl(p)} if p.exists() else {}


def constant_answers(out: Path, share: float = 0.8, min_n: int = 10) -> list[str]:
    """Rows whose mcq / oe answers are (nearly) one constant: the most common prediction given to at least
    ``share`` of ``min_n``+ questions of a type. Accuracy there is how often the gold happens to be that
    answer, and a difference against another row can be format, not evidence use (measured: a model that
    answered "B" and "yellow" to everything showed "tools help" +15 points because without tools it
    never answered)."""
    notes = []
    for p in sorted((out / "eval").glob("*/image_url/synthetic.jsonl")):
        rows = read_jsonl(p)
        for qtype in ("mcq", "oe"):
            preds = [str(r.get("pred")) for r in rows if r.get("question_type") == qtype and r.get("pred") is not None]
            if len(preds) < min_n:
                continue
            top = max(set(preds), key=preds.count)
            if preds.count(top) >= share * len(preds):
                notes.append(f"{p.parent.parent.name} answers {top[:40]!r} to {preds.count(top)} of {len(preds)} {qtype} questions")
    return notes


def comparison(c) -> tuple[str, str, int, str, int]:
    return c if len(c) == 5 else (c[0], c[1], c[3], c[2], c[3])  # (name, B, A, K): one K for both


def effects_table(out: Path, seed: int = 0, comparisons=None) -> str:
    """Paired B − A differences per comparison (default: the quickstart's), with each arm's format
    compliance; a score effect is stated only when both arms are at least MIN_COMPLIANCE compliant."""
    lines = []
    for c in comparisons or COMPARISONS:
        name, b, kb, a, ka = comparison(c)
        ca = per_question(out, f"{a}-K{ka}", "well_formed")
        cb = per_question(out, f"{b}-K{kb}", "well_formed")
        comp = [sum(x.values()) / len(x) if x else 0.0 for x in (ca, cb)]
        for key, label in (("score", "score"), ("well_formed", "format compliance")):
            r = paired_delta(per_question(out, f"{a}-K{ka}", key), per_question(out, f"{b}-K{kb}", key), seed=seed)
            if not r["n"]:
                continue
            shown = "yes" if r["lo"] > 0 else ("reversed" if r["hi"] < 0 else "no (interval contains 0)")
            if key == "score" and min(comp) < MIN_COMPLIANCE:
                shown = f"not stated: an arm is {100 * min(comp):.0f}% compliant (< {100 * MIN_COMPLIANCE:.0f}%)"
            k = str(ka) if ka == kb else f"{kb} vs {ka}"
            lines.append(f"| {name} | {k} | {label} | {100 * comp[1]:.0f} / {100 * comp[0]:.0f} | {100 * r['delta']:+.1f} | "
                         f"[{100 * r['lo']:+.1f}, {100 * r['hi']:+.1f}] | {r['b_better']} / {r['a_better']} of {r['n']} | {shown} |")
    return md_table(["effect (B − A)", "K", "metric", "compliance B / A (%)", "Δ (points)", "95% bootstrap interval",
                     "questions B better / A better", "shown"], lines)


def md_table(header: list[str], lines: list[str]) -> str:
    """A Markdown table (header + separator + ``lines``); "" without lines."""
    if not lines:
        return ""
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *lines]) + "\n"


def _gain(c: dict | None) -> str:
    return "" if not c else f"{100 * c['repeat_acc']:.0f} − {100 * c['first_acc']:.0f}"


def _reading(r: dict | None) -> str:
    if not r:
        return ""
    return (f"{100 * r['restated_shape_acc']:.0f} / {100 * r['colour_acc']:.0f} / {100 * r['times_copied']:.0f}"
            f" ({r['n']})")


def probe_table(out: Path) -> str:
    """Sub-agent perception of each probed checkpoint (``OUT/probe_<name>.json``)."""
    lines = []
    for p in sorted(out.glob("probe_*.json")):
        res = json.loads(p.read_text())
        w = res.get("windows", {})
        cells = [f"{100 * w.get(k, {}).get('colour_acc', 0):.0f}" for k in ("event", "short")]
        lines.append(f"| {p.stem[len('probe_'):]} | {cells[0]} | {cells[1]} | "
                     f"{100 * w.get('empty', {}).get('says_empty', 0):.0f} | "
                     f"{100 * w.get('event', {}).get('colour_shape_acc', 0):.0f} | "
                     f"{res.get('features', {}).get('mean_abs_dlogit_pixels_zeroed', float('nan')):.3f} | "
                     f"{_gain(res.get('copying'))} | {_reading(res.get('reading'))} |")
    return md_table(["checkpoint", "colour acc, event ±6 s", "colour acc, 2 s", "empty window called empty",
                     "colour+shape, event", "mean abs Δlogit, pixels zeroed", "copying: repeat − first acc",
                     "reading: shape / colour / times (n)"], lines)


READING_MIN = 0.9  # the SFT checkpoint must name the colour of perfect text reports this often


def reading_check(out: Path) -> str:
    """A warning when the cold start's main agent does not read the reports' colours (``probe_sft.json``).

    The tiny cold start ends in one of two modes: it copies the colour from the report that saw the shape, or
    it copies the report's times and names a colour of its own. In the second
    the tool cells at small K measure guessing, not evidence use; the report then says so instead of leaving
    the reader to find it in the probe table. "" when reading is at least READING_MIN or was not probed."""
    p = out / "probe_sft.json"
    reading = json.loads(p.read_text()).get("reading") if p.exists() else None
    if not reading or reading.get("colour_acc") is None or reading["colour_acc"] >= READING_MIN:
        return ""
    return (f"**This cold start does not read colours from the reports**: given perfect text reports, the SFT "
            f"checkpoint names the reported colour in {100 * reading['colour_acc']:.0f}% of {reading.get('n', '?')} "
            f"lookups (below {100 * READING_MIN:.0f}%; it copies the times, {100 * reading.get('times_copied', 0):.0f}%). "
            "The colour questions of its tools cells at K = 4 are then answered by guessing, in every model trained "
            "from it. "
            "The tiny cold start lands in this mode for some seeds, whatever the attention "
            "(docs/RESULTS.md, \"two modes of the tiny cold start\"): rerun with another SEED to see one that reads.")


def curves_png(out: Path, arms=(("vanilla GRPO", "rl_vanilla"), ("PARA-GRPO", "rl_paragrpo")), keys=None,
               name: str = "report_curves.png") -> Path | None:
    """One panel per metric, one line per RL run (3-step moving average)."""
    runs = {label: read_jsonl(out / d / "metrics.jsonl") for label, d in arms}
    keys = [k for k in (keys or CURVES) if any(r.get(k) is not None for rows in runs.values() for r in rows)]
    if not any(runs.values()) or not keys:
        return None
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    cols = min(len(keys), 5)
    nrows = -(-len(keys) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    axes = axes.ravel()
    for ax in axes[len(keys):]:
        ax.axis("off")
    for ax, key in zip(axes, keys):
        for label, rows in runs.items():
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts)
                sm = [sum(ys[max(0, i - 2): i + 1]) / len(ys[max(0, i - 2): i + 1]) for i in range(len(ys))]
                ax.plot(xs, sm, label=label, lw=2)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    p = out / name
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


GTR_ARMS = (("PARA-GRPO", "rl_para_observe"), ("PARA-GRPO+GTR", "rl_gtr"))
GTR_CURVES = ["reward/acc", "format/compliance", "tools/call_frequency", "gtr/corrected_fraction",
              "gtr/valid_thought_fraction", "gtr/thought_state_consistency", "gtr/thought_answer_consistency",
              "gtr/distinct_thought_fraction", "gtr/cross_question_duplicates", "gtr/repeated_thought_turns",
              "ppo/entropy_think", "ppo/entropy_action", "gtr/nll"]


def _fifths(rows: list[dict], key: str) -> tuple[float, float] | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    if not vals:
        return None
    n = max(1, len(vals) // 5)
    return sum(vals[:n]) / n, sum(vals[-n:]) / n


def gtr_report(out: Path, ks=(4, 64)) -> str:
    """PARA-GRPO vs PARA-GRPO+GTR from one SFT checkpoint (``experiments/ablate_gtr.sh``): eval table,
    paired bootstrap effects on the same questions, collapse metrics over training, curves."""
    summary = json.loads((out / "eval/summary_all.json").read_text()) if (out / "eval/summary_all.json").exists() else {}
    rows = []
    for label, prefix in (("PARA-GRPO", "paragrpo"), ("PARA-GRPO+GTR", "gtr")):
        for k in ks:
            s = summary.get(f"{prefix}-K{k}", {}).get("image_url", {}).get("synthetic")
            if s:
                rows.append(f"| {label} | {k} | {s.get('evaluated', '')} | {_cell(s, 'score')} | {_cell(s, 'format_compliance')} | "
                            f"{_cell(s, 'tool_usage_rate')} |")
    table = ["| run | K | questions | score | format compliance | tool use |", "|---|---|---|---|---|---|", *rows]
    effects = effects_table(out, comparisons=[("GTR − PARA-GRPO", "gtr", k, "paragrpo", k) for k in ks])
    train = []
    for label, d in GTR_ARMS:
        metrics = read_jsonl(out / d / "metrics.jsonl")
        for key in GTR_CURVES:
            fl = _fifths(metrics, key)
            if fl:
                train.append(f"| {label} | {key} | {fl[0]:.3f} | {fl[1]:.3f} |")
    png = curves_png(out, GTR_ARMS, GTR_CURVES, "gtr_curves.png")
    md = [f"# GTR ablation ({time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()})", "",
          "Same SFT checkpoint, seeds and steps; PARA-GRPO runs GTR in observe mode (metrics only, no extra loss).",
          "Held-out synthetic eval set; score = accuracy (mcq, oe) and temporal IoU (tvg); all in %.", "",
          *table, "", "Paired differences on the same questions (B − A, 10 000 bootstrap resamples):", "",
          effects or "(no paired cells)", "", "Training (mean of the first fifth vs the last fifth of the steps):", "",
          "| run | metric | start | end |", "|---|---|---|---|", *train, ""]
    if png:
        md += [f"![gtr curves]({png.name})", ""]
    text = "\n".join(md)
    (out / "gtr_report.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    if args and args[0] == "--gtr":
        print(gtr_report(Path(args[1])))
        return 0
    out = Path(args[0])
    summary = json.loads((out / "eval/summary_all.json").read_text()) if (out / "eval/summary_all.json").exists() else {}
    table = results_table(summary)
    png = curves_png(out)
    rl = {n: read_jsonl(out / d / "metrics.jsonl") for n, d in (("vanilla", "rl_vanilla"), ("para", "rl_paragrpo"))}
    first_last = []
    for n, rows in rl.items():
        if rows:
            a, b = rows[: max(1, len(rows) // 5)], rows[-max(1, len(rows) // 5):]
            for key in ("reward/total", "format/compliance", "tools/call_frequency", "reward/acc"):
                fa = sum(r[key] for r in a) / len(a)
                fb = sum(r[key] for r in b) / len(b)
                first_last.append(f"| {n} | {key} | {fa:.3f} | {fb:.3f} |")
    md = [f"# Quickstart report ({time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {platform.node()})", ""]
    if (out / "machine_speed.json").exists():  # written by scripts/quickstart.sh when it starts
        md += ["Machine speed: " + describe_speed(json.loads((out / "machine_speed.json").read_text()))
               + ". Wall-clock times compare across machines only beside it (`python -m paravt.core.machine_speed`).", ""]
    md += [
          "Held-out synthetic eval set; K = overview frames. score = accuracy (mcq, oe) and temporal IoU (tvg) averaged;",
          "all in %. Tools run as weight-sharing sub-agents (greedy), as in training; the no-tools rows use the direct",
          "prompt (the model answers from its K frames). One seed: intervals are over questions within this run",
          "(bash scripts/reproduce_tiny.sh gives effects across seeds).",
          "", table, ""]
    constant = constant_answers(out)
    if constant:
        md += ["**Constant answers** (accuracy in these cells is how often the gold is that answer, and an effect "
               "involving them may be format, not evidence use): " + "; ".join(constant) + ".", ""]
    reading = reading_check(out)
    if reading:
        md += [reading, ""]
    effects = effects_table(out)
    if effects:
        md += ["The paper's effects as paired differences on the same questions (B − A; "
               "`paravt.analysis.report.paired_delta`, 10 000 resamples):", "", effects, ""]
    md += ["RL training curves (first fifth vs last fifth of the steps):", "",
          "| run | metric | start | end |", "|---|---|---|---|", *first_last, ""]
    probes = probe_table(out)
    if probes:
        md += ["What the sub-agents see (python -m paravt.analysis.probe; held-out videos, greedy; chance colour acc 12.5%; copying = teacher-forced accuracy on a repeated world sentence vs its first occurrence; reading = the answer to perfect reports given as text restates the asked shape / names its colour / copies its times, in %):",
               "", probes, ""]
    if (out / "stage_seconds.tsv").exists():  # written by scripts/quickstart.sh; the last run of a stage wins
        st = dict(line.split("\t") for line in (out / "stage_seconds.tsv").read_text().splitlines() if "\t" in line)
        md += ["Stage wall-clock seconds: " + ", ".join(f"{k} {v}" for k, v in st.items())
               + f" (sum {sum(int(v) for v in st.values())} s)", ""]
    if png:
        md += [f"![curves]({png.name})", ""]
    if (out / "sft/loss_curve.png").exists():
        md += ["![sft loss](sft/loss_curve.png)", ""]
    (out / "report.md").write_text("\n".join(md))
    print(table)
    if constant:
        print("constant answers: " + "; ".join(constant) + "\n")
    if reading:
        print(reading.replace("**", "") + "\n")
    if effects:
        print(effects)
    print("\n".join(first_last))
    if probes:
        print("\n" + probes)
    print(f"\nreport: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
