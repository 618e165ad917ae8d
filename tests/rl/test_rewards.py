"""Reward terms: our rules (``rules: paravt``) against cases computed by hand; the release's rules
(``rules: release``, the 8B recipes' default) against the authors' released compose_reward on
hand-written cases (tests/rl/data/release_reward_cases.jsonl; expected values produced by running
the release's paravt/rl/rewards/compose.py with each recipe's paravt: block as its env vars)."""

import json
import subprocess
import sys

import pytest

from functools import partial
from pathlib import Path

from paravt.agent.tools import CropVideo, call_parser
from paravt.rl.rewards.terms import RewardKnobs, degenerate
from paravt.rl.rewards.terms import accuracy as _accuracy
from paravt.rl.rewards.terms import compute_reward as _compute_reward
from paravt.rl.rewards.terms import format_reward as _format_reward
from paravt.rl.rewards.terms import tool_reward as _tool_reward_of

PARSER = call_parser([CropVideo])  # the recipes' one tool: rules paravt read calls with it
compute_reward = partial(_compute_reward, parser=PARSER)
format_reward = partial(_format_reward, parser=PARSER)
_tool_reward = partial(_tool_reward_of, parser=PARSER)

CASES = [json.loads(x) for x in (Path(__file__).parent / "data/release_reward_cases.jsonl").read_text().splitlines()]

CALL = '<tool_call>\n{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 0, "end_time": 30}}\n</tool_call>'
DIRECT = "<think>\nThe circle is red in the overview.\n</think>\n<answer>B</answer>"
TOOL_ONLY = "<think>\nNot visible, checking two windows.\n</think>\n" + CALL
MULTI = TOOL_ONLY + "\n" + "<think>\nThe circle is red.\n</think>\n<answer>B</answer>"
K = partial(RewardKnobs, rules="paravt")
PARA = K()
VANILLA = K(answer_suffix=False, anchor_weight=0.0, format_weight=0.0)  # outcome-only (the tiny baseline)


@pytest.mark.parametrize("text,knobs,expected", [
    # answer_suffix on, anchor 0.5: 0.2 + 0.3 + 0.2 + 0.5*(0.4+0.3) + 0.1 = 1.15 -> cap 1
    (DIRECT, PARA, 1.0),
    # answer_suffix off, anchor off: 0.3 + 0.2 + 0.1 + 0.1 (balanced) = 0.7
    (DIRECT, K(answer_suffix=False, anchor_weight=0.0), 0.7),
    # answer_suffix on, anchor off: 0.2 + 0.3 + 0.2 + 0.1 = 0.8
    (DIRECT, K(anchor_weight=0.0), 0.8),
    # tool turn, PARA: 0.2 + 0.5*0.4 + 0.3 (think before call) + 0.1 = 0.8
    (TOOL_ONLY, PARA, 0.8),
    # tool turn, vanilla shape: 0.3 + 0.3 + 0.1 = 0.7
    (TOOL_ONLY, K(answer_suffix=False, anchor_weight=0.0), 0.7),
    # unclosed think: 0.5 * (-0.3) -> clipped at 0
    ("<think>\nI think it is red but", PARA, 0.0),
    # the published bug: scoring without the forced "<think>\n" loses think/anchor/balance credit
    ("The circle is red in the overview.\n</think>\n<answer>B</answer>", PARA, 0.5),
    # empty answer body earns nothing for the answer tags: 0.2 + 0.5*0.4 + 0.1
    ("<think>\nThe circle is red here.\n</think>\n<answer> </answer>", PARA, 0.5),
    # a short think (< 10 chars) is not substantive: answer 0.5 + 0.1 balanced, no anchor
    ("<think>\nred\n</think>\n<answer>B</answer>", PARA, 0.6),
])
def test_format_reward(text, knobs, expected):
    assert format_reward(text, knobs.answer_suffix, knobs.anchor_weight, knobs.rules) == pytest.approx(expected)


def test_compose_direct_multiturn_and_tool_only():
    r = compute_reward(DIRECT, "B", "mcq", PARA)
    assert (r.acc, r.format, r.tool, r.total) == (1.0, 1.0, 0.0, 2.0)
    r = compute_reward(MULTI, "B", "mcq", PARA)  # cap 1 on format, tool 0.1 + 0.5
    assert (r.acc, r.format, r.tool) == (1.0, 1.0, pytest.approx(0.6)) and r.total == pytest.approx(2.6)
    r = compute_reward(TOOL_ONLY, "B", "mcq", PARA)  # no answer: acc 0, tool 0.1
    assert (r.acc, r.tool) == (0.0, pytest.approx(0.1)) and r.total == pytest.approx(0.9)
    r = compute_reward(MULTI, "B", "mcq", VANILLA)  # vanilla: format weight 0
    assert r.total == pytest.approx(1.6) and r.format == pytest.approx(1.0)  # 0.3+0.2+0.1+0.3 think-before-call+0.1


