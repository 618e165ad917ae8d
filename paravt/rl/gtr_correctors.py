"""GTR's correctors: what a corrector sees of a main-agent turn (:class:`TurnState`), what it says
(:class:`Verdict`), and the two it ships with — :class:`OracleCorrector` (the synthetic world's
ground truth; the embedded default) and :class:`LLMCorrector` (any OpenAI-compatible endpoint, as
GTR used GPT-4o). The loop that uses them is :class:`paravt.rl.gtr.GTR`."""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from paravt.core.scoring import THINK_BLOCK_RE
from paravt.rl.rewards.terms import SUBSTANTIVE_THINK_CHARS

log = logging.getLogger("paravt.rl.gtr")


# ---------------------------------------------------------------------------------------
# What a corrector sees and says
# ---------------------------------------------------------------------------------------

@dataclass
class TurnState:
    """One main-agent turn and what the agent could know when it wrote it."""

    sample_id: str
    question: str
    question_type: str
    answer: Any
    video_path: str
    turn_index: int
    thought: str | None  # the first closed thought of the turn (None: malformed)
    turn_text: str  # the turn as written
    overview_times: list[float]
    windows_before: list[tuple[float, float]]  # crop windows executed in earlier turns
    reports_before: list[str]  # what the sub-agents reported in earlier turns
    windows_now: list[tuple[float, float]]  # crop windows this turn asked for
    extra: dict[str, Any] = field(default_factory=dict)  # the RL row's extra_info
    frames: Any = None  # overview images (the LLM corrector sends a few)


@dataclass
class Verdict:
    correct: bool | None  # None: no verdict (malformed thought or corrector failure)
    correction: str | None = None  # the corrected thought (only when correct is False)
    reason: str = ""


class Corrector(Protocol):
    async def judge(self, state: TurnState) -> Verdict: ...


def first_thought(turn_text: str) -> str | None:
    """The turn's first closed thought when it is substantive (≥ 10 characters), else None."""
    m = THINK_BLOCK_RE.search(turn_text)
    if m is None or len(m.group(1).strip()) < SUBSTANTIVE_THINK_CHARS:
        return None
    return m.group(1).strip()


def turn_states(traj, sample) -> list[TurnState]:
    """The :class:`TurnState` of every turn of an episode, in order."""
    states, windows, reports = [], [], []
    for turn in traj.turns:
        now = [tuple(c.window) for c in turn.calls if c.ok and c.window]
        states.append(TurnState(sample.sample_id, sample.question, sample.question_type, sample.answer,
                                sample.video_path, turn.index, first_thought(turn.text), turn.text,
                                list(traj.overview_times), list(windows), list(reports), now, dict(sample.extra),
                                traj.main.images))
        windows += now
        reports += [c.response for c in turn.calls if c.ok]
    return states


# ---------------------------------------------------------------------------------------
# The oracle: the synthetic world's ground truth
# ---------------------------------------------------------------------------------------

_LETTERS = "ABCD"


