"""Replies of models outside our training format, read as a careful human would (the shared scorer,
:func:`paravt.core.scoring.score`, used by eval and by the RL reward's ``rules: paravt``). Written
fresh for this project: shapes seen from chatty instruction-tuned video models."""

from __future__ import annotations

import pytest

from paravt.core.scoring import score

# (reply, gold letter, correct?)
MCQ = [
    ("<answer>B</answer>", "B", 1), ("<answer>b</answer>", "B", 1), ("<answer>(C)</answer>", "C", 1),
    ("<answer> d. </answer>", "D", 1), ("B", "B", 1), ("(A)", "A", 1), ("C.", "C", 1),
    ("B) The man opens the door.", "B", 1), ("The answer is D.", "D", 1), ("The answer is (A).", "A", 1),
    ("Answer: C", "C", 1), ("answer: Option E", "E", 1), ("Option B is correct.", "B", 1),
    ("I would go with option c.", "C", 1), ("Based on the frames, B.", "B", 1),
    ("Looking at the sequence of events, the best choice is C.", "C", 1),
    ("After reviewing the clip, I pick D!", "D", 1), ("So it must be A", "A", 1),
    ("The correct option is (E) because the cup falls.", "E", 1),
    ("<think>the woman leaves first</think>\nThe answer is B", "B", 1),
    ("<think>hmm</think><answer>The answer is C</answer>", "C", 1),
    ("Considering the subtitles and frames: A.", "A", 1), ("My final answer: (D)", "D", 1),
    ("I think the answer is F.", "F", 1), ("[J]", "J", 1),
    ("I am not sure what happens in the video.", "A", 0),  # the pronoun I is not option I
    ("I cannot determine this from the frames.", "I", 0),
    ("I think the video shows a kitchen.", "I", 0),
    ("The answer is a red car.", "A", 0),  # the article a is not option A
    ("There is a dog and a cat.", "A", 0),
    ("None of the options match.", "B", 0), ("", "B", 0), ("<answer></answer>", "B", 0),
    ("The answer is B.", "C", 0), ("Option D", "A", 0), ("Based on the frames, C.", "B", 0),
    ("<answer>e</answer>", "D", 0), ("It could be A or B.", "A", 0),
    ("The man in the video walks away.", "A", 0), ("Sorry, I can't watch videos.", "I", 0),
]

# (reply, gold span, expected IoU)
TVG = [
    ("<answer>12.0 - 18.0 seconds</answer>", [12, 18], 1.0), ("[12.0, 18.0]", [12, 18], 1.0),
    ("12 - 18 seconds", [12, 18], 1.0), ("12s to 18s", [12, 18], 1.0), ("from 12 to 18", [12, 18], 1.0),
    ("The event occurs from 12.0 seconds to 18.0 seconds.", [12, 18], 1.0),
    ("It starts at 12 and ends at 18 seconds.", [12, 18], 1.0),
    ("The action starts at 12.0s and ends at 18.0s.", [12, 18], 1.0),
    ("start time: 12.0, end time: 18.0", [12, 18], 1.0), ("Start: 12, End: 18", [12, 18], 1.0),
    ("start_time = 12 end_time = 18", [12, 18], 1.0),
    ("The person opens the fridge between 12 and 18 seconds.", [12, 18], 1.0),
    ("It happens between 12.0 and 18.0 s.", [12, 18], 1.0),
    ("00:12 - 00:18", [12, 18], 1.0), ("From 0:12 to 0:18.", [12, 18], 1.0),
    ("between 00:00:12 and 00:00:18", [12, 18], 1.0), ("<time>12 - 18</time>", [12, 18], 1.0),
    ("18 - 12 seconds", [12, 18], 1.0),  # reversed pair reordered
    ("starting at 01:05, ending at 01:15", [65, 75], 1.0),
    ("The moment begins at about 65 seconds and ends around 75 seconds.", [65, 75], 0.0),  # no "start/end": not read
    ("<think>look at 10-20</think><answer>12 - 18 seconds</answer>", [12, 18], 1.0),
    ("<think>I think so</think>\nFrom 12 to 18.", [12, 18], 1.0),
    ("12.0 - 15.0 seconds", [12, 18], 0.5), ("[15, 21]", [12, 18], 3 / 9),
    ("It starts at 0 and ends at 6 seconds.", [12, 18], 0.0), ("between 20 and 30 seconds", [12, 18], 0.0),
    ("00:10 - 00:20", [12, 18], 0.6), ("from 14 to 16", [12, 18], 1 / 3),
    ("start time: 9, end time: 15", [12, 18], 3 / 9), ("[12, 24]", [12, 18], 0.5),
    ("I can't tell when it happens.", [12, 18], 0.0), ("", [12, 18], 0.0), ("<answer></answer>", [12, 18], 0.0),
    ("The event is at 15 seconds.", [12, 18], 0.0), ("Around the middle of the video.", [12, 18], 0.0),
    ("No such event is visible.", [12, 18], 0.0), ("<answer>unknown</answer>", [12, 18], 0.0),
    ("from 12 to", [12, 18], 0.0), ("starts at 12", [12, 18], 0.0), ("ends at 18", [12, 18], 0.0),
]

