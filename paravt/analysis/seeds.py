"""Across-seed report of ``bash scripts/reproduce_tiny.sh``: ``python -m paravt.analysis.seeds OUT``.

``OUT/seed_<s>/`` are quickstart runs that differ only in their training seed (same world). Writes
``OUT/report.md`` with, in the paper's shape:

* every eval cell per seed and their mean (score, format compliance, tool use);
* each effect of :data:`paravt.analysis.report.COMPARISONS` per seed (paired over questions) and across
  seeds: the mean of the per-seed effects with a 95% interval from a two-level bootstrap (seeds
  resampled, then questions within each drawn seed), stated only when every arm of every seed is
  at least ``MIN_COMPLIANCE`` compliant;
* the two faces of the Tool Prior Paradox from the RL training logs: format compliance at the end of
  training (Format Fragility) and the tool-call rate at K = 64 for vanilla GRPO (fixed K) vs at
  K <= 8 for PARA-GRPO (gated K) (Tool Necessity Gap), per seed and across seeds;
* Format Fragility on a base with a tool prior of its own (``seed_<s>/fragility/``, written by
  ``scripts/fragility_tiny.sh``): training-time compliance of vanilla GRPO and PARA-GRPO from the same
  cold start, the change in compliance from the first fifth of the steps to the last, PARA − vanilla
  across seeds (judged against the E3 criterion), and the curves
  (``OUT/fragility_curves.png``).

The seeds must differ in their seed alone: their stages' settings are compared first
(:mod:`paravt.analysis.run_settings`), and seeds run with other settings (another ``RL_STEPS``, another
``EVAL_LIMIT``, ...) stop the report with exit 2 and the differing keys, unless
``--allow-differing-settings`` (then the report lists them under its title).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from paravt.core.metrics import read_jsonl
from paravt.core.seeding import rng
from paravt.analysis.report import COMPARISONS, MIN_COMPLIANCE, ROWS, comparison, md_table, per_question
from paravt.analysis.run_settings import differences


def seed_dirs(out: Path) -> list[Path]:
    return sorted((p for p in out.glob("seed_*") if p.is_dir()), key=lambda p: int(p.name.split("_")[1]))


def two_level_bootstrap(per_seed: list[np.ndarray], n_boot: int = 10000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of the per-seed mean differences, and a 95% interval: seeds drawn with replacement, then
    the questions of each drawn seed with replacement (paired differences ``d`` per question)."""
    g = rng("two_level_bootstrap", seed)
    means = np.array([d.mean() for d in per_seed])
    boots = np.empty(n_boot)
    for b in range(n_boot):
        picks = g.integers(0, len(per_seed), size=len(per_seed))
        boots[b] = np.mean([per_seed[i][g.integers(0, len(per_seed[i]), size=len(per_seed[i]))].mean() for i in picks])
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return float(means.mean()), float(lo), float(hi)


def _diffs(run: Path, b: str, kb: int, a: str, ka: int, key: str) -> np.ndarray | None:
    qa, qb = per_question(run, f"{a}-K{ka}", key), per_question(run, f"{b}-K{kb}", key)
    ids = sorted(set(qa) & set(qb))
    return np.array([qb[i] - qa[i] for i in ids]) if ids else None


def _compliance(run: Path, row: str, k: int) -> float | None:
    q = per_question(run, f"{row}-K{k}", "well_formed")
    return sum(q.values()) / len(q) if q else None


def cells_table(runs: list[Path]) -> str:
    lines = []
    for key, label in ROWS:
        for k in (4, 64):
            vals = []
            for r in runs:
                s, c, t = (per_question(r, f"{key}-K{k}", m) for m in ("score", "well_formed", "tool_calls"))
                vals.append(None if not s else (np.mean(list(s.values())), np.mean(list(c.values())),
                                                np.mean([v > 0 for v in t.values()])))
            if all(v is None for v in vals):
                continue
            per = " / ".join("–" if v is None else f"{100 * v[0]:.1f}" for v in vals)
            got = [v for v in vals if v is not None]
            mean = np.mean(got, axis=0)
            lines.append(f"| {label} | {k} | {per} | {100 * mean[0]:.1f} | {100 * mean[1]:.0f} | {100 * mean[2]:.0f} |")
    return md_table(["model", "K", "score per seed", "mean score", "mean compliance", "mean tool use"], lines)