class OracleCorrector:
    """Judges a thought against the synthetic world's script, in the expert traces' wording.

    Known at a turn: the target event's visibility in the overview frames and in the frames of
    the crop windows executed before the turn (1 fps, ≤ 16 frames, as the sub-agents saw them).
    A thought is wrong when it (a) restates the question with another shape, (b) gives the
    target shape another colour, (c) names a wrong option letter, (d) says the target is (not)
    visible in the overview when the frames say otherwise, or (e) reasons about another shape
    (state-irrelevant). Otherwise it is correct. The
    correction is the expert's thought for the same state (see
    :func:`paravt.data.synthetic.traces.expert_trajectory`)."""

    def __init__(self, world_dir: str | Path):
        from paravt.data.synthetic.world import COLOURS, SHAPES, Event, VideoSpec, WorldConfig  # noqa: PLC0415

        path = Path(world_dir) / "world.json"
        if not path.exists():
            raise FileNotFoundError(f"gtr oracle: {path} not found (set gtr.world to the synthetic world folder)")
        world = json.loads(path.read_text())
        known = set(WorldConfig.__dataclass_fields__)  # a world built by an older version may carry retired knobs
        self.cfg = WorldConfig(**{k: v for k, v in world["config"].items() if k in known})
        if self.cfg.report_wording != "colour_first":
            raise ValueError(f"gtr oracle: {path} was built with report_wording={self.cfg.report_wording}; the oracle's "
                             "thoughts are written in the colour_first wording only (build the world without --report-wording)")
        self.colours, self.shapes = sorted(COLOURS), list(SHAPES)
        self.specs: dict[str, Any] = {}
        for vid, v in world["videos"].items():
            v = dict(v)
            v["events"] = [Event(**e) for e in v["events"]]
            v["scenes"] = [tuple(s) for s in v["scenes"]]
            self.specs[vid] = VideoSpec(**v)

    # -- ground truth ---------------------------------------------------------------
    def target(self, state: TurnState):
        """(spec, event) of the question: the sample id is ``<video id>_e<event>_<type>``."""
        m = re.match(r"(.+)_e(\d+)_(mcq|oe|tvg)$", state.sample_id)
        if not m or m.group(1) not in self.specs:
            raise KeyError(f"gtr oracle: sample {state.sample_id!r} is not a question of this world")
        spec = self.specs[m.group(1)]
        return spec, spec.events[int(m.group(2))]

    def _seen(self, ev, times) -> list[float]:
        return [t for t in times if ev.visible_at(t)]

    def _crop_times(self, spec, s: float, e: float) -> list[float]:
        from paravt.data.synthetic.traces import crop_times  # noqa: PLC0415

        return crop_times(spec, s, e, self.cfg)

    def _options(self, state: TurnState) -> list[str] | None:
        if state.question_type != "mcq":
            return None
        opts = re.findall(r"^([A-D])\. (\w+)$", state.question, re.MULTILINE)
        return [o for _, o in opts] if opts else None

    # -- judgement --------------------------------------------------------------------
    def errors(self, state: TurnState) -> list[str]:
        """The reasons a thought is wrong (empty: correct)."""
        spec, ev = self.target(state)
        text = state.thought or ""
        low = text.lower()
        out = []
        m = re.search(r"question asks (?:the colour of the |when the (?:\w+ )?)(\w+)", low)
        if m and m.group(1) in self.shapes and m.group(1) != ev.shape:
            out.append(f"restates the {m.group(1)} instead of the {ev.shape}")
        for colour, shape in re.findall(rf"\b({'|'.join(self.colours)}) ({'|'.join(self.shapes)})\b", low):
            if shape == ev.shape and colour != ev.colour:
                out.append(f"calls the {ev.shape} {colour} (it is {ev.colour})")
        others = sorted({w for w in re.findall(rf"\b({'|'.join(self.shapes)})\b", low) if w != ev.shape})
        if others and not (m and m.group(1) in others):  # (e) state-irrelevant: reasons about another shape
            out.append(f"talks about the {', '.join(others)}, not the {ev.shape}")
        for colour in re.findall(rf"\bit is ({'|'.join(self.colours)})\b", low):
            if colour != ev.colour:
                out.append(f"answers {colour} (it is {ev.colour})")
        opts = self._options(state)
        if opts and ev.colour in opts:
            gold = _LETTERS[opts.index(ev.colour)]
            for letter in re.findall(r"\boption ([A-D])\b", text):
                if letter != gold:
                    out.append(f"picks option {letter} (it is {gold})")
        seen = self._seen(ev, state.overview_times)
        if re.search(r"not visible in the overview", low) and seen:
            out.append("says the target is not in the overview, but it is")
        elif re.search(r"in the overview .* is visible", low) and not seen:
            out.append("says the target is in the overview, but it is not")
        return out

    def expert_thought(self, state: TurnState) -> str:
        """What the expert thinks at this state (the expert traces' wording)."""
        from paravt.data.synthetic.traces import answer_sentence, cover_windows, question_desc, where  # noqa: PLC0415
        from paravt.data.synthetic.world import restate  # noqa: PLC0415

        spec, ev = self.target(state)
        q = {"question_type": state.question_type, "shape": ev.shape, "colour": ev.colour,
             "answer": state.answer, "options": self._options(state)}
        desc = question_desc(ev, state.question_type)
        seen = self._seen(ev, state.overview_times)
        hits = sorted({t for s, e in state.windows_before for t in self._seen(ev, self._crop_times(spec, s, e))})
        restatable = state.question_type != "mcq" or q["options"] is not None
        lead = f"{restate(q)} " if state.turn_index == 0 and restatable else ""
        if state.turn_index == 0 and seen:
            tail = "" if state.question_type == "tvg" else f" {answer_sentence(q)}"
            return f"{lead}In the overview {desc} is visible {where(seen)}.{tail}"
        if state.turn_index == 0:
            n = len(cover_windows(spec.duration, self.cfg.coarse_window_s))
            return (f"{lead}{desc.capitalize()} is not visible in the overview frames. "
                    f"I will check {n} windows of the video in parallel.")
        tail = "" if state.question_type == "tvg" else f" {answer_sentence(q)}"
        if hits:
            return f"{desc.capitalize()} is visible {where(hits)}.{tail}"
        if seen:
            return f"In the overview {desc} is visible {where(seen)}.{tail}"
        return f"{desc.capitalize()} was not found in the windows checked so far."

    async def judge(self, state: TurnState) -> Verdict:
        if state.thought is None:
            return Verdict(None, reason="malformed: no closed, substantive thought")
        errs = self.errors(state)
        if not errs:
            return Verdict(True)
        return Verdict(False, self.expert_thought(state), "; ".join(errs))