def test_tool_reward_levels():
    tool_reward = partial(_tool_reward, rules="paravt")
    assert tool_reward(DIRECT, 1.0) == 0.0
    assert tool_reward(TOOL_ONLY, 0.0) == pytest.approx(0.1)
    assert tool_reward(TOOL_ONLY, 0.4) == pytest.approx(0.6)
    assert tool_reward(TOOL_ONLY + "<tool_response>\nx\n</tool_response>", 0.0) == pytest.approx(0.3)
    assert tool_reward(TOOL_ONLY, 1.0, executed_tool=True, credit_executed_tools=True) == pytest.approx(0.8)
    assert tool_reward(TOOL_ONLY, 1.0, executed_tool=True) == pytest.approx(0.6)  # off by default
    assert tool_reward("<think>x</think><tool_call>{broken</tool_call>", 1.0) == 0.0


def test_tool_weight_scales_only_the_tool_term_and_is_read_from_the_recipe(tmp_path):
    """tool_weight 0 pays a call only through accuracy and format: the same correct answer earns the
    same total with or without the call under the outcome-only reward, and 0.6 more with weight 1."""
    plain, called = "<think>\nThe circle is red.\n</think>\n<answer>B</answer>", MULTI
    on, off = VANILLA, K(answer_suffix=False, anchor_weight=0.0, format_weight=0.0, tool_weight=0.0)
    assert compute_reward(called, "B", "mcq", on).total - compute_reward(plain, "B", "mcq", on).total == pytest.approx(0.6)
    r = compute_reward(called, "B", "mcq", off)
    assert (r.total, r.tool) == (pytest.approx(compute_reward(plain, "B", "mcq", off).total), pytest.approx(0.6))
    with pytest.raises(ValueError, match="tool_weight"):
        K(tool_weight=-1.0)
    from paravt.rl.rewards.__main__ import knobs_from_recipe
    assert knobs_from_recipe("configs/rl/paragrpo_8b.yaml").tool_weight == 1.0  # the release
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text(json.dumps({"completion": called, "answer": "B", "question_type": "mcq"}) + "\n")
    out = subprocess.run([sys.executable, "-m", "paravt.rl.rewards", "--recipe", "configs/rl/tiny_vanilla.yaml",
                          "--jsonl", str(jsonl), "--tool-weight", "0"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["total"] == pytest.approx(1.0)  # R_acc only


def test_accuracy_per_question_type():
    accuracy = partial(_accuracy, rules="paravt")
    tvg = "<think>\nSeen from 35 to 39 seconds.\n</think>\n<answer>[35.0, 39.0]</answer>"
    assert accuracy(tvg, "[36.0, 40.0]", "tvg") == pytest.approx(0.6)
    assert compute_reward(tvg, "[36.0, 40.0]", "tvg", PARA).total == pytest.approx(1.6)
    assert accuracy("<answer>The answer is (C)</answer>", "C", "mcq") == 1.0
    assert accuracy("<answer>the Red.</answer>", "red", "oe", "exact") == 1.0
    assert accuracy("<answer>red circle</answer>", "red", "oe", "exact") == 0.0
    assert accuracy("<answer>red circle</answer>", "red", "oe", "f1") == pytest.approx(2 / 3)
    # unclosed think: the last plain line is the answer; F1 with 'red' = 2/7
    r = compute_reward("<think>\nI think it is red but", "red", "oe", PARA)
    assert r.acc == pytest.approx(2 / 7) and r.format == 0.0 and r.total == pytest.approx(2 / 7)


@pytest.mark.parametrize("rules", ["paravt", "release"])
def test_llm_mode_uses_the_judge_and_falls_back_to_f1(rules):
    accuracy = partial(_accuracy, rules=rules)
    text = "<answer>a crimson circle</answer>"
    assert accuracy(text, "red circle", "oe", "llm", judge=lambda p, g: 1.0) == 1.0
    def broken(p, g):
        raise TimeoutError("judge down")
    assert accuracy(text, "red circle", "oe", "llm", judge=broken) == pytest.approx(0.5)  # F1 of "crimson circle" vs "red circle"
    assert accuracy(text, "red circle", "oe", "llm", judge=lambda p, g: 7) == pytest.approx(0.5)  # invalid score
    assert accuracy("<answer>B</answer>", "B", "mcq", "llm", judge=broken) == 1.0  # mcq never asks the judge


def test_guard():
    spam = "<|im_start|>user\nhi<|im_end|>\n" * 5
    assert degenerate(spam) and not degenerate(DIRECT)
    assert degenerate(spam, rules="paravt")
    assert not degenerate(("<|im_start|>" + "x" * 100) * 5, rules="paravt")  # five, but spread over > 300 characters
    # the release: five anywhere, but only in a text shorter than 300 characters
    long_spam = "y" * 400 + "<|im_start|>a" * 5
    assert degenerate(long_spam, rules="paravt") and not degenerate(long_spam)
    r = compute_reward(spam + "<answer>B</answer>", "B", "mcq", PARA)
    assert r.guarded and r.total == r.acc == r.format == r.tool == 0.0


def _cli(capsys, *args) -> subprocess.CompletedProcess:
    """``python -m paravt.rl.rewards ARGS`` run in this process (its ``main``): the interpreter's start-up
    (torch, transformers) costs ~4 s a call; one test below runs the real ``python -m`` once."""
    from paravt.rl.rewards.__main__ import main

    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def test_cli(tmp_path, capsys):
    lines = [{"completion": DIRECT, "answer": "B", "question_type": "mcq"},
             {"completion": TOOL_ONLY, "answer": "B", "question_type": "mcq"}]
    f = tmp_path / "in.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    real = subprocess.run([sys.executable, "-m", "paravt.rl.rewards", "--jsonl", str(f), "--recipe",
                           "configs/rl/paragrpo_8b.yaml"], capture_output=True, text=True)
    run = lambda *a: _cli(capsys, "--jsonl", str(f), *a)
    r = run("--recipe", "configs/rl/paragrpo_8b.yaml")
    assert (real.returncode, real.stdout) == (r.returncode, r.stdout), real.stderr
    assert r.returncode == 0, r.stderr
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert out[0] == {"total": 2.0, "acc": 1.0, "format": 1.0, "tool": 0.0}
    assert out[1]["total"] == pytest.approx(0.9)
    r = run("--recipe", "configs/rl/vanilla_grpo_8b.yaml")
    assert [json.loads(x)["total"] for x in r.stdout.splitlines()] == [pytest.approx(1.7), pytest.approx(0.8)]
    r = run("--recipe", "configs/rl/paragrpo_8b.yaml", "--anchor-weight", "0", "--no-answer-suffix")
    assert json.loads(r.stdout.splitlines()[0])["format"] == pytest.approx(0.7)
    f.write_text("not json\n" + json.dumps(lines[0]) + "\n")
    r = run()
    assert r.returncode == 1 and "line 1" in r.stdout.splitlines()[0] and json.loads(r.stdout.splitlines()[1])["total"] == 2.0


