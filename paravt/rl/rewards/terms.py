"""PARA-GRPO reward terms as pure functions (REFERENCE §2).

    R = R_acc + format_weight · R_fmt + R_tool          (all terms 0 under the guard)

The scored text is the main agent's turns as the model wrote them: when ``think_prefix`` is on,
each turn's forced ``<think>\\n`` belongs to it (the published code scored only the generated
tokens, which drops the prefix and silently disables the think, anchor, think-before-tool and
balance credits; we score prefix + generated tokens). A completion handed to the CLI is scored
as given.

R_tool decision: the scored text holds only policy-written text, so a ``<tool_response>``
never appears in it and the published 0.3 level does not fire; R_tool is 0 (no parseable
call), 0.1 (a call) or 0.6 (a call and R_acc > 0). With ``credit_executed_tools`` on, an
episode in which at least one call was executed and answered gets the 0.3 base instead of
0.1 (off by default: faithful to the published behaviour).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Callable

from paravt.core.scoring import extract_answer, rule_accuracy, token_f1
from paravt.core.toolcall import parse_tool_calls

SUBSTANTIVE_THINK_CHARS = 10
_THINK_BLOCK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_ANSWER_BODY_RE = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.DOTALL)
_CALL_START_RE = re.compile(r"<tool_call>|<tool_code>|<video_zoom>")
TAG_PAIRS = ("think", "tool_call", "tool_code", "answer")


@dataclass(frozen=True)
class RewardKnobs:
    """The recipe's ``paravt:`` block, flattened (defaults = full PARA-GRPO)."""

    answer_suffix: bool = True
    anchor_weight: float = 0.5
    mode: str = "f1"  # f1 | exact | llm
    format_weight: float = 1.0
    credit_executed_tools: bool = False

    @classmethod
    def vanilla(cls) -> "RewardKnobs":
        return cls(answer_suffix=False, anchor_weight=0.0, format_weight=0.0)


@dataclass
class RewardBreakdown:
    total: float
    acc: float
    format: float
    tool: float
    guarded: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def degenerate(text: str, count: int = 5, window: int = 300) -> bool:
    """The guard: ``count`` or more ``<|im_start|>`` within ``window`` characters (a model
    that role-plays new turns instead of answering)."""
    pos = [m.start() for m in re.finditer(re.escape("<|im_start|>"), text)]
    return any(pos[i + count - 1] - pos[i] < window for i in range(len(pos) - count + 1))


def accuracy(text: str, answer: Any, question_type: str, mode: str = "f1",
             judge: Callable[[str, str], float] | None = None) -> float:
    """R_acc of a scored text; ``llm`` mode asks ``judge(pred, gold)`` for {0, 0.5, 1} and
    falls back to F1 when the judge fails."""
    pred = extract_answer(text)
    if mode == "llm" and question_type not in ("mcq", "tvg"):
        gold = answer if isinstance(answer, str) else str(answer)
        if pred and rule_accuracy(pred, gold, question_type, "exact") == 1.0:
            return 1.0
        if judge is not None:
            try:
                score = float(judge(pred, gold))
                if score in (0.0, 0.5, 1.0):
                    return score
            except Exception:  # noqa: BLE001 - the judge must never block training
                pass
        return token_f1(pred, gold)
    return rule_accuracy(pred, answer, question_type, "f1" if mode == "llm" else mode)


def format_reward(text: str, answer_suffix: bool = True, anchor_weight: float = 0.5) -> float:
    """R_fmt ∈ [0, 1] (REFERENCE §2)."""
    thinks = _THINK_BLOCK_RE.findall(text)
    substantive = any(len(t.strip()) >= SUBSTANTIVE_THINK_CHARS for t in thinks)
    m = _ANSWER_BODY_RE.search(text)
    answer_body = m.group(1).strip() if m else ""
    has_open, has_close = "<answer>" in text, "</answer>" in text
    score = 0.0
    if substantive:
        score += 0.2 if answer_suffix else 0.3
    if answer_body:
        if has_open:
            score += 0.3 if answer_suffix else 0.2
        if has_close:
            score += 0.2 if answer_suffix else 0.1
    if anchor_weight > 0:
        anchor = 0.0
        if substantive:
            anchor += 0.4
            if answer_body and has_open and has_close:
                anchor += 0.3
        if text.count("<think>") > text.count("</think>"):
            anchor -= 0.3
        score += anchor_weight * anchor
    call = _CALL_START_RE.search(text)
    if call and parse_tool_calls(text).calls and "<think>" in text and text.index("<think>") < call.start():
        score += 0.3
    if score > 0 and all(text.count(f"<{t}>") == text.count(f"</{t}>") for t in TAG_PAIRS):
        score += 0.1
    return max(0.0, min(1.0, score))


def tool_reward(text: str, acc: float, executed_tool: bool = False, credit_executed_tools: bool = False) -> float:
    if not parse_tool_calls(text).calls:
        return 0.0
    base = 0.3 if ("<tool_response>" in text or (credit_executed_tools and executed_tool)) else 0.1
    if acc > 0:
        base += 0.5
    return min(1.0, base)


def compute_reward(text: str, answer: Any, question_type: str, knobs: RewardKnobs = RewardKnobs(),
                   judge: Callable[[str, str], float] | None = None, executed_tool: bool = False) -> RewardBreakdown:
    if degenerate(text):
        return RewardBreakdown(0.0, 0.0, 0.0, 0.0, guarded=True)
    acc = accuracy(text, answer, question_type, knobs.mode, judge)
    fmt = format_reward(text, knobs.answer_suffix, knobs.anchor_weight)
    tool = tool_reward(text, acc, executed_tool, knobs.credit_executed_tools)
    return RewardBreakdown(acc + knobs.format_weight * fmt + tool, acc, fmt, tool)
