"""The quickstart report from stage outputs written in the stages' own formats."""

import json

from paravt.analysis.report import effects_table, main, paired_delta, probe_table, reading_check, results_table


def _summary(score, tool_rate):
    return {"score": score, "format_compliance": 0.9, "tool_usage_rate": tool_rate, "avg_tool_calls": 2.5,
            "by_question_type": {"mcq": {"n": 2, "score": 1.0}, "oe": {"n": 2, "score": 0.5}, "tvg": {"n": 2, "score": 0.25}}}


def test_report_tables_probe_and_stage_times(tmp_path):
    summ = {"sft-tool-K4": {"image_url": {"synthetic": _summary(0.6, 1.0)}},
            "paragrpo-tool-K64": {"image_url": {"synthetic": _summary(0.4, 0.0)}}}
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval/summary_all.json").write_text(json.dumps(summ))
    (tmp_path / "rl_paragrpo").mkdir()
    rows = [{"step": i, "reward/total": i / 10, "format/compliance": 0.5 + i / 20, "tools/call_frequency": 0.3,
             "reward/acc": 0.1 * i} for i in range(1, 6)]
    (tmp_path / "rl_paragrpo/metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "probe_sft.json").write_text(json.dumps({
        "windows": {"event": {"colour_acc": 0.9, "colour_shape_acc": 0.3}, "short": {"colour_acc": 0.85},
                    "empty": {"says_empty": 1.0}}, "features": {"mean_abs_dlogit_pixels_zeroed": 2.5},
        "copying": {"first_acc": 0.3, "repeat_acc": 0.815}}))
    (tmp_path / "stage_seconds.tsv").write_text("sft\t300\neval\t100\neval\t120\n")
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "| SFT, with tools | 4 | 60.0 | 100.0 | 50.0 | 25.0 | 90.0 | 100.0 | 2.50 |" in md
    assert "| PARA-GRPO | 64 | 40.0 |" in md and "SFT, no tools" not in md
    assert "| para | format/compliance | 0.550 | 0.750 |" in md  # first vs last fifth (one step each)
    assert "| sft | 90 | 85 | 100 | 30 | 2.500 | 82 − 30 |" in md
    assert "sft 300, eval 120 (sum 420 s)" in md  # the last run of a stage wins
    assert (tmp_path / "report_curves.png").stat().st_size > 1000


def test_empty_inputs_give_empty_tables(tmp_path):
    assert results_table({}).count("\n") == 2 and probe_table(tmp_path) == ""


def test_paired_delta_interval_and_counts():
    a = {f"q{i}": 0.0 for i in range(30)}
    assert paired_delta(a, dict(a)) == {"n": 30, "delta": 0.0, "lo": 0.0, "hi": 0.0, "b_better": 0, "a_better": 0}
    strong = {q: 1.0 if i < 20 else 0.0 for i, q in enumerate(a)}  # B right on 20 of 30, A on none
    r = paired_delta(a, strong)
    assert r["b_better"] == 20 and abs(r["delta"] - 2 / 3) < 1e-9 and 0.45 < r["lo"] < r["delta"] < r["hi"] < 0.85
    weak = {q: 1.0 if i < 2 else 0.0 for i, q in enumerate(a)}  # 2 of 30: 0 is inside the interval
    assert paired_delta(a, weak)["lo"] <= 0.0 < paired_delta(a, weak)["hi"]
    assert paired_delta(a, weak, seed=3) == paired_delta(a, weak, seed=3)
    assert paired_delta(a, {"other": 1.0}) == {"n": 0}  # only questions both cells answered count


def test_effects_table_from_per_question_files(tmp_path):
    def write(row, scores, formed):
        d = tmp_path / "eval" / row / "image_url"
        d.mkdir(parents=True)
        d.joinpath("synthetic.jsonl").write_text("".join(
            json.dumps({"id": f"q{i}", "score": s, "well_formed": w}) + "\n" for i, (s, w) in enumerate(zip(scores, formed))))
    write("sft-notool-K4", [0.0] * 40, [False] * 40)  # an arm that cannot answer (0% compliant)
    write("sft-tool-K4", [1.0] * 30 + [0.0] * 10, [True] * 40)
    write("sft-notool-K64", [1.0] * 20 + [0.0] * 20, [True] * 38 + [False] * 2)  # 95% compliant
    md = effects_table(tmp_path)
    # against the non-compliant arm the score effect is measured but not stated: it would be format
    assert "| tools help at small K (SFT) | 4 | score | 100 / 0 | +75.0 |" in md
    assert "30 / 0 of 40 | not stated: an arm is 0% compliant (< 90%) |" in md
    assert "| tools help at small K (SFT) | 4 | format compliance | 100 / 0 | +100.0 | [+100.0, +100.0] |" in md
    # 4 frames with tools against 64 without: both arms compliant, the effect is stated
    assert "| 4 frames with tools vs 64 without (SFT) | 4 vs 64 | score | 100 / 95 | +25.0 |" in md
    line = next(x for x in md.splitlines() if x.startswith("| 4 frames with tools vs 64 without (SFT) | 4 vs 64 | score"))
    assert line.endswith("| yes |")
    assert "PARA-GRPO" not in md  # rows that were not evaluated are left out


