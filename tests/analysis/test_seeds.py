"""The across-seed report: per-seed cells and effects, a two-level bootstrap interval, the compliance
gate, and the paradox table from the RL logs."""

from __future__ import annotations

import json

import numpy as np

from paravt.analysis.seeds import main, two_level_bootstrap


def _write(run, row, scores, formed, calls=None):
    d = run / "eval" / row / "image_url"
    d.mkdir(parents=True)
    d.joinpath("synthetic.jsonl").write_text("".join(
        json.dumps({"id": f"q{i}", "score": s, "well_formed": w, "tool_calls": (calls or [0] * len(scores))[i]}) + "\n"
        for i, (s, w) in enumerate(zip(scores, formed))))


def test_two_level_bootstrap_covers_the_seed_spread():
    same = [np.full(40, 0.2)] * 3
    assert np.allclose(two_level_bootstrap(same), (0.2, 0.2, 0.2))
    spread = [np.full(40, 0.3), np.full(40, -0.1), np.full(40, 0.1)]  # the seeds disagree in sign
    mean, lo, hi = two_level_bootstrap(spread)
    assert abs(mean - 0.1) < 1e-9 and lo < 0 < hi


def test_report_across_seeds(tmp_path):
    for s, gain in ((0, 30), (1, 25), (2, 35)):
        run = tmp_path / f"seed_{s}"
        _write(run, "sft-notool-K64", [1.0] * 20 + [0.0] * 20, [True] * 40)
        _write(run, "sft-tool-K4", [1.0] * (20 + gain // 5) + [0.0] * (20 - gain // 5), [True] * 40, [4] * 40)
        _write(run, "sft-notool-K4", [0.0] * 40, [True] * 10 + [False] * 30)  # a non-compliant arm
        for arm, comp, k64 in (("rl_vanilla", 0.5, 0.0), ("rl_paragrpo", 0.9, 0.2)):
            (run / arm).mkdir()
            (run / arm / "metrics.jsonl").write_text("".join(json.dumps(
                {"step": i + 1, "format/compliance": comp, "tools/call_frequency": k64,
                 "tools_by_K/call_frequency_K4": 0.8}) + "\n" for i in range(10)))
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("| 4 frames with tools vs 64 without (SFT) |"))
    assert "+15.0 / +12.5 / +17.5 | +15.0 |" in line and line.endswith("| yes |")  # 6, 5, 7 more right of 40
    gated = next(x for x in md.splitlines() if x.startswith("| tools help at small K (SFT) |"))
    assert "not stated: an arm is 25% compliant in a seed" in gated
    assert "| training format compliance, vanilla GRPO | 50 / 50 / 50 | 50 ± 0 |" in md
    assert "| tool-call rate, PARA-GRPO at K = 4 | 80 / 80 / 80 | 80 ± 0 |" in md
    assert main([str(tmp_path / "nothing")]) == 2


def _fragility(run, vanilla, para):
    for d, curve in (("rl_vanilla", vanilla), ("rl_paragrpo", para)):
        p = run / "fragility" / d
        p.mkdir(parents=True)
        p.joinpath("metrics.jsonl").write_text("".join(
            json.dumps({"step": i + 1, "format/compliance": c}) + "\n" for i, c in enumerate(curve)))


def test_fragility_table_judges_the_change_from_the_first_fifth_on_a_base_with_something_to_protect(tmp_path):
    """On a base 50% compliant at RL start, vanilla's compliance falls 0.5 -> 0.2 while PARA's rises to 0.6 in
    every seed: the changes differ by +34 points, E3 met. A base at 90% fails the precondition, named;
    two more seeds that cancel the effect leave an interval containing 0, and the verdict follows it."""
    from paravt.analysis.seeds import fragility_table

    falling = [0.5 - 0.3 * i / 19 for i in range(20)]
    rising = [0.5 + 0.1 * i / 19 for i in range(20)]
    for s in range(3):
        _fragility(tmp_path / f"seed_{s}", falling, rising)
    md = fragility_table(sorted(tmp_path.glob("seed_*")))
    # first fifth = steps 1-4, last fifth = steps 17-20
    assert "| 0 | 20 | 48 → 22 | 51 → 59 | +37 | +33.7 |" in md, md
    assert "Compliance at RL start (first fifth, both arms): 49% (within" in md
    assert "| across 3 seeds | | | | | +33.7 [" in md and "]: met |" in md, md

    strong = tmp_path / "strong"
    for s in range(3):
        _fragility(strong / f"seed_{s}", [0.9 - 0.6 * i / 19 for i in range(20)], [0.9] * 20)
    md = fragility_table(sorted(strong.glob("seed_*")))
    assert "the base's precondition failed (compliance at RL start 88, 88, 88%, asked 25-65%)" in md, md

    _fragility(tmp_path / "seed_3", rising, falling)
    _fragility(tmp_path / "seed_4", rising, falling)
    md = fragility_table(sorted(tmp_path.glob("seed_*")))
    assert "not met: interval contains 0" in md, md
    assert main([str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "## Format Fragility" in report and (tmp_path / "fragility_curves.png").stat().st_size > 1000
