"""PARA-GRPO reward terms as pure functions (the paper's §3 reward; the release's compose_reward).

    R = R_acc + format_weight · R_fmt + tool_weight · R_tool          (all terms 0 under the guard)

Two rule sets (``paravt.reward.rules``):

* ``release`` (default, the 8B recipes): the authors' released reward, term for term: the guard
  fires on ≥5 ``<|im_start|>`` in a text shorter than 300 characters; a substantive think may
  be unclosed; answer-tag credit needs a closed non-empty pair; think→tool needs a substantive
  think; the format term is not clamped below 0; answers are matched with
  :func:`paravt.core.scoring.release_accuracy` and tool calls detected with
  :func:`paravt.core.toolcall.release_has_tool_call`.
* ``paravt`` (opt-in; the tiny recipes, whose quickstart numbers were measured with it): the
  guard is "5 ``<|im_start|>`` within any 300 characters" (a long degenerate text is still
  caught), only closed thinks count, an unclosed ``<answer>x`` earns the open-tag credit, the
  think→tool credit checks tag order only, and answers use the eval scorer (letters A-J, MM:SS
  spans), so training and eval score one completion alike; tool calls are read by the parser of
  the recipe's tools (``parser``: :func:`paravt.agent.tools.call_parser`), as the episode reads them.

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

``tool_weight`` (1.0, the release) scales R_tool. R_tool pays a call whatever the overview shows:
a call with R_acc > 0 earns 0.6 more than the same answer without one, so under the released
reward calling pays at every K unless it costs more than that in accuracy. ``tool_weight: 0``
leaves calls paid only by what they do to accuracy (and the format term's think-before-tool
credit): the ablation that asks whether the Tool Necessity Gap needs calls that do not pay.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable

from paravt.core.scoring import (ANSWER_BODY_RE, ANSWER_RE, CALL_START_RE, OPEN_THINK_RE, THINK_BLOCK_RE,
                                 release_accuracy, release_extract_answer, score)
from paravt.core.toolcall import release_has_tool_call

if TYPE_CHECKING:
    from paravt.core.toolcall import ToolCallParser

SUBSTANTIVE_THINK_CHARS = 10
TAG_PAIRS = ("think", "tool_call", "tool_code", "answer")
RULES = ("release", "paravt")


@dataclass(frozen=True)
class RewardKnobs:
    """The recipe's ``paravt:`` block, flattened (defaults = full PARA-GRPO)."""

    answer_suffix: bool = True
    anchor_weight: float = 0.5
    mode: str = "f1"  # f1 | exact | llm
    format_weight: float = 1.0
    credit_executed_tools: bool = False
    rules: str = "release"  # release (the authors' reward) | paravt (see module docstring)
    tool_weight: float = 1.0  # weight of R_tool (1.0: the release)

    def __post_init__(self):
        if self.rules not in RULES:
            raise ValueError(f"reward rules must be one of {RULES}, got {self.rules!r}")
        if self.tool_weight < 0:
            raise ValueError(f"reward tool_weight must be >= 0, got {self.tool_weight}")

    @classmethod
    def vanilla(cls) -> "RewardKnobs":
        """The authors' vanilla GRPO recipe: no answer-suffix weighting, no anchoring; the format
        term keeps weight 1.0 (the paper's ablation compares against that)."""
        return cls(answer_suffix=False, anchor_weight=0.0, format_weight=1.0)


@dataclass
class RewardBreakdown:
    total: float
    acc: float
    format: float
    tool: float
    guarded: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def degenerate(text: str, count: int = 5, window: int = 300, rules: str = "release") -> bool:
    """The guard against a model that role-plays new turns instead of answering. ``release``:
    ``count`` or more ``<|im_start|>`` and the whole text shorter than ``window`` characters;
    ``paravt``: ``count`` of them within any ``window`` characters."""
    if rules == "release":
        return text.count("<|im_start|>") >= count and len(text) < window
    pos = [m.start() for m in re.finditer(re.escape("<|im_start|>"), text)]
    return any(pos[i + count - 1] - pos[i] < window for i in range(len(pos) - count + 1))


def accuracy(text: str, answer: Any, question_type: str, mode: str = "f1",
             judge: Callable[[str, str], float] | None = None, rules: str = "release") -> float:
    """R_acc of a scored text. ``paravt`` rules: exactly eval's :func:`paravt.core.scoring.score`.
    ``release`` rules: the release's extraction and matching; ``llm`` mode asks
    ``judge(pred, gold)`` for {0, 0.5, 1} on open-ended questions and falls back to F1."""
    if rules != "release":
        return score(text, answer, question_type, mode, judge).value
    pred = release_extract_answer(text)
    if mode == "llm" and question_type not in ("mcq", "tvg"):
        gold = answer if isinstance(answer, str) else str(answer)
        if pred and release_accuracy(pred, gold, question_type, "exact") == 1.0:
            return 1.0
        if judge is not None:
            try:
                v = float(judge(pred, gold))
                if v in (0.0, 0.5, 1.0):
                    return v
            except Exception:  # noqa: BLE001 - the judge must never block training
                pass
        return release_accuracy(pred, gold, question_type, "f1")
    return release_accuracy(pred, answer, question_type, "f1" if mode == "llm" else mode)