# (reply, gold, lowest and highest acceptable score with mode f1)
OE = [
    ("<answer>yellow</answer>", "yellow", 1, 1), ("<answer>Yellow.</answer>", "yellow", 1, 1),
    ("<answer>The yellow</answer>", "yellow", 1, 1), ("yellow", "yellow", 1, 1), ("Yellow!", "yellow", 1, 1),
    ("<answer>a red circle</answer>", "red circle", 1, 1), ("<answer>RED CIRCLE</answer>", "red circle", 1, 1),
    ("<think>colour?</think>\nyellow", "yellow", 1, 1), ("<think>it is blue</think><answer>blue</answer>", "blue", 1, 1),
    ("<answer>three</answer>", "three", 1, 1), ("<answer>3</answer>", "3", 1, 1),
    ("<answer>the man opens the door</answer>", "man opens door", 1, 1),
    ("The circle is yellow.", "yellow", 0.3, 0.7), ("It is yellow", "yellow", 0.3, 0.7),
    ("<answer>yellow circle</answer>", "yellow", 0.5, 0.7), ("<answer>light yellow</answer>", "yellow", 0.5, 0.7),
    ("<answer>a dog runs</answer>", "dog runs fast", 0.7, 0.9), ("<answer>kitchen</answer>", "in the kitchen", 0.6, 0.7),
    ("The woman is cooking in the kitchen.", "kitchen", 0.2, 0.4), ("The square turns red.", "red", 0.3, 0.5),
    ("<answer>green</answer>", "yellow", 0, 0), ("<answer>blue square</answer>", "red circle", 0, 0),
    ("I don't know.", "yellow", 0, 0), ("", "yellow", 0, 0), ("<answer></answer>", "yellow", 0, 0),
    ("<answer>no</answer>", "yes", 0, 0), ("<answer>yes</answer>", "yes", 1, 1), ("Yes.", "yes", 1, 1),
    ("<answer>two</answer>", "three", 0, 0), ("<answer>2</answer>", "3", 0, 0),
    ("<answer>the cat</answer>", "cat", 1, 1), ("<answer>an apple</answer>", "apple", 1, 1),
    ("<answer>opening the door</answer>", "opens door", 0.3, 0.6), ("<answer>red, then blue</answer>", "red then blue", 1, 1),
    ("<answer>Red then blue.</answer>", "red then blue", 1, 1), ("<answer>blue then red</answer>", "red then blue", 1, 1),
    ("The answer: purple", "purple", 0.5, 0.7), ("<answer>purple-ish</answer>", "purple", 0, 0),
    ("<answer>circle</answer>", "circle", 1, 1), ("<answer>a triangle</answer>", "triangle", 1, 1),
]


@pytest.mark.parametrize("reply,gold,correct", MCQ, ids=[f"mcq{i}" for i in range(len(MCQ))])
def test_mcq_replies(reply, gold, correct):
    assert score(reply, gold, "mcq").value == correct, score(reply, gold, "mcq")


@pytest.mark.parametrize("reply,gold,iou", TVG, ids=[f"tvg{i}" for i in range(len(TVG))])
def test_tvg_replies(reply, gold, iou):
    assert score(reply, gold, "tvg").value == pytest.approx(iou), score(reply, gold, "tvg")


@pytest.mark.parametrize("reply,gold,lo,hi", OE, ids=[f"oe{i}" for i in range(len(OE))])
def test_open_ended_replies(reply, gold, lo, hi):
    assert lo <= score(reply, gold, "oe", "f1").value <= hi, score(reply, gold, "oe", "f1")


def test_each_corpus_holds_both_outcomes_and_no_repeats():
    """A corpus where every reply scores the same cannot tell a scorer that always says yes (or no) from
    a right one: each holds right and wrong replies, partial overlaps for tvg / oe, and no reply twice."""
    assert sum(c for _, _, c in MCQ) >= 10 and sum(1 - c for _, _, c in MCQ) >= 10
    ious = [i for _, _, i in TVG]
    assert ious.count(1.0) >= 5 and ious.count(0.0) >= 5 and sum(0 < i < 1 for i in ious) >= 5
    assert sum(lo == hi == 1 for _, _, lo, hi in OE) >= 5 and sum(hi == 0 for _, _, lo, hi in OE) >= 3
    assert sum(0 < hi < 1 or 0 < lo < 1 for _, _, lo, hi in OE) >= 5
    for corpus in (MCQ, TVG, OE):
        keys = [(r, str(g)) for r, g, *_ in corpus]
        assert len(keys) == len(set(keys))