@pytest.mark.parametrize("recipe", ["paragrpo_8b", "vanilla_grpo_8b"])
def test_release_rules_reproduce_the_authors_reward(recipe, tmp_path, capsys):
    """Every term of every hand-written case equals the authors' compose_reward, through the CLI
    under the 8B recipe (guard, unclosed tags, think->tool, answer extraction, tool detection)."""
    f = tmp_path / "cases.jsonl"
    f.write_text("".join(json.dumps({k: c[k] for k in ("completion", "answer", "question_type")}) + "\n" for c in CASES))
    r = _cli(capsys, "--recipe", f"configs/rl/{recipe}.yaml", "--jsonl", str(f))
    assert r.returncode == 0, r.stderr
    got = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(got) == len(CASES) == 40
    bad = [(c["name"], t, g[t], c["expected"][recipe][t]) for c, g in zip(CASES, got)
           for t in ("total", "acc", "format", "tool") if g[t] != pytest.approx(c["expected"][recipe][t], abs=1e-9)]
    assert not bad


def test_our_rules_are_an_opt_in_that_differs_where_documented():
    """rules=paravt departs from the release on exactly the documented points."""
    ours = {c["name"]: compute_reward(c["completion"], c["answer"], c["question_type"], K()) for c in CASES}
    exp = {c["name"]: c["expected"]["paragrpo_8b"] for c in CASES}
    assert ours["tvg clock"].acc > 0 == exp["tvg clock"]["acc"]  # MM:SS spans
    assert ours["tvg reversed"].acc > 0 == exp["tvg reversed"]["acc"]  # reversed pair reordered
    assert ours["unclosed answer"].format > exp["unclosed answer"]["format"]  # open tag credited
    assert ours["five im_start in a 300-char window of a long text"].guarded  # windowed guard
    assert ours["unclosed think short"].format == 0.0 > exp["unclosed think short"]["format"]  # clamped at 0
    assert ours["mcq fifth option"].acc == 1.0 == exp["mcq fifth option"]["acc"]  # exact match first (both)
    mcq_e = compute_reward("<think>\nThe fifth option fits.\n</think>\n<answer>Option E</answer>", "E", "mcq", K())
    rel_e = compute_reward("<think>\nThe fifth option fits.\n</think>\n<answer>Option E</answer>", "E", "mcq")
    assert (mcq_e.acc, rel_e.acc) == (1.0, 0.0)  # the release knows letters A-D only


def test_vanilla_recipe_keeps_the_format_weight_as_released():
    from paravt.rl.rewards.__main__ import knobs_from_recipe
    k = knobs_from_recipe("configs/rl/vanilla_grpo_8b.yaml")
    assert (k.format_weight, k.anchor_weight, k.answer_suffix, k.rules) == (1.0, 0.0, False, "release")
    assert RewardKnobs.vanilla().format_weight == 1.0