def effects_across_seeds(runs: list[Path], seed: int = 0) -> str:
    lines = []
    for c in COMPARISONS:
        name, b, kb, a, ka = comparison(c)
        d = [_diffs(r, b, kb, a, ka, "score") for r in runs]
        if any(x is None or not len(x) for x in d):
            continue
        comp = [x for r in runs for x in (_compliance(r, a, ka), _compliance(r, b, kb))]
        mean, lo, hi = two_level_bootstrap(d, seed=seed)
        per = " / ".join(f"{100 * x.mean():+.1f}" for x in d)
        shown = "yes" if lo > 0 else ("reversed" if hi < 0 else "no (interval contains 0)")
        if min(comp) < MIN_COMPLIANCE:
            shown = f"not stated: an arm is {100 * min(comp):.0f}% compliant in a seed (< {100 * MIN_COMPLIANCE:.0f}%)"
        k = str(ka) if ka == kb else f"{kb} vs {ka}"
        lines.append(f"| {name} | {k} | {per} | {100 * mean:+.1f} | [{100 * lo:+.1f}, {100 * hi:+.1f}] | "
                     f"{100 * min(comp):.0f} | {shown} |")
    return md_table(["effect (B − A)", "K", "Δ per seed", "mean Δ", "95% interval (seeds, then questions)",
                     "lowest arm compliance (%)", "shown"], lines)


def _last(metrics: list[dict], key: str, frac: float = 0.2) -> float | None:
    vals = [m[key] for m in metrics if key in m]
    if not vals:
        return None
    n = max(1, int(round(len(vals) * frac)))
    return float(np.mean(vals[-n:]))


def _fmt(vals: list[float | None]) -> str:
    got = [v for v in vals if v is not None]
    per = " / ".join("–" if v is None else f"{100 * v:.0f}" for v in vals)
    if not got:
        return per + " | "
    m = np.mean(got)
    sd = np.std(got, ddof=1) if len(got) > 1 else 0.0
    return f"{per} | {100 * m:.0f} ± {100 * sd:.0f}"


def paradox_table(runs: list[Path]) -> str:
    """Training-time numbers of the paper's two faces, from each run's RL metrics (last fifth of the steps)."""
    logs = {arm: [read_jsonl(r / d / "metrics.jsonl") for r in runs] for arm, d in (("vanilla", "rl_vanilla"), ("para", "rl_paragrpo"))}
    rows = []
    for label, arm, key in (
            ("training format compliance, vanilla GRPO", "vanilla", "format/compliance"),
            ("training format compliance, PARA-GRPO", "para", "format/compliance"),
            ("tool-call rate, vanilla GRPO (fixed K = 64)", "vanilla", "tools/call_frequency"),
            ("tool-call rate, PARA-GRPO at K = 4", "para", "tools_by_K/call_frequency_K4"),
            ("tool-call rate, PARA-GRPO at K = 8", "para", "tools_by_K/call_frequency_K8"),
            ("tool-call rate, PARA-GRPO at K = 64", "para", "tools_by_K/call_frequency_K64")):
        vals = [_last(m, key) for m in logs[arm]]
        if any(v is not None for v in vals):
            rows.append(f"| {label} | {_fmt(vals)} |")
    return md_table(["training metric (last fifth of the RL steps, %)", "per seed", "mean ± sd over seeds"], rows)


FRAGILITY_ARMS = (("vanilla", "rl_vanilla"), ("PARA-GRPO", "rl_paragrpo"))


def _compliance_curve(run: Path, d: str) -> np.ndarray:
    return np.array([m["format/compliance"] for m in read_jsonl(run / "fragility" / d / "metrics.jsonl")
                     if "format/compliance" in m], dtype=float)


def change_bootstrap(pairs: list[tuple[np.ndarray, np.ndarray]], n_boot: int = 10000,
                     seed: int = 0) -> tuple[float, float, float]:
    """Mean over seeds of ``mean(last) - mean(first)`` and a 95% interval: seeds drawn with replacement,
    then, within each drawn seed, the steps of its first and of its last window drawn with replacement."""
    g = rng("change_bootstrap", seed)
    means = np.array([b.mean() - a.mean() for a, b in pairs])
    boots = np.empty(n_boot)
    for i in range(n_boot):
        picks = g.integers(0, len(pairs), size=len(pairs))
        boots[i] = np.mean([pairs[j][1][g.integers(0, len(pairs[j][1]), len(pairs[j][1]))].mean()
                            - pairs[j][0][g.integers(0, len(pairs[j][0]), len(pairs[j][0]))].mean() for j in picks])
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return float(means.mean()), float(lo), float(hi)