def _release_format(text: str, answer_suffix: bool, anchor_weight: float) -> float:
    """R_fmt under the release's rules (≤ 1; negative when only the unclosed-think penalty fires)."""
    m = THINK_BLOCK_RE.search(text) or OPEN_THINK_RE.search(text)
    think = bool(m and len(m.group(1).strip()) >= SUBSTANTIVE_THINK_CHARS)
    body = any(b.strip() for b in ANSWER_RE.findall(text))
    closed_think = "</think>" in text
    t, a_open, a_close = (0.2, 0.3, 0.2) if answer_suffix else (0.3, 0.2, 0.1)
    score = t * think + (a_open * ("<answer>" in text) + a_close * ("</answer>" in text)) * body
    if anchor_weight > 0:
        anchor = 0.4 * (closed_think and think) + 0.3 * (closed_think and think and body and "</answer>" in text)
        anchor -= 0.3 * ("<think>" in text and not closed_think)
        score += anchor_weight * anchor
    calls = [p for p in (text.find("<tool_call>"), text.find("<tool_code>")) if p >= 0]
    if think and calls and release_has_tool_call(text) and 0 <= text.find("<think>") < min(calls):
        score += 0.3
    if score > 0 and all(text.count(f"<{t}>") == text.count(f"</{t}>") for t in TAG_PAIRS):
        score += 0.1
    return min(score, 1.0)


def _calls_parser(parser: "ToolCallParser | None") -> "ToolCallParser":
    """``rules: paravt`` reads calls as the episode does: with the parser of the recipe's tools."""
    if parser is None:
        raise ValueError("reward rules paravt read tool calls with the recipe's tools' parser: pass parser= "
                         "(paravt.agent.tools.call_parser)")
    return parser


def format_reward(text: str, answer_suffix: bool = True, anchor_weight: float = 0.5, rules: str = "release",
                  parser: "ToolCallParser | None" = None) -> float:
    """R_fmt (≤ 1) under ``rules`` (see the module docstring); ``parser`` is needed by ``paravt``."""
    if rules == "release":
        return _release_format(text, answer_suffix, anchor_weight)
    parser = _calls_parser(parser)
    thinks = THINK_BLOCK_RE.findall(text)
    substantive = any(len(t.strip()) >= SUBSTANTIVE_THINK_CHARS for t in thinks)
    m = ANSWER_BODY_RE.search(text)
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
    call = CALL_START_RE.search(text)
    if call and parser.parse(text).calls and "<think>" in text and text.index("<think>") < call.start():
        score += 0.3
    if score > 0 and all(text.count(f"<{t}>") == text.count(f"</{t}>") for t in TAG_PAIRS):
        score += 0.1
    return max(0.0, min(1.0, score))


def tool_reward(text: str, acc: float, executed_tool: bool = False, credit_executed_tools: bool = False,
                rules: str = "release", parser: "ToolCallParser | None" = None) -> float:
    """R_tool under ``rules``; ``parser`` (the recipe's tools') is needed by ``paravt``."""
    has_call = release_has_tool_call(text) if rules == "release" else bool(_calls_parser(parser).parse(text).calls)
    if not has_call:
        return 0.0
    base = 0.3 if ("<tool_response>" in text or (credit_executed_tools and executed_tool)) else 0.1
    if acc > 0:
        base += 0.5
    return min(1.0, base)


def compute_reward(text: str, answer: Any, question_type: str, knobs: RewardKnobs = RewardKnobs(),
                   judge: Callable[[str, str], float] | None = None, executed_tool: bool = False,
                   parser: "ToolCallParser | None" = None) -> RewardBreakdown:
    """R of one scored text; ``parser``: the recipe's tools' call parser (needed by ``rules: paravt``)."""
    if degenerate(text, rules=knobs.rules):
        return RewardBreakdown(0.0, 0.0, 0.0, 0.0, guarded=True)
    acc = accuracy(text, answer, question_type, knobs.mode, judge, knobs.rules)
    fmt = format_reward(text, knobs.answer_suffix, knobs.anchor_weight, knobs.rules, parser)
    tool = tool_reward(text, acc, executed_tool, knobs.credit_executed_tools, knobs.rules, parser)
    return RewardBreakdown(acc + knobs.format_weight * fmt + knobs.tool_weight * tool, acc, fmt, tool)