# ---------------------------------------------------------------------------------------
# The LLM corrector: any OpenAI-compatible endpoint
# ---------------------------------------------------------------------------------------

LLM_PROMPT = """You check the reasoning of a video agent. The agent sees a few overview frames of a video \
(attached, with their timestamps), may call crop_video to have sub-agents look at time windows, and reads \
their reports.

Question: {question}
Overview frame timestamps (s): {times}
Earlier sub-agent reports:
{reports}
The agent's current thought:
{thought}

Is the thought consistent with what the agent has seen (frames and reports) and useful for answering \
the question? Reply with JSON only: {{"evaluation": "yes" or "no", "reason": "...", \
"correction": "the corrected thought (plain text), or null if the thought is correct"}}"""


class LLMCorrector:
    """Frames + question + earlier tool responses + thought → a JSON verdict and a correction,
    through ``/v1/chat/completions`` with the project's one retry policy. Any failure (HTTP,
    timeout, unparseable JSON, missing correction) is "no correction": training never blocks."""

    def __init__(self, base_url: str, model: str = "", api_key: str | None = None, timeout_s: float = 60.0,
                 max_retries: int = 1, max_frames: int = 8):
        from paravt.engines.openai import OpenAIEngine  # noqa: PLC0415

        self.client = OpenAIEngine(base_url, model=model or None, api_key=api_key, request_timeout_s=timeout_s,
                                   max_retries=max_retries, max_concurrency=8)
        self.max_frames = max_frames
        self.failures = Counter()

    def messages(self, state: TurnState) -> list[dict[str, Any]]:
        imgs = list(getattr(state.frames, "images", state.frames or []))[: len(state.overview_times)]
        idx = sorted({round(i * (len(imgs) - 1) / max(1, self.max_frames - 1)) for i in range(self.max_frames)}) \
            if imgs else []
        content: list[dict[str, Any]] = []
        for i in idx:
            content += [{"type": "text", "text": f"{state.overview_times[i]:.1f}s"}, {"type": "image", "image": imgs[i]}]
        reports = "\n".join(f"- {r}" for r in state.reports_before) or "(none)"
        content.append({"type": "text", "text": LLM_PROMPT.format(
            question=state.question, times=", ".join(f"{t:.1f}" for t in state.overview_times),
            reports=reports, thought=state.thought)})
        return [{"role": "user", "content": content}]

    async def judge(self, state: TurnState) -> Verdict:
        from paravt.engines.base import SamplingParams  # noqa: PLC0415

        if state.thought is None:
            return Verdict(None, reason="malformed: no closed, substantive thought")
        out = await self.client.chat(self.messages(state), SamplingParams(temperature=0.0, max_new_tokens=512))
        if out.error:
            self.failures["request"] += 1
            return Verdict(None, reason=f"corrector request failed: {out.error[:200]}")
        return parse_verdict(out.text or "", self.failures)

    async def close(self) -> None:
        await self.client.close()


def parse_verdict(text: str, failures: Counter | None = None) -> Verdict:
    """The corrector's JSON reply → a :class:`Verdict`; anything unusable → no verdict."""
    failures = failures if failures is not None else Counter()
    m = re.search(r"\{.*\}", text, re.DOTALL)
    try:
        obj = json.loads(m.group(0)) if m else None
    except json.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict) or "evaluation" not in obj:
        failures["unparseable"] += 1
        return Verdict(None, reason=f"unparseable corrector reply: {text[:120]!r}")
    if str(obj["evaluation"]).strip().lower().startswith("yes"):
        return Verdict(True, reason=str(obj.get("reason", "")))
    corr = obj.get("correction")
    if isinstance(corr, dict):
        corr = corr.get("thought") or json.dumps(corr)
    if not isinstance(corr, str) or len(corr.strip()) < SUBSTANTIVE_THINK_CHARS:
        failures["no_correction"] += 1
        return Verdict(None, reason="judged wrong but no usable correction")
    return Verdict(False, corr.strip(), str(obj.get("reason", "")))