# Format Fragility's criterion (decided before the runs): on a base 25-65% compliant at RL start, the change in
# training-time compliance from the first fifth of the steps to the last fifth, PARA-GRPO minus vanilla GRPO,
# at least +15 points with the interval's lower bound above 0.
FRAGILITY_BASE = (0.25, 0.65)
FRAGILITY_MIN_EFFECT = 0.15


def fragility_table(runs: list[Path], seed: int = 0, frac: float = 0.2) -> str:
    """Training-time format compliance on the strong-prior base, per seed and arm: the first fifth of the
    steps and the last fifth; PARA − vanilla of their changes (first fifth -> last fifth), per seed and,
    across seeds, with a 95% interval (seeds, then the steps of each window, paired by step: both arms see
    the same prompts at a step). Judged against E3: a base 25-65% compliant at RL start, and a difference
    of the changes of at least +15 points whose interval stays above 0."""
    rows, pairs, starts = [], [], []
    for r in runs:
        v, p = (_compliance_curve(r, d) for _, d in FRAGILITY_ARMS)
        if not len(v) or not len(p):
            continue
        n = min(len(v), len(p))
        k = max(1, int(round(n * frac)))
        first, last = p[:k] - v[:k], p[n - k:n] - v[n - k:n]
        pairs.append((first, last))
        starts.append((v[:k].mean() + p[:k].mean()) / 2)
        rows.append(f"| {r.name.split('_')[1]} | {n} | {100 * v[:k].mean():.0f} → {100 * v[n - k:n].mean():.0f} | "
                    f"{100 * p[:k].mean():.0f} → {100 * p[n - k:n].mean():.0f} | {100 * last.mean():+.0f} | "
                    f"{100 * (last.mean() - first.mean()):+.1f} |")
    if not rows:
        return ""
    lo_b, hi_b = FRAGILITY_BASE
    base = float(np.mean(starts))
    base_ok = all(lo_b <= s <= hi_b for s in starts)
    if len(pairs) > 1:
        mean, lo, hi = change_bootstrap(pairs, seed=seed)
        verdict = ("met" if mean >= FRAGILITY_MIN_EFFECT and lo > 0 else
                   "not met: reversed" if hi < 0 else
                   "not met: interval contains 0" if lo <= 0 else f"not met: below +{100 * FRAGILITY_MIN_EFFECT:.0f}")
        if not base_ok:
            verdict += (f"; the base's precondition failed (compliance at RL start {', '.join(f'{100 * s:.0f}' for s in starts)}%,"
                        f" asked {100 * lo_b:.0f}-{100 * hi_b:.0f}%)")
        rows.append(f"| across {len(pairs)} seeds | | | | | {100 * mean:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]: {verdict} |")
    table = md_table(["seed", "RL steps", "vanilla GRPO: first fifth → last fifth (%)",
                      "PARA-GRPO: first fifth → last fifth (%)", "PARA − vanilla, last fifth (points)",
                      "PARA − vanilla of the changes (points)"], rows)
    return (f"Compliance at RL start (first fifth, both arms): {100 * base:.0f}% "
            f"({'within' if base_ok else 'outside'} the {100 * lo_b:.0f}-{100 * hi_b:.0f}% a base with something to "
            f"protect asks, in {'every' if base_ok else 'not every'} seed). E3 asks PARA − vanilla of the changes "
            f">= +{100 * FRAGILITY_MIN_EFFECT:.0f} points with the interval above 0.\n\n" + table)


def fragility_settings(runs: list[Path]) -> str:
    """What scripts/fragility_tiny.sh ran with (its settings.json), or 'not recorded' (older folders)."""
    import json  # noqa: PLC0415

    seen = {(r / "fragility" / "settings.json").read_text().strip() for r in runs if (r / "fragility" / "settings.json").exists()}
    if not seen:
        return "not recorded"
    described = []
    for text in sorted(seen):
        d = json.loads(text)
        k = "each arm at its recipe's K" if d.get("frag_k") == "recipe" else f"both arms at K = {d.get('frag_k')}"
        sched = d.get("cold_schedule_steps")
        planned = f" (schedule planned over {sched})" if sched and sched != d.get("cold_steps") else ""
        described.append(f"{k}; native rows' reasoning {d.get('native_reasoning')}; "
                         f"prior {d.get('prior_steps')} steps from {d.get('base', 'sft_reading_long')}, "
                         f"cold start {d.get('cold_steps')}{planned}, RL {d.get('rl_steps')} steps")
    return " | ".join(described) + (" (the seeds differ)" if len(described) > 1 else "")


