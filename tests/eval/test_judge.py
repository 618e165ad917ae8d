"""The optional MCQ judge fallback: consulted only when the strict scorer reads no letter, reported
beside the strict accuracy, never in place of it; a failing judge changes nothing strict."""

import pytest

from paravt.core.config import load_config
from paravt.eval.config import EvalConfig
from paravt.eval.driver import Evaluator
from paravt.eval.summary import summarize
from paravt.eval.judge import MCQJudgeConfig, parse_judge_letter

# replies an instruction-tuned judge gives to "which option does the reply choose?"
JUDGE_REPLIES = [
    ("B", "B"), ("B.", "B"), ("(C)", "C"), ("Option D", "D"), ("Answer: A", "A"), ("a", "A"),
    ("<think>The reply says the car is blue, which is option B.</think>\nB", "B"),
    ("The reply chooses C.", "C"), ("C) red", "C"), ("NONE", None), ("None of the options.", None),
    ("none", None),
    # letters only as letters: the article and the pronoun are words
    ("A reply that picks C", "C"), ("I think B", "B"), ("I think the reply picks D.", "D"),
    ("Option A is right", "A"), ("A) blue", "A"), ("The answer is A because the car is red.", "A"),
    ("The reply. A good one picks D", "D"), ("(a)", "A"),
    # more than one option named: NONE, as the judge's prompt says
    ("B or C", None), ("The answer could be B or C", None), ("It picks A and not B", None),
]


@pytest.mark.parametrize("reply,letter", JUDGE_REPLIES)
def test_judge_verdicts_are_read(reply, letter):
    assert parse_judge_letter(reply, "ABCD") == letter


@pytest.mark.parametrize("reply", ["", "I cannot tell from the reply.", "E", "Option F", "A reply without a choice"])
def test_unusable_verdicts_raise(reply):
    with pytest.raises(ValueError, match="names no option"):
        parse_judge_letter(reply, "ABCD")


def test_summary_keeps_the_strict_accuracy_and_reports_the_judged_one_beside_it():
    base = {"question_type": "mcq", "tool_calls": 0, "score": 0.0}
    recs = [{**base, "id": "1", "correct": 1.0, "score": 1.0}, {**base, "id": "2", "correct": 0.0},
            {**base, "id": "3", "correct": 0.0, "judge_pred": "B", "judge_correct": 1.0},
            {**base, "id": "4", "correct": 0.0, "judge_pred": "", "judge_correct": 0.0},
            {**base, "id": "5", "correct": 0.0, "judge_error": "RuntimeError: judge request failed"}]
    s = summarize(recs)
    assert s["accuracy"] == 0.2 and s["accuracy_with_judge"] == 0.4
    assert s["judge"] == {"consulted": 3, "chose_letter": 1, "chose_none": 1, "errors": 1}
    assert "accuracy_with_judge" not in summarize(recs[:2])


def test_judge_config_is_checked():
    with pytest.raises(ValueError, match="mcq_judge.model"):
        MCQJudgeConfig(base_url="http://x/v1")
    with pytest.raises(ValueError, match="mcq_judge.model"):
        load_config(EvalConfig, None, ["model=m", "mcq_judge.base_url=http://127.0.0.1:1/v1"])


def test_the_judge_on_a_real_server_never_changes_the_strict_score(world, tiny_dir, tmp_path):
    """Our OpenAI-compatible server with the tiny model as the judge (its verdicts are poor, which
    is the point): every no-letter reply is sent to it, each outcome counted, strict records equal."""
    from paravt.engines.backends import start_hf_server
    args = [f"model={tiny_dir}", f"split_paths={{synthetic: {world / 'local'}}}", "max_new_tokens=12",
            "progress=false", "limit=9", "nframes=4", "prompt_mode=direct"]
    plain = Evaluator(load_config(EvalConfig, None, args + [f"out={tmp_path}/plain"])).run()["synthetic"]
    proc, url = start_hf_server(str(tiny_dir))
    try:
        judged = Evaluator(load_config(EvalConfig, None, args + [f"out={tmp_path}/judged", f"mcq_judge.base_url={url}",
                                                                 "mcq_judge.model=paravt"])).run()["synthetic"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    import json
    recs = [json.loads(ln) for ln in (tmp_path / "judged/model/image_url/synthetic.jsonl").read_text().splitlines()]
    plain_recs = {r["id"]: r for r in map(json.loads, (tmp_path / "plain/model/image_url/synthetic.jsonl").read_text().splitlines())}
    from paravt.core.scoring import extract_mcq_letter
    no_letter = [r for r in recs if r["question_type"] == "mcq" and extract_mcq_letter(r["pred"] or "") is None]
    assert no_letter, "the tiny model answered every MCQ with a letter: nothing to judge"
    assert all(("judge_pred" in r) != ("judge_error" in r) for r in no_letter)
    # every request reached the judge and got a reply; what it wrote is read or counted unusable
    assert all("request failed" not in r.get("judge_error", "") for r in no_letter), no_letter
    assert not any("judge_pred" in r or "judge_error" in r for r in recs if r not in no_letter)
    j = judged["judge"]
    assert j["consulted"] == len(no_letter) == j["chose_letter"] + j["chose_none"] + j["errors"]
    assert judged["accuracy"] == plain["accuracy"]  # strict: the same with and without a judge
    assert [(r["id"], r["pred"], r["score"]) for r in recs] == [(r["id"], plain_recs[r["id"]]["pred"],
                                                                 plain_recs[r["id"]]["score"]) for r in recs]
    # accuracy_with_judge = strict correct + judge-correct among the no-letter replies, recomputed
    n_cls = sum(r["question_type"] != "tvg" for r in recs)
    assert judged["accuracy_with_judge"] == pytest.approx(
        sum(r["correct"] or r.get("judge_correct", 0.0) for r in recs if r["question_type"] != "tvg") / n_cls)
