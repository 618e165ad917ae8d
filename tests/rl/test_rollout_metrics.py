"""Rollout metrics: format compliance per episode, per turn and per K, beside the tool rates by K."""

from __future__ import annotations

from types import SimpleNamespace

from paravt.agent.tools import CropVideo, call_parser
from paravt.rl.rollout import rollout_metrics

PARSER = call_parser([CropVideo])

GOOD_CALL = '<think>\nlook closer\n</think>\n<tool_call>\n{"name": "crop_video", "arguments": {"start_time": 0, "end_time": 5}}\n</tool_call>'
GOOD_ANSWER = "<think>\nit is red\n</think>\n<answer>red</answer>"
BAD = "red"  # no think block: not compliant


def _traj(*texts, calls=0):
    turns = [SimpleNamespace(text=t, calls=[]) for t in texts]
    stats = {"tool_calls": calls, "parse_errors": 0, "tool_turns_used": 0, "generated_tokens": 10}
    return SimpleNamespace(turns=turns, stats=stats, end_reason="answer")


def test_compliance_per_episode_turn_and_k():
    trajs = [_traj(GOOD_CALL, GOOD_ANSWER, calls=1), _traj(GOOD_CALL, BAD, calls=1), _traj(GOOD_ANSWER), _traj(BAD)]
    rewards = [SimpleNamespace(total=0.0, acc=0.0, format=0.0, tool=0.0, guarded=0.0)] * 4
    m = rollout_metrics(trajs, rewards, [4, 4, 64, 64], 0.0, PARSER)
    assert m["format/compliance"] == 0.5  # episodes 1 and 3
    assert m["format/turn_compliance"] == 4 / 6  # one bad turn in a two-turn episode, one in a one-turn one
    assert m["format_by_K/compliance_K4"] == 0.5 and m["format_by_K/compliance_K64"] == 0.5
    assert m["tools_by_K/call_frequency_K4"] == 1.0 and m["tools_by_K/call_frequency_K64"] == 0.0


def test_the_payoff_of_calling_per_k():
    """reward of the episodes that called minus those that skipped, per K, only where both were sampled"""
    trajs = [_traj(GOOD_CALL, GOOD_ANSWER, calls=1), _traj(GOOD_ANSWER), _traj(GOOD_ANSWER), _traj(GOOD_ANSWER)]
    r = [SimpleNamespace(total=t, acc=0.0, format=0.0, tool=0.0, guarded=0.0) for t in (2.0, 0.5, 1.0, 1.5)]
    m = rollout_metrics(trajs, r, [4, 4, 64, 64], 0.0, PARSER)
    assert m["tools_by_K/call_payoff_K4"] == 1.5
    assert "tools_by_K/call_payoff_K64" not in m  # nobody called at K = 64