def fragility_curves(runs: list[Path], path: Path, window: int = 5) -> Path | None:
    """Training-time compliance per step (a running mean over ``window`` steps), every seed, both arms."""
    curves = [(r, name, _compliance_curve(r, d)) for r in runs for name, d in FRAGILITY_ARMS]
    curves = [c for c in curves if len(c[2])]
    if not curves:
        return None
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.5))
    styles = ("-", "--", ":", "-.")  # one line style per seed, one colour per arm
    style = {r: styles[i % len(styles)] for i, r in enumerate(runs)}
    for r, name, c in curves:
        sm = np.convolve(c, np.ones(window) / window, mode="valid") if len(c) >= window else c
        ax.plot(np.arange(len(sm)) + (len(c) - len(sm)) + 1, 100 * sm, color="tab:red" if name == "vanilla" else "tab:blue",
                linestyle=style[r], alpha=0.8, label=f"{name}, seed {r.name.split('_')[1]}")
    ax.set_xlabel("RL step")
    ax.set_ylabel(f"format compliance (%; mean of {window} steps)")
    ax.set_ylim(-2, 102)
    ax.set_title("Format Fragility: a base with a tool prior of its own")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    allow = "--allow-differing-settings" in args
    args = [a for a in args if a != "--allow-differing-settings"]
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print(__doc__)
        print("usage: python -m paravt.analysis.seeds OUT [--allow-differing-settings]")
        return 0 if args and args[0] in ("-h", "--help") else 2
    out = Path(args[0])
    runs = seed_dirs(out)
    if not runs:
        print(f"error: no seed_<s>/ runs under {out}", file=sys.stderr)
        return 2
    differ, partial = differences(runs)
    if differ and not allow:
        print(f"error: the seeds under {out} were not run with the same settings, so an interval across them mixes"
              f" settings ({len(differ)} differ; rerun those seeds, or --allow-differing-settings to write the report"
              " with the differences listed):\n  " + "\n  ".join(differ[:20]), file=sys.stderr)
        return 2
    seeds = ", ".join(r.name.split("_")[1] for r in runs)
    same = ("Every stage's settings are the same in every seed but the seed (python -m paravt.analysis.run_settings)."
            if not differ else "**The seeds differ in settings** (written with --allow-differing-settings): "
            + "; ".join(differ) + ".")
    md = [f"# Tiny ParaVT across seeds ({time.strftime('%Y-%m-%d %H:%M')})", "",
          f"Seeds {seeds} (training seed; one world). Held-out synthetic questions; score = accuracy (mcq, oe) and",
          "temporal IoU (tvg) averaged, in %. No-tools rows: the direct prompt (the model answers from its K frames).",
          same + (f" Run in some seeds only: {'; '.join(partial)}." if partial else ""), "",
          "## Eval cells", "", cells_table(runs), "",
          "## Effects across seeds", "",
          "Paired per question within a seed; the interval resamples seeds, then questions within each seed (10 000 draws).",
          f"A score effect is stated only when both arms are at least {100 * MIN_COMPLIANCE:.0f}% format-compliant in every seed.", "",
          effects_across_seeds(runs) or "(no paired cells)", "",
          "## The Tool Prior Paradox at tiny scale (training logs)", "", paradox_table(runs) or "(no RL logs)", ""]
    frag = fragility_table(runs)
    if frag:
        png = fragility_curves(runs, out / "fragility_curves.png")
        md += ["## Format Fragility on a base with a tool prior (scripts/fragility_tiny.sh)", "",
               "The base is first trained on the episodes in an instruct model's native format (Hermes calls, plain",
               "answers, no think or answer tags), then given a short cold-start SFT in the structured format; vanilla",
               "GRPO and PARA-GRPO then train from that checkpoint (same steps, same seed). Compliance = every turn a",
               "closed think block followed by parseable calls or a non-empty answer (the rollouts at temperature).",
               f"Settings: {fragility_settings(runs)}.", "",
               frag, "", f"![compliance curves]({png.name})" if png else "", ""]
    (out / "report.md").write_text("\n".join(md))
    print("\n".join(md))
    print(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