def test_gtr_report_pairs_the_two_arms_and_reads_collapse_metrics(tmp_path):
    from paravt.analysis.report import gtr_report

    for row, scores in (("paragrpo-K4", [0.0] * 40), ("gtr-K4", [1.0] * 10 + [0.0] * 30)):
        d = tmp_path / "eval" / row / "image_url"
        d.mkdir(parents=True)
        d.joinpath("synthetic.jsonl").write_text("".join(
            json.dumps({"id": f"q{i}", "score": s, "well_formed": True}) + "\n" for i, s in enumerate(scores)))
    (tmp_path / "eval/summary_all.json").write_text(json.dumps({
        "paragrpo-K4": {"image_url": {"synthetic": _summary(0.0, 1.0)}},
        "gtr-K4": {"image_url": {"synthetic": _summary(0.25, 1.0)}}}))
    for run, div in (("rl_para_observe", [0.9, 0.9, 0.5, 0.4, 0.3]), ("rl_gtr", [0.9, 0.9, 0.8, 0.8, 0.8])):
        (tmp_path / run).mkdir()
        (tmp_path / run / "metrics.jsonl").write_text("".join(json.dumps(
            {"step": i + 1, "gtr/distinct_thought_fraction": v, "reward/acc": 0.1}) + "\n" for i, v in enumerate(div)))
    md = gtr_report(tmp_path, ks=(4,))
    assert "| GTR − PARA-GRPO | 4 | score | 100 / 100 | +25.0 |" in md and "10 / 0 of 40 | yes |" in md
    assert "| PARA-GRPO | gtr/distinct_thought_fraction | 0.900 | 0.300 |" in md
    assert "| PARA-GRPO+GTR | gtr/distinct_thought_fraction | 0.900 | 0.800 |" in md
    assert (tmp_path / "gtr_report.md").read_text() == md and (tmp_path / "gtr_curves.png").stat().st_size > 1000


def test_constant_answers_are_flagged(tmp_path):
    """A row that gives one answer to (nearly) every mcq / oe question is named in the report; a row
    whose answers vary is not; types with too few questions are skipped."""
    from paravt.analysis.report import constant_answers

    def write(row, preds):
        d = tmp_path / "eval" / row / "image_url"
        d.mkdir(parents=True)
        (d / "synthetic.jsonl").write_text("\n".join(json.dumps({"id": f"q{i}", "question_type": t, "pred": p, "score": 0.0})
                                                     for i, (t, p) in enumerate(preds)) + "\n")

    write("sft-tool-K4", [("mcq", "B")] * 38 + [("mcq", "D")] * 2 + [("oe", "yellow")] * 40 + [("tvg", "[1.0, 2.0]")] * 40)
    write("sft-notool-K4", [("mcq", "ABCD"[i % 4]) for i in range(40)] + [("oe", "red")] * 5)
    notes = constant_answers(tmp_path)
    assert notes == ["sft-tool-K4 answers 'B' to 38 of 40 mcq questions",
                     "sft-tool-K4 answers 'yellow' to 40 of 40 oe questions"]
    (tmp_path / "eval/summary_all.json").write_text(json.dumps({}))
    assert main([str(tmp_path)]) == 0
    assert "**Constant answers**" in (tmp_path / "report.md").read_text()


def test_report_warns_when_the_cold_start_does_not_read_colours(tmp_path):
    def probe(colour):
        (tmp_path / "probe_sft.json").write_text(json.dumps(
            {"windows": {}, "reading": {"n": 60, "restated_shape_acc": 1.0, "colour_acc": colour, "times_copied": 0.92}}))
    probe(0.383)  # the weak mode: times copied, colours its own
    warning = reading_check(tmp_path)
    assert "does not read colours" in warning and "38% of 60 lookups" in warning and "times, 92%" in warning
    assert main([str(tmp_path)]) == 0 and warning in (tmp_path / "report.md").read_text()
    probe(1.0)
    assert reading_check(tmp_path) == "" and main([str(tmp_path)]) == 0
    assert "does not read colours" not in (tmp_path / "report.md").read_text()
    (tmp_path / "probe_sft.json").unlink()
    assert reading_check(tmp_path) == ""  # not probed: nothing to say
