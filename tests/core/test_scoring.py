import pytest

from paravt.core.scoring import (extract_answer, extract_mcq_letter, extract_span, mcq_correct, normalize_answer,
                                 recall_at, score, temporal_iou, token_f1)


@pytest.mark.parametrize("text,expected", [
    ("<think>\nred\n</think>\n<answer>B</answer>", "B"),
    ("<answer>A</answer> then <answer> C </answer>", "C"),
    ("<think>\nIt is red.\n</think>\nThe answer is red.", "The answer is red."),
    ('<think>x</think>\n<tool_call>\n{"name": "crop_video"}\n</tool_call>\nB', "B"),
    ("<think>x</think>\n<tool_call>{}</tool_call>", "<think>x</think>"),
    ("line one\nfinal line\n<|im_end|>", "final line"),
    ("", ""),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_normalize_and_f1():
    assert normalize_answer("The  Red, circle!") == "red circle"
    assert token_f1("a red circle", "red") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert token_f1("blue", "red") == 0.0
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0


@pytest.mark.parametrize("text,letter", [
    ("B", "B"), ("(B)", "B"), ("B. red", "B"), ("B) red", "B"), ("Option C", "C"), ("option (d)", "D"),
    ("The answer is B", "B"), ("The answer is (A).", "A"), ("Answer: J", "J"), ("I think it's [C]", "C"),
    ("red", None), ("A red circle appears", None), ("", None), ("E", "E"),
])
def test_mcq_letter(text, letter):
    assert extract_mcq_letter(text) == letter


def test_mcq_correct():
    assert mcq_correct("The answer is B", "B") == 1.0
    assert mcq_correct("(C)", "B") == 0.0
    assert mcq_correct("B", "(B) magenta") == 1.0


@pytest.mark.parametrize("text,span", [
    ("[12.5, 18.0]", (12.5, 18.0)), ("<time>3 - 7</time>", (3.0, 7.0)), ("from 00:10 to 00:20", (10.0, 20.0)),
    ("12.0 - 15.5 seconds", (12.0, 15.5)), ("[20, 10]", (10.0, 20.0)), ("no span here", None),
    ("between 1:00:00 - 1:00:05", (3600.0, 3605.0)),
])
def test_extract_span(text, span):
    assert extract_span(text) == span


def test_iou_and_recall():
    assert temporal_iou((0, 10), (5, 15)) == pytest.approx(5 / 15)
    assert temporal_iou((0, 1), (2, 3)) == 0.0
    assert temporal_iou(None, (2, 3)) == 0.0
    assert temporal_iou((2, 3), (2, 3)) == 1.0
    r = recall_at([0.2, 0.35, 0.6, 0.9])
    assert r == {"R@0.3": 0.75, "R@0.5": 0.5, "R@0.7": 0.25}


def test_score_per_type():
    a = lambda x: f"<think>\nchecked the frames\n</think>\n<answer>{x}</answer>"  # noqa: E731
    assert score(a("B"), "B", "mcq").value == 1.0
    assert score(a("Option B"), "B", "mcq").value == 1.0
    assert score(a("C"), "B", "mcq").value == 0.0
    assert score(a("[10, 20]"), "[15.0, 20.0]", "tvg").value == pytest.approx(0.5)
    assert score(a("[10, 20]"), [15, 20], "tvg").value == pytest.approx(0.5)
    assert score(a("The red one"), "red", "oe", "exact").value == 0.0
    assert score(a("the Red!"), "red", "oe", "exact").value == 1.0
    assert score(a("red one"), "red", "oe", "f1").value == pytest.approx(2 / 3)
    assert score(a("red one"), "red", "oe", "llm", judge=lambda p, g: 0.5).value == 0.5
    assert score(a("red one"), "red", "oe", "llm", judge=lambda p, g: 1 / 0).value == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="question_type"):
        score("x", "y", "essay")
    with pytest.raises(ValueError, match="mode"):
        score("x", "y", "oe", "bleu")
