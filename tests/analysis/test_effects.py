"""The across-seed effects report of the RL-effects design (python -m paravt.analysis.effects)."""

import json

import pytest

from paravt.analysis.effects import effects, main, markdown


def _write(run, row, draws):
    """draws: {question: [(score, calls), ...]} as the eval driver's sampled records."""
    p = run / "eval" / row / "image_url"
    p.mkdir(parents=True)
    with open(p / "synthetic.jsonl", "w") as f:
        for q, ds in draws.items():
            for j, (score, calls) in enumerate(ds):
                f.write(json.dumps({"id": f"{q}#s{j}", "score": score, "tool_calls": calls}) + "\n")


def _seed(tmp_path, s, para_k4_call):
    """SFT calls half the time at either K; vanilla never calls; PARA calls at K = 4 with probability
    ``para_k4_call`` and then answers right (otherwise half its draws are right), never at K = 64."""
    run = tmp_path / f"s{s}"
    qs = [f"q{i}" for i in range(10)]
    half = [(1.0, 2), (0.0, 0)]
    _write(run, "sft-K4", {q: half for q in qs})
    _write(run, "sft-K64", {q: half for q in qs})
    _write(run, "vanilla-K4", {q: [(0.0, 0), (0.0, 0)] for q in qs})
    _write(run, "vanilla-K64", {q: [(1.0, 0), (1.0, 0)] for q in qs})
    n_call = int(round(para_k4_call * 10))
    _write(run, "paragrpo-K4", {q: [(1.0, 1), (1.0, 1)] if i < n_call else [(1.0, 0), (0.0, 0)]
                                for i, q in enumerate(qs)})
    _write(run, "paragrpo-K64", {q: [(1.0, 0), (1.0, 0)] for q in qs})
    return run


def test_effects_are_paired_per_question_and_judged_against_the_fixed_criteria(tmp_path):
    runs = [_seed(tmp_path, s, p) for s, p in enumerate((0.8, 0.6, 0.7))]
    res = effects(runs, n_boot=500)
    e = res["effects"]
    assert e["para_vs_vanilla_K4"]["per_seed"] == pytest.approx([90, 80, 85])
    assert e["para_vs_vanilla_K4"]["mean"] == pytest.approx(85)
    assert e["para_vs_sft_K4"]["mean"] == pytest.approx(35)  # +50 on the questions PARA calls on, 0 elsewhere
    assert e["para_vs_vanilla_K64"]["mean"] == pytest.approx(0)
    assert e["gap_sft"]["mean"] == pytest.approx(0) and e["gap_vanilla"]["mean"] == pytest.approx(0)
    assert e["gap_paragrpo"]["mean"] == pytest.approx(70)
    assert 10 < e["gap_paragrpo"]["lo"] < 70 < e["gap_paragrpo"]["hi"] <= 100  # questions resampled too
    assert e["para_vs_sft_K4"]["lo"] > 0
    assert res["checks"] == {"E1": True, "E2_precondition": True, "E2": True}
    assert "**holds**" in markdown(res) and "not an acceptance run" not in markdown(res)


def test_an_effect_that_does_not_appear_is_reported_as_such(tmp_path):
    runs = [_seed(tmp_path, s, 0.1) for s in range(2)]  # PARA calls on 1 of 10 questions at K = 4
    res = effects(runs, n_boot=200)
    assert res["checks"]["E2"] is False and res["effects"]["gap_paragrpo"]["mean"] == pytest.approx(10)
    md = markdown(res)
    assert "E2 (PARA's gap" in md and "**does not hold**" in md and "not an acceptance run" in md


def test_a_missing_cell_or_a_lost_draw_is_one_line_and_a_failing_exit(tmp_path, capsys):
    run = _seed(tmp_path, 0, 0.5)
    with open(run / "eval/sft-K4/image_url/synthetic.jsonl", "a") as f:
        f.write(json.dumps({"id": "q0#s9", "error": "server gone"}) + "\n")
    assert main([str(run), "--n-boot", "50"]) == 1
    assert "1 draw(s) failed" in capsys.readouterr().out
    assert main([str(tmp_path / "nope"), "--n-boot", "50"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope/eval/sft-K4" in err[0]


def test_against_compares_two_designs_seed_by_seed_and_question_by_question(tmp_path, capsys):
    from paravt.analysis.effects import compare

    base = [_seed(tmp_path / "base", s, p) for s, p in enumerate((0.2, 0.3, 0.4))]
    other = [_seed(tmp_path / "other", s, p) for s, p in enumerate((0.8, 0.6, 0.7))]
    res = compare(base, other, n_boot=500)
    e = res["effects"]
    # PARA's K-gap: 70 points against 30 on average, seed by seed +60, +30, +30
    assert e["gap_paragrpo"]["per_seed"] == pytest.approx([60, 30, 30]) and e["gap_paragrpo"]["mean"] == pytest.approx(40)
    assert e["gap_paragrpo"]["lo"] > 0 and e["gap_sft"]["mean"] == pytest.approx(0)
    assert e["paragrpo_K4_call"]["mean"] == pytest.approx(40) and e["vanilla_K64_score"]["mean"] == pytest.approx(0)
    # the questions PARA newly calls on: every draw right instead of half
    assert e["paragrpo_K4_score"]["per_seed"] == pytest.approx([30, 15, 15])
    assert main([str(r) for r in base] + ["--against"] + [str(r) for r in other] + ["--n-boot", "50"]) == 0
    assert "| paragrpo: P(call | 4) − P(call | 64) | +40.0" in capsys.readouterr().out
    # one folder per seed in each design, or one line and exit 2
    assert main([str(r) for r in base] + ["--against", str(other[0]), "--n-boot", "50"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "3 against 1" in err[0]


def test_seeds_of_one_design_run_with_other_settings_stop_the_report(tmp_path, capsys):
    """Within a design the seeds differ in their seed alone; an ablation (--against) may differ from the base."""
    def rl(run, s, lr):
        step = run / "rl_paragrpo" / "checkpoints" / "step_000002"
        (step / "hf").mkdir(parents=True)
        (step / "trainer_state.json").write_text(json.dumps({"config": {"seed": s, "optim": {"lr": lr}}}))
        (run / "rl_paragrpo" / "final").symlink_to(step / "hf")
    base = [_seed(tmp_path / "base", s, 0.5) for s in range(2)]
    other = [_seed(tmp_path / "other", s, 0.5) for s in range(2)]
    for s, run in enumerate(base):
        rl(run, s, 1e-4)
    for s, run in enumerate(other):
        rl(run, s, 2e-4)
    args = [str(r) for r in base] + ["--against"] + [str(r) for r in other] + ["--n-boot", "50"]
    assert main(args) == 0  # the designs differ from each other: that is the ablation
    capsys.readouterr()
    (base[1] / "rl_paragrpo" / "checkpoints" / "step_000002" / "trainer_state.json").write_text(
        json.dumps({"config": {"seed": 1, "optim": {"lr": 5e-4}}}))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "not run with the same settings" in err and "rl_paragrpo optim.lr: s0 0.0001, s1 0.0005" in err
    assert main(args + ["--allow-differing-settings"]) == 0
