"""The RL-made effects across seeds, against criteria fixed before the runs:
``python -m paravt.analysis.effects RUN_DIR [RUN_DIR ...] [--out effects.md]``.

Each ``RUN_DIR`` is one seed of ``experiments/rl_effects_pilot.sh``: sampled eval (several draws per
question at the rollout temperature) of SFT, vanilla GRPO and PARA-GRPO at K = 4 and K = 64, in
``RUN_DIR/eval/<model>-K<k>/image_url/synthetic.jsonl`` (one record per draw, ids ``QID#s<j>``).

Per question, the draws are averaged (score, whether the episode called a tool). Every effect is a
paired difference over questions, its mean taken per seed and then across seeds, with a 95% interval
from the two-level bootstrap of :func:`paravt.analysis.seeds.two_level_bootstrap` (seeds resampled, then
questions). In points (× 100):

* E1 PARA-GRPO beats vanilla at low K: at K = 4, PARA − vanilla ≥ +5 and PARA − SFT ≥ +5, each with
  its lower bound above 0; at K = 64, PARA − vanilla within ±5 (the mean).
* E2 RL makes the Tool Necessity Gap: the precondition |SFT's P(call|4) − P(call|64)| ≤ 10; then
  PARA's P(call|4) − P(call|64) ≥ +25 with its lower bound above +10, and vanilla's ≤ +10.

An effect that does not appear is reported as such, with the numbers; nothing here is tuned.

``--against RUN_DIR ...`` compares two designs run from the same cold starts (an ablation: the same seeds,
worlds and eval questions, another RL setting): every effect and cell of the second design minus the
first's, paired by seed (in the order given) and by question, with the same two-level interval.

Within a design the seeds must differ in their seed alone (:mod:`paravt.analysis.run_settings` compares every
stage's settings); otherwise exit 2 with the differing keys, unless ``--allow-differing-settings``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from paravt.core.metrics import read_jsonl
from paravt.analysis.run_settings import differences
from paravt.analysis.seeds import two_level_bootstrap

MODELS = ("sft", "vanilla", "paragrpo")
KS = (4, 64)


def per_question(run: Path, row: str, lost: list | None = None) -> dict[str, dict[str, float]]:
    """``{question id: {"score", "call", "n"}}``: the draws of each question averaged. Draws that
    failed (an ``error`` record) are left out and appended to ``lost``."""
    p = run / "eval" / row / "image_url" / "synthetic.jsonl"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no eval records (has this seed's rl_effects_pilot.sh finished?)")
    acc: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in read_jsonl(p):
        if r.get("error"):
            if lost is not None:
                lost.append(f"{p}: {r['id']}")
            continue
        qid = re.sub(r"#s\d+$", "", str(r["id"]))
        acc[qid].append((float(r.get("score") or 0.0), float((r.get("tool_calls") or 0) > 0)))
    return {q: {"score": float(np.mean([s for s, _ in v])), "call": float(np.mean([c for _, c in v])), "n": len(v)}
            for q, v in acc.items()}


# name -> (label, (model, K) of a, (model, K) of b, key): the effect is b − a per question
SPECS = {
    "para_vs_vanilla_K4": ("PARA − vanilla, score at K = 4", ("vanilla", 4), ("paragrpo", 4), "score"),
    "para_vs_sft_K4": ("PARA − SFT, score at K = 4", ("sft", 4), ("paragrpo", 4), "score"),
    "para_vs_vanilla_K64": ("PARA − vanilla, score at K = 64", ("vanilla", 64), ("paragrpo", 64), "score"),
    **{f"gap_{m}": (f"{m}: P(call | 4) − P(call | 64)", (m, 64), (m, 4), "call") for m in MODELS},
}


def paired(a: dict, b: dict, key: str) -> dict[str, float]:
    """``{question: b[key] - a[key]}`` over the questions both rows answered, × 100."""
    return {i: 100.0 * (b[i][key] - a[i][key]) for i in sorted(set(a) & set(b))}


def load_cells(runs: list[Path], lost: list) -> list[dict]:
    return [{(m, k): per_question(r, f"{m}-K{k}", lost) for m in MODELS for k in KS} for r in runs]


def estimate(name: str, diffs: list[np.ndarray], n_boot: int, seed: int) -> dict:
    mean, lo, hi = two_level_bootstrap(diffs, n_boot=n_boot, seed=seed)
    return {"name": name, "mean": mean, "lo": lo, "hi": hi, "per_seed": [float(d.mean()) for d in diffs],
            "questions": [len(d) for d in diffs]}


def effect_values(c: dict, name: str) -> dict[str, float]:
    _, a, b, key = SPECS[name]
    return paired(c[a], c[b], key)


def cell_means(cells: list[dict]) -> dict:
    return {f"{m}-K{k}": {key: float(np.mean([100 * np.mean([q[key] for q in c[m, k].values()]) for c in cells]))
                          for key in ("score", "call")} for m in MODELS for k in KS}


def effects(runs: list[Path], n_boot: int = 10000, seed: int = 0) -> dict:
    lost: list[str] = []
    cells = load_cells(runs, lost)
    e = {name: estimate(spec[0], [np.array(list(effect_values(c, name).values())) for c in cells], n_boot, seed)
         for name, spec in SPECS.items()}
    checks = {
        "E1": (e["para_vs_vanilla_K4"]["mean"] >= 5 and e["para_vs_vanilla_K4"]["lo"] > 0
               and e["para_vs_sft_K4"]["mean"] >= 5 and e["para_vs_sft_K4"]["lo"] > 0
               and abs(e["para_vs_vanilla_K64"]["mean"]) <= 5),
        "E2_precondition": abs(e["gap_sft"]["mean"]) <= 10,
        "E2": (e["gap_paragrpo"]["mean"] >= 25 and e["gap_paragrpo"]["lo"] > 10 and e["gap_vanilla"]["mean"] <= 10),
    }
    return {"seeds": [str(r) for r in runs], "effects": e, "cells": cell_means(cells), "checks": checks, "lost": lost}


def compare(base: list[Path], other: list[Path], n_boot: int = 10000, seed: int = 0) -> dict:
    """Each effect and cell of ``other`` minus ``base``, paired by seed (the i-th of each) and by question."""
    if len(base) != len(other):
        raise ValueError(f"--against needs one run per seed of the first design: {len(base)} against {len(other)}")
    lost: list[str] = []
    cb, co = load_cells(base, lost), load_cells(other, lost)

    def diff(values) -> list[np.ndarray]:  # values(cells of one seed) -> {question: value}
        out = []
        for b, o in zip(cb, co):
            vb, vo = values(b), values(o)
            out.append(np.array([vo[i] - vb[i] for i in sorted(set(vb) & set(vo))]))
        return out

    e = {name: estimate(spec[0], diff(lambda c, n=name: effect_values(c, n)), n_boot, seed) for name, spec in SPECS.items()}
    for m in MODELS:
        for k in KS:
            for key, label in (("score", "score"), ("call", "P(call)")):
                cell = diff(lambda c, mk=(m, k), key=key: {q: 100.0 * v[key] for q, v in c[mk].items()})
                e[f"{m}_K{k}_{key}"] = estimate(f"{m}, {label} at K = {k}", cell, n_boot, seed)
    return {"seeds": [str(r) for r in base], "against": [str(r) for r in other], "effects": e, "lost": lost}


def compare_markdown(res: dict) -> str:
    n = len(res["seeds"])
    lines = [f"The second design minus the first, paired by seed and question; {n} seed(s) (points):", "",
             "| effect or cell | difference [95% interval] | per seed |", "|---|---|---|", *effect_rows(res["effects"])]
    if res["lost"]:
        lines.append(f"- {len(res['lost'])} draw(s) failed and are left out, e.g. {res['lost'][0]}")
    return "\n".join(lines) + "\n"


def effect_rows(effects: dict) -> list[str]:
    return [f"| {e['name']} | {e['mean']:+.1f} [{e['lo']:+.1f}, {e['hi']:+.1f}] | "
            + ", ".join(f"{v:+.1f}" for v in e["per_seed"]) + " |" for e in effects.values()]


def markdown(res: dict) -> str:
    n = len(res["seeds"])
    lines = [f"Sampled eval, {n} seed(s); mean across seeds of each cell (points):", "",
             "| model | K | score | P(call) |", "|---|---|---|---|"]
    for name, c in res["cells"].items():
        m, k = name.rsplit("-K", 1)
        lines.append(f"| {m} | {k} | {c['score']:.1f} | {c['call']:.1f} |")
    lines += ["", "| effect | mean [95% interval] | per seed |", "|---|---|---|", *effect_rows(res["effects"])]
    c = res["checks"]
    verdict = lambda ok: "holds" if ok else "does not hold"  # noqa: E731
    lines += ["", f"- E1 (PARA − vanilla and PARA − SFT ≥ +5 at K = 4, lower bounds > 0; |PARA − vanilla| ≤ 5 at "
                  f"K = 64): **{verdict(c['E1'])}**",
              f"- E2 precondition (|SFT's P(call|4) − P(call|64)| ≤ 10): **{verdict(c['E2_precondition'])}**",
              f"- E2 (PARA's gap ≥ +25, lower bound > +10; vanilla's ≤ +10): **{verdict(c['E2'])}**"]
    if res["lost"]:
        lines.append(f"- {len(res['lost'])} draw(s) failed and are left out, e.g. {res['lost'][0]}")
    if n < 3:
        lines.append(f"- {n} seed(s): the criteria ask for three; this is not an acceptance run.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m paravt.analysis.effects", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="one rl_effects_pilot.sh output folder per seed")
    ap.add_argument("--against", nargs="+", type=Path, metavar="RUN_DIR",
                    help="a second design's folders, one per seed in the same order: report its effects minus the first's")
    ap.add_argument("--out", type=Path, help="write the markdown here (and the numbers beside it as .json)")
    ap.add_argument("--n-boot", type=int, default=10000)
    ap.add_argument("--allow-differing-settings", action="store_true",
                    help="report even when the seeds of one design were run with different settings")
    a = ap.parse_args(argv)
    for design in (a.runs, a.against or []):  # within a design the seeds differ in their seed alone
        differ = differences(design)[0] if len(design) > 1 else []
        if differ and not a.allow_differing_settings:
            print(f"error: the seeds {', '.join(map(str, design))} were not run with the same settings ({len(differ)}"
                  " differ; --allow-differing-settings to report anyway):\n  " + "\n  ".join(differ[:20]), file=sys.stderr)
            return 2
    try:
        res = compare(a.runs, a.against, n_boot=a.n_boot) if a.against else effects(a.runs, n_boot=a.n_boot)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    md = compare_markdown(res) if a.against else markdown(res)
    print(md, end="")
    if a.out:
        a.out.write_text(md)
        a.out.with_suffix(".json").write_text(json.dumps(res, indent=2))
    return 1 if res["lost"] else 0  # lost draws: the numbers above are over fewer episodes than asked


if __name__ == "__main__":
    sys.exit(main())
