"""One scoring path: the RL reward (rules=paravt) and the eval driver score a completion alike, and
format compliance is one function for both. Completions are shaped like real model outputs."""

import pytest

from paravt.agent.tools import CropVideo, call_parser
from paravt.core.scoring import episode_well_formed, score
from paravt.eval.sample import BenchmarkItem
from paravt.eval.summary import score as eval_score
from paravt.rl.rewards.terms import RewardKnobs, compute_reward

CASES = [
    ("mcq", "B", "<think>\nThe circle is red, option B.\n</think>\n<answer>B</answer>"),
    ("mcq", "B", "<think>\nThe circle is red.\n</think>\n<answer>(B) red</answer>"),
    ("mcq", "C", "<think>\nI think it is B.\n</think>\n<answer>The answer is B</answer>"),
    ("mcq", "A", "<think>\nUnsure.\n</think>\nOption A"),
    ("mcq", "A", "<think>\nlooking"),  # unclosed, no answer
    ("oe", "red", "<think>\nIt is red.\n</think>\n<answer>red</answer>"),
    ("oe", "red", "<think>\nIt is red.\n</think>\n<answer>a red circle</answer>"),
    ("oe", "green", "<think>\nhmm\n</think>\nThe square is green."),
    ("oe", "blue", "<answer>blue"),  # unclosed answer
    ("tvg", "[12.0, 15.5]", "<think>\nVisible from 12.0 to 15.0 seconds.\n</think>\n<answer>[12.0, 15.0]</answer>"),
    ("tvg", "[12.0, 15.5]", "<think>\nIt appears at 00:12.\n</think>\n<answer>from 00:12 to 00:16</answer>"),
    ("tvg", "[40.0, 43.0]", "<think>\nnear 41 s\n</think>\n<answer>around forty</answer>\nso 40.5 - 42.0 seconds"),
    ("tvg", "[40.0, 43.0]", "<think>\nThe event is at 40 - 43 s.\n</think>\n<tool_call>\n{\"name\": \"crop_video\"}\n</tool_call>"),
    ("tvg", "[1.0, 2.0]", ""),
]
PARSER = call_parser([CropVideo])  # the recipes' one tool: how both read a turn's calls


@pytest.mark.parametrize("qtype,gold,text", CASES)
def test_rl_and_eval_score_a_completion_alike(qtype, gold, text):
    knobs = RewardKnobs(rules="paravt")
    rl = compute_reward(text, gold, qtype, knobs, parser=PARSER).acc if text.count("<|im_start|>") < 5 else 0.0
    sample = BenchmarkItem(id="q", split="synthetic", video="v.mp4", question="?", answer=gold, question_type=qtype)
    ev = eval_score(sample, text)["score"]
    assert rl == pytest.approx(ev) == pytest.approx(score(text, gold, qtype).value)


def test_answers_are_found_where_the_model_writes_them():
    assert score(CASES[1][2], "B", "mcq").value == 1.0
    assert score(CASES[2][2], "C", "mcq").value == 0.0
    assert score(CASES[10][2], "[12.0, 15.5]", "tvg").value == pytest.approx(3.5 / 4.0)
    assert score(CASES[11][2], "[40.0, 43.0]", "tvg").span == (40.5, 42.0)  # span after </think>, outside the answer


def test_format_compliance_is_one_function():
    assert episode_well_formed([CASES[0][2]], PARSER) and not episode_well_formed([CASES[4][2]], PARSER)
    assert not episode_well_formed([], PARSER)
