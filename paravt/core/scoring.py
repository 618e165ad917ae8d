"""THE scorer: answer extraction, normalisation and metrics shared by the RL reward and eval.

Nothing here knows about recipes or rewards; ``paravt.rl.rewards`` composes these pure
functions into R_acc / R_fmt / R_tool and ``paravt.eval`` into benchmark metrics.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from paravt.core.toolcall import ToolCallParser, parse_time

MCQ_LETTERS = "ABCDEFGHIJ"
# The structural tags' regexes, used by the reward terms, the metrics and eval alike.
_ANSWER_RE = ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)  # a closed answer block
ANSWER_BODY_RE = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.DOTALL)  # closed or left open
THINK_BLOCK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)  # a closed thought
OPEN_THINK_RE = re.compile(r"<think>(.*?)(?:<tool_|<answer>|<\|im_end\|>|$)", re.DOTALL)  # a thought, closed or not
CALL_START_RE = re.compile(r"<tool_call>|<tool_code>|<video_zoom>")
_TOOL_BLOCK_RE = re.compile(
    r"<(tool_call|tool_code|tool_response|video_zoom)>.*?(?:</\1>|\Z)", re.DOTALL
)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


# ---------------------------------------------------------------------------------------
# Answer extraction
# ---------------------------------------------------------------------------------------

def _last_plain_line(text: str) -> str:
    """The last non-empty line that does not start with ``<|im_`` or ``<tool_`` (both rule sets' fallback)."""
    for line in reversed(text.splitlines()):
        s = line.strip()
        if s and not s.startswith("<|im_") and not s.startswith("<tool_"):
            return s
    return ""


def extract_answer(text: str) -> str:
    """The answer of a completion, in the order of the paper's reward (§3.3).

    1. the body of the last ``<answer>…</answer>``;
    2. else the text after the last ``</think>`` with tool blocks removed;
    3. else the last non-empty line that does not start with ``<|im_`` or ``<tool_``.
    """
    if not text:
        return ""
    found = _ANSWER_RE.findall(text)
    if found:
        return found[-1].strip()
    if "</think>" in text:
        tail = _TOOL_BLOCK_RE.sub("", text.rsplit("</think>", 1)[1]).strip()
        if tail:
            return tail
    return _last_plain_line(text)


def normalize_answer(s: str) -> str:
    """Lowercase, drop punctuation and articles (a/an/the), squeeze whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES_RE.sub(" ", s)
    return " ".join(s.split())


def exact_match(pred: str, gold: str) -> float:
    return float(normalize_answer(pred) == normalize_answer(gold))


def token_f1(pred: str, gold: str) -> float:
    """SQuAD token F1 on normalised answers."""
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    common = Counter(p) & Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


# ---------------------------------------------------------------------------------------
# Multiple choice
# ---------------------------------------------------------------------------------------

_L = f"[{MCQ_LETTERS}]"
_LC = f"(?-i:{_L})"  # a capital option letter inside an IGNORECASE pattern ("the answer is a red ..." is not A)
_MCQ_PATTERNS = [
    re.compile(rf"^\s*[\(\[]?({_L}|[{MCQ_LETTERS.lower()}])[\)\]]?[.:!]?\s*$"),  # the whole text is one letter: "b", "(B)", "C."
    re.compile(rf"^\s*(?:[\(\[]({_L})[\)\]]|({_L})(?:[.:)]|\s*$))"),  # "B", "(B)", "B.", "B) text"
    re.compile(rf"answer\s*(?:is|:)?\s*(?:option\s*)?[\(\[]?({_LC})\b[\)\]]?", re.IGNORECASE),
    re.compile(rf"\boption\s*[\(\[]?({_LC}|[{MCQ_LETTERS.lower()}])\b[\)\]]?", re.IGNORECASE),
    re.compile(rf"[\(\[]({_L})[\)\]]"),
    # a sentence that ends with the letter: "Based on the frames, B." / "so it must be C" / "I pick D!"
    re.compile(rf"(?:[,:;]|\b(?:is|be|pick|choose|select|go with))\s*({_LC})\s*[.!]?\s*$", re.IGNORECASE),
]


def extract_mcq_letter(text: str) -> str | None:
    """The option letter (A–J) a text commits to, tolerant of "(B)", "Option B",
    "The answer is B", "B. red". None when no letter can be found."""
    if not text:
        return None
    t = text.strip()
    for pat in _MCQ_PATTERNS:
        m = pat.search(t)
        if m:
            return next(g for g in m.groups() if g).upper()
    # Last resort: a single standalone capital letter in a short text.
    letters = re.findall(rf"(?<![A-Za-z]){_L}(?![A-Za-z])", t)
    if len(set(letters)) == 1 and len(t.split()) <= 2:
        return letters[0]
    return None


def mcq_correct(pred: str, gold: str) -> float:
    gl = extract_mcq_letter(gold) or gold.strip().upper()[:1]
    pl = extract_mcq_letter(pred)
    return float(pl is not None and pl == gl)


# ---------------------------------------------------------------------------------------
# Temporal grounding
# ---------------------------------------------------------------------------------------

_NUM = r"\d+(?:\.\d+)?"
_CLOCK = r"\d{1,2}:\d{2}(?::\d{2})?(?:\.\d+)?"
_TIME = rf"(?:{_CLOCK}|{_NUM})"
_SEC = r"\s*(?:s|secs?|seconds?)?"
_SPAN_PATTERNS = [
    # "starts at X and ends at Y", "start time: X, end time: Y", "starting at X ... ending at Y"
    re.compile(rf"\bstart(?:s|ing)?(?:[\s_]+time)?\s*(?:at|:|=|is)?\s*({_TIME}){_SEC}[^\d]{{0,40}}?"
               rf"\bend(?:s|ing)?(?:[\s_]+time)?\s*(?:at|:|=|is)?\s*({_TIME})", re.I),
    re.compile(rf"\bbetween\s+({_TIME}){_SEC}\s+and\s+({_TIME})", re.I),  # "between X and Y seconds"
    re.compile(rf"<time>\s*({_TIME})\s*(?:s|seconds)?\s*(?:-|–|to|,)\s*({_TIME})\s*(?:s|seconds)?\s*</time>", re.I),
    re.compile(rf"\[\s*({_TIME})\s*(?:s|seconds)?\s*,\s*({_TIME})\s*(?:s|seconds)?\s*\]", re.I),
    re.compile(rf"\bfrom\s+({_TIME})\s*(?:s|seconds)?\s+to\s+({_TIME})", re.I),
    re.compile(rf"({_TIME})\s*(?:s|seconds)?\s*(?:-|–|to)\s*({_TIME})", re.I),
]


def extract_span(text: str) -> tuple[float, float] | None:
    """The first temporal span ``(start, end)`` in seconds, or None.

    Accepts ``[s, e]``, ``<time>s - e</time>``, ``from s to e``, ``s - e seconds``, "starts at s and
    ends at e", "start time: s, end time: e", "between s and e seconds", with numbers or MM:SS /
    HH:MM:SS times. A reversed pair is reordered."""
    if not text:
        return None
    for pat in _SPAN_PATTERNS:
        m = pat.search(text)
        if m:
            a, b = parse_time(m.group(1)), parse_time(m.group(2))
            if isinstance(a, float) and isinstance(b, float):
                return (min(a, b), max(a, b))
    return None


def temporal_iou(pred: Sequence[float] | None, gold: Sequence[float]) -> float:
    if pred is None:
        return 0.0
    ps, pe = float(pred[0]), float(pred[1])
    gs, ge = float(gold[0]), float(gold[1])
    inter = max(0.0, min(pe, ge) - max(ps, gs))
    union = max(pe, ge) - min(ps, gs)
    return inter / union if union > 0 else 0.0


def recall_at(ious: Iterable[float], thresholds: Sequence[float] = (0.3, 0.5, 0.7)) -> dict[str, float]:
    ious = list(ious)
    n = max(len(ious), 1)
    return {f"R@{t}": sum(1 for i in ious if i >= t) / n for t in thresholds}


def parse_gold_span(gold) -> tuple[float, float]:
    if isinstance(gold, (list, tuple)) and len(gold) == 2:
        return float(gold[0]), float(gold[1])
    span = extract_span(str(gold))
    if span is None:
        raise ValueError(f"gold answer is not a temporal span: {gold!r}")
    return span


# ---------------------------------------------------------------------------------------
# Accuracy per question type
# ---------------------------------------------------------------------------------------

QUESTION_TYPES = ("mcq", "tvg", "oe")
ACC_MODES = ("f1", "exact", "llm")


@dataclass
class Score:
    """One completion scored against its gold answer."""

    pred: str  # the extracted answer
    value: float  # correctness (mcq/oe, in [0, 1]) or temporal IoU (tvg)
    span: tuple[float, float] | None = None  # tvg: the predicted span


def score(completion: str, answer, question_type: str, mode: str = "f1",
          judge: Callable[[str, str], float] | None = None) -> Score:
    """THE scorer of a completion, shared by the RL reward (``rules: paravt``) and eval.

    The answer is :func:`extract_answer`'s. ``mcq`` → the option letter it commits to
    (:func:`mcq_correct`); ``tvg`` → temporal IoU of the first span in the answer, else in the
    text after the last ``</think>``; ``oe`` → 1 on an exact match after normalisation, else token
    F1 (``f1``), 0 (``exact``) or the ``judge(pred, gold)`` verdict in {0, 0.5, 1} (``llm``; F1
    when the judge fails or is absent)."""
    if question_type not in QUESTION_TYPES:
        raise ValueError(f"unknown question_type {question_type!r} (expected one of {QUESTION_TYPES})")
    if mode not in ACC_MODES:
        raise ValueError(f"unknown accuracy mode {mode!r} (expected one of {ACC_MODES})")
    pred = extract_answer(completion)
    gold_text = answer if isinstance(answer, str) else str(answer)
    if question_type == "tvg":
        span = extract_span(pred) or extract_span(completion.rsplit("</think>", 1)[-1])
        return Score(pred, temporal_iou(span, parse_gold_span(answer)), span)
    if question_type == "mcq":
        return Score(pred, mcq_correct(pred, gold_text))
    if pred and exact_match(pred, gold_text):
        return Score(pred, 1.0)
    if mode == "llm" and judge is not None:
        try:
            v = float(judge(pred, gold_text))
            if v in (0.0, 0.5, 1.0):
                return Score(pred, v)
        except Exception:  # noqa: BLE001 - a failing judge falls back to F1, never blocks
            pass
    return Score(pred, 0.0 if mode == "exact" else token_f1(pred, gold_text))


# ---------------------------------------------------------------------------------------
# Format compliance of one main-agent turn (RL metric and eval metric)
# ---------------------------------------------------------------------------------------

def turn_well_formed(text: str, parser: ToolCallParser) -> bool:
    """A turn as written (forced ``<think>\n`` included) is well-formed when a closed think
    block is followed by parseable tool calls (and no unparseable block) or a non-empty answer;
    ``parser`` reads the calls as the episode does (the recipe's tools: paravt.agent.tools.call_parser)."""
    if "<think>" not in text or "</think>" not in text or text.index("<think>") > text.index("</think>"):
        return False
    after = text.split("</think>", 1)[1]
    parsed = parser.parse(after)
    if parsed.calls and not parsed.errors:
        return True
    m = _ANSWER_RE.search(after)
    return bool(m and m.group(1).strip()) and not parsed.errors


def episode_well_formed(turn_texts: Sequence[str], parser: ToolCallParser) -> bool:
    """``format/compliance`` of one episode: at least one turn, and every turn well-formed."""
    return bool(turn_texts) and all(turn_well_formed(t, parser) for t in turn_texts)


# ---------------------------------------------------------------------------------------
# The release's rules (the authors' RL reward, ``rules: release``)
# ---------------------------------------------------------------------------------------
# The authors' reward extracts and matches answers slightly differently from the eval-side
# rules above: the FIRST closed answer block, the text after the FIRST ``</think>`` (only
# closed tool blocks removed), set-based token F1, letters A-D only (any standalone letter
# counts), and only "s, e" spans. The RL recipes default to these so a reproduction trains on
# the published reward; ``rules: paravt`` selects the rules above (letters A-J as
# LongVideoBench's five options need, MM:SS and "s - e" spans, the last answer block).

_CLOSED_TOOL_BLOCK_RE = re.compile(r"<(tool_call|tool_code|tool_response)>.*?</\1>", re.DOTALL)
_RELEASE_PUNCT_RE = re.compile(r"[^\w\s]")
_RELEASE_SPAN_RE = re.compile(r"\[?\s*([\d.]+)\s*,\s*([\d.]+)\s*\]?")
_RELEASE_MCQ = [
    re.compile(r"^\(?([A-D])\)?$"),
    re.compile(r"[Tt]he answer is\s*\(?([A-D])\)?"),
    re.compile(r"[Oo]ption\s*\(?([A-D])\)?"),
    re.compile(r"^([A-D])[.):]"),
    re.compile(r"\b([A-D])\b"),
]


def release_extract_answer(text: str) -> str:
    """The release's answer extraction: first closed ``<answer>`` body; else the text after the
    first ``</think>`` without closed tool blocks and chat markers; else the last non-empty
    line not starting with ``<|im_`` / ``<tool_``."""
    m = _ANSWER_RE.search(text or "")
    if m:
        return m.group(1).strip()
    if "</think>" in text:
        tail = _CLOSED_TOOL_BLOCK_RE.sub("", text.split("</think>", 1)[1])
        tail = tail.replace("<|im_end|>", "").replace("<|im_start|>", "").strip()
        if tail:
            return tail
    return _last_plain_line(text)


def release_normalize(text: str) -> str:
    text = _ARTICLES_RE.sub(" ", text.strip().lower())
    return " ".join(_RELEASE_PUNCT_RE.sub("", text).split())


def release_f1(pred: str, gold: str) -> float:
    """Token F1 on the SETS of normalised tokens (repeats count once)."""
    p, g = release_normalize(pred).split(), release_normalize(gold).split()
    common = set(p) & set(g)
    if not p or not g or not common:
        return 0.0
    precision, recall = len(common) / len(p), len(common) / len(g)
    return 2 * precision * recall / (precision + recall)


def release_mcq(pred: str, gold: str) -> float:
    gold = gold.strip().upper()
    if len(gold) != 1 or gold not in "ABCD":
        return 0.0
    pred = pred.strip()
    if pred.upper() == gold:
        return 1.0
    return float(any((m := p.search(pred)) and m.group(1).upper() == gold for p in _RELEASE_MCQ))


def release_tiou(pred: str, gold: str) -> float:
    def span(t: str):
        m = _RELEASE_SPAN_RE.search(t)
        try:
            return (float(m.group(1)), float(m.group(2))) if m else None
        except ValueError:  # "1.2.3"
            return None
    p, g = span(pred), span(gold)
    if p is None or g is None or p[1] <= p[0] or g[1] <= g[0]:
        return 0.0
    inter = max(0.0, min(p[1], g[1]) - max(p[0], g[0]))
    union = (p[1] - p[0]) + (g[1] - g[0]) - inter
    return inter / union if union > 0 else 0.0


def release_accuracy(pred: str, gold, question_type: str, mode: str = "f1") -> float:
    """R_acc of an extracted answer under the release's rules (``llm`` is handled by the caller)."""
    gold = gold if isinstance(gold, str) else str(gold)
    if not pred or not gold:
        return 0.0
    if release_normalize(pred) == release_normalize(gold):
        return 1.0
    if question_type == "mcq":
        return release_mcq(pred, gold)
    if question_type == "tvg":
        return release_tiou(pred, gold)
    return 0.0 if mode == "exact" else release_f1(pred, gold)
