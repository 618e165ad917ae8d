"""GTR — guided thought reinforcement (Wei et al. 2025, arXiv 2503.08525; code: weit123/GTR), as
an opt-in PARA-GRPO component (``gtr.mode: off | observe | train``; off by default).

Every step a **corrector** judges the thought of each main-agent turn against what the agent
could know at that point (its overview frames, the crop windows it executed and what the
sub-agents reported). A thought judged wrong gets a corrected thought; the corrected thought,
placed where the agent's own thought stood (the prefix is every token before that turn; the
labels are the corrected thought's tokens only), becomes an SFT sample in a seeded buffer
that aggregates corrections over the run (DAgger-style) and is saved with each checkpoint.
With ``mode: train`` the loss is

    L = L_PARA-GRPO  +  λ · mean NLL(corrected-thought tokens)        (λ = gtr.sft_weight)

with SFT samples drawn from the buffer at ``sft_ratio`` per RL sample (1:1 as in GTR), no
ratio, clip or KL on them. The rollouts themselves are never replaced. ``mode: observe`` judges
and logs the collapse metrics without the NLL term (a cheap diagnostic for any run).

Faithful to the GTR code: only thoughts judged wrong get an SFT target; a malformed turn (no
closed, substantive thought) gets no correction (its format reward is already 0 under
PARA-GRPO's format term); the SFT weight defaults to 1; ``gtr.think_weight`` = c weights the
thought tokens in the policy-gradient loss (GTR's ``thought_prob_coef``: log p(action) +
c·log p(thought), here per token).

Departures: (1) two correctors — :class:`OracleCorrector`, which reads the synthetic world's
ground truth (the embedded default; no model is downloaded), and :class:`LLMCorrector` for any
OpenAI-compatible endpoint (GTR used GPT-4o); (2) a corrector failure means "no correction"
and training never waits on it (GTR retried until the JSON parsed); (3) the NLL term is added
to the first PPO mini-batch's gradient rather than run as separate SFT epochs.

Collapse metrics (every step, observe and train): ``gtr/corrected_fraction``,
``gtr/valid_thought_fraction``, ``gtr/thought_state_consistency`` (judged thoughts found
correct), ``gtr/thought_answer_consistency`` (final thoughts that state the answer given),
``gtr/distinct_thought_fraction``, ``gtr/cross_question_duplicates``,
``gtr/repeated_thought_turns``; the trainer adds ``ppo/entropy_think`` / ``ppo/entropy_action``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from paravt.core.scoring import ANSWER_RE, THINK_BLOCK_RE, extract_span, normalize_answer, temporal_iou
from paravt.core.seeding import stable_hash
from paravt.models.images import ImageInputs
from paravt.models.tokenize import encode_text
from paravt.rl.rollout import Sample
from paravt.rl.rewards.terms import SUBSTANTIVE_THINK_CHARS

log = logging.getLogger("paravt.rl.gtr")

BUFFER_FILE = "gtr_buffer.json"


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
        from paravt.data.synthetic.traces import _answer_sentence, _windows, where  # noqa: PLC0415
        from paravt.data.synthetic.world import restate  # noqa: PLC0415

        spec, ev = self.target(state)
        q = {"question_type": state.question_type, "shape": ev.shape, "colour": ev.colour,
             "answer": state.answer, "options": self._options(state)}
        desc = f"the {ev.colour} {ev.shape}" if state.question_type == "tvg" else f"the {ev.shape}"
        seen = self._seen(ev, state.overview_times)
        hits = sorted({t for s, e in state.windows_before for t in self._seen(ev, self._crop_times(spec, s, e))})
        restatable = state.question_type != "mcq" or q["options"] is not None
        lead = f"{restate(q)} " if state.turn_index == 0 and restatable else ""
        if state.turn_index == 0 and seen:
            tail = "" if state.question_type == "tvg" else f" {_answer_sentence(q)}"
            return f"{lead}In the overview {desc} is visible {where(seen)}.{tail}"
        if state.turn_index == 0:
            n = len(_windows(spec.duration, self.cfg.coarse_window_s))
            return (f"{lead}{desc.capitalize()} is not visible in the overview frames. "
                    f"I will check {n} windows of the video in parallel.")
        tail = "" if state.question_type == "tvg" else f" {_answer_sentence(q)}"
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


# ---------------------------------------------------------------------------------------
# SFT samples and the buffer
# ---------------------------------------------------------------------------------------

@dataclass
class Correction:
    """A buffered SFT sample: the episode's tokens before the turn + the corrected thought."""

    sample_id: str
    k: int
    step: int
    turn: int
    input_ids: list[int]
    loss_mask: list[int]  # 1 exactly on the corrected thought's tokens
    n_images: int  # images in the prefix (the overview's K frames in sub-agent mode)
    thought: str
    images: Any = None  # not saved; re-decoded from (sample_id, k) after a resume


def correction_text(corrected: str, prefix: str) -> str:
    """The generated text of a corrected turn's thought: the model writes ``<think>\\n`` itself
    unless the turn's forced prefix already opened it."""
    opener = "" if prefix.endswith("<think>\n") else "<think>\n"
    return f"{opener}{corrected}\n</think>"


def build_correction(traj, turn, corrected: str, processor, step: int) -> Correction:
    """The SFT sample for ``turn`` of ``traj``: prefix = every token before the turn's generated
    text (forced prefix included); labels = the corrected thought's tokens only."""
    prefix_ids = traj.main.input_ids[: turn.context_len]
    ids, _ = encode_text(processor, correction_text(corrected, turn.prefix), None)
    vision_start = processor.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    n_images = sum(1 for t in prefix_ids if t == vision_start)
    images = None
    if n_images and traj.main.images is not None:
        all_imgs = list(getattr(traj.main.images, "images", traj.main.images))
        images = traj.main.images if n_images == len(all_imgs) else ImageInputs(all_imgs[:n_images])
    return Correction(traj.sample_id, traj.k, step, turn.index, prefix_ids + ids, [0] * len(prefix_ids) + [1] * len(ids),
                      n_images, corrected, images)


class CorrectionBuffer:
    """Corrections aggregated over the run (oldest dropped past ``size``); draws are seeded."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self.items: list[Correction] = []

    def add(self, items: list[Correction]) -> None:
        self.items.extend(items)
        if len(self.items) > self.size:
            self.items = self.items[-self.size:]

    def draw(self, n: int, step: int) -> list[Correction]:
        if not self.items or n <= 0:
            return []
        r = random.Random(stable_hash(self.seed, "gtr-draw", step))
        return [self.items[i] for i in sorted(r.sample(range(len(self.items)), min(n, len(self.items))))]

    def save(self, path: Path) -> None:
        recs = [{k: v for k, v in asdict(c).items() if k != "images"} for c in self.items]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"size": self.size, "seed": self.seed, "items": recs}))
        tmp.replace(path)

    def load(self, path: Path) -> None:
        data = json.loads(path.read_text())
        self.items = [Correction(**r) for r in data["items"]]


# ---------------------------------------------------------------------------------------
# Collapse metrics (pure)
# ---------------------------------------------------------------------------------------

def _norm(thought: str) -> str:
    return " ".join(re.sub(r"\d+(\.\d+)?", "#", thought.lower()).split())


def thought_answer_consistent(turn_text: str, question_type: str) -> bool | None:
    """Does a final turn's thought state the answer it gives? None when the turn has no thought
    or no answer."""
    thought = first_thought(turn_text)
    m = ANSWER_RE.search(turn_text)
    if thought is None or m is None or not m.group(1).strip():
        return None
    ans = m.group(1).strip()
    if question_type == "tvg":
        a, t = extract_span(ans), extract_span(thought)
        return bool(a and t and temporal_iou(t, a) >= 0.5)
    na = normalize_answer(ans)
    return bool(na) and f" {na} " in f" {normalize_answer(thought)} "


def collapse_metrics(episodes: list[tuple[str, str, list[str]]]) -> dict[str, float]:
    """``episodes``: (sample id, question type, turn texts). Thought diversity and validity."""
    thoughts: list[tuple[str, str]] = []  # (sample id, normalised thought)
    valid = total = repeated = multi = 0
    consistent: list[bool] = []
    for sid, qtype, turns in episodes:
        seen_here = set()
        rep = False
        for i, text in enumerate(turns):
            total += 1
            th = first_thought(text)
            if th is None:
                continue
            valid += 1
            n = _norm(th)
            thoughts.append((sid, n))
            rep |= n in seen_here
            seen_here.add(n)
        if len(turns) >= 2:
            multi += 1
            repeated += rep
        if turns:
            c = thought_answer_consistent(turns[-1], qtype)
            if c is not None:
                consistent.append(c)
    by_text: dict[str, set[str]] = {}
    for sid, n in thoughts:
        by_text.setdefault(n, set()).add(sid)
    m = {"gtr/valid_thought_fraction": valid / total if total else 0.0,
         "gtr/distinct_thought_fraction": len(by_text) / len(thoughts) if thoughts else 0.0,
         "gtr/cross_question_duplicates": (sum(len(by_text[n]) > 1 for _, n in thoughts) / len(thoughts))
         if thoughts else 0.0,
         "gtr/repeated_thought_turns": repeated / multi if multi else 0.0}
    if consistent:
        m["gtr/thought_answer_consistency"] = sum(consistent) / len(consistent)
    return m


def sft_nll(logp: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Sum of −log p over the masked (corrected-thought) tokens, and their count."""
    mask = mask.bool()
    return -(logp * mask).sum(), int(mask.sum())


def gtr_objective(rl_loss_sum: torch.Tensor, n_rl: int, nll_sum: torch.Tensor, n_sft: int, lam: float) -> torch.Tensor:
    """L = L_PARA-GRPO + λ · mean NLL: both terms are token means (over policy / corrected tokens)."""
    return rl_loss_sum / max(n_rl, 1) + lam * nll_sum / max(n_sft, 1)


# ---------------------------------------------------------------------------------------
# The component the trainer holds
# ---------------------------------------------------------------------------------------

class GTR:
    """Rank 0 judges and buffers (in the rollout thread); every rank adds the NLL term."""

    def __init__(self, cfg, processor, is_main: bool):
        self.cfg, self.g, self.processor, self.is_main = cfg, cfg.gtr, processor, is_main
        self.buffer = CorrectionBuffer(self.g.buffer_size, cfg.seed)
        self.corrector: Corrector | None = None
        self.resolve_images = None  # (sample_id, k) -> ImageInputs, set by attach()
        self.dropped_on_resume = 0
        if is_main:
            self.corrector = self._build_corrector()

    def _build_corrector(self) -> Corrector:
        g = self.g
        if g.corrector == "llm":
            import os  # noqa: PLC0415

            return LLMCorrector(g.base_url, g.model, os.environ.get(g.api_key_env) or None, g.timeout_s,
                                g.max_retries, g.max_frames)
        world = g.world or _find_world(self.cfg.train_data)
        return OracleCorrector(world)

    def attach(self, worker) -> None:
        """Rank 0: re-decode buffered prefixes' images through the rollout worker's overview cache."""
        samples = {s.sample_id: s for s in worker.schedule.samples}

        def resolve(sample_id: str, k: int):
            s = samples.get(sample_id)
            if s is None:
                return None
            return worker.cache.get(s, k, worker.ecfg, worker.processor,
                                    [t.schema for t in worker.tools.values()]).images

        self.resolve_images = resolve

    # -- rollout side (rank 0, producer thread) ---------------------------------------
    async def process(self, step: int, trajs, samples) -> tuple[dict[str, float], list[Correction]]:
        """Judge a seeded sample of the batch's turns; corrections for the wrong ones; metrics."""
        metrics = collapse_metrics([(s.sample_id, s.question_type, [t.text for t in tr.turns])
                                    for tr, s in zip(trajs, samples)])
        items = [(tr, s, st) for tr, s in zip(trajs, samples) if tr.end_reason != "error"
                 for st in turn_states(tr, s)]
        r = random.Random(stable_hash(self.cfg.seed, "gtr-judge", step))
        picked = sorted(r.sample(range(len(items)), min(self.g.max_judged_turns, len(items))))
        verdicts = await asyncio.gather(*(self.corrector.judge(items[i][2]) for i in picked))
        corrections: list[Correction] = []
        judged = [v for v in verdicts if v.correct is not None]
        for i, v in zip(picked, verdicts):
            if v.correct is False and v.correction:
                tr, _, st = items[i]
                turn = tr.turns[st.turn_index]
                corrections.append(build_correction(tr, turn, v.correction, self.processor, step))
        metrics.update({
            "gtr/judged_turns": float(len(picked)),
            "gtr/corrected_fraction": len(corrections) / len(picked) if picked else 0.0,
            "gtr/thought_state_consistency": sum(bool(v.correct) for v in judged) / len(judged) if judged else 0.0,
            "gtr/no_verdict_fraction": (len(picked) - len(judged)) / len(picked) if picked else 0.0,
        })
        return metrics, corrections

    # -- trainer side (every rank) ----------------------------------------------------
    def draw(self, new: list[Correction], step: int, n_rl: int) -> list[Sample]:
        """Rank 0: add this step's corrections to the buffer and draw ``sft_ratio · n_rl`` SFT
        samples (train mode; observe mode only buffers)."""
        self.buffer.add(new)
        if self.g.mode != "train":
            return []
        out = []
        for c in self.buffer.draw(round(self.g.sft_ratio * n_rl), step):
            images = c.images
            if c.n_images and images is None:
                images = self.resolve_images(c.sample_id, c.k) if self.resolve_images else None
                if images is None or len(images) != c.n_images:
                    self.dropped_on_resume += 1
                    continue
                c.images = images
            out.append(Sample(c.input_ids, c.loss_mask, [0.0] * len(c.input_ids), images, 0.0, "sft"))
        return out

    def nll_backward(self, trainer, samples: list[Sample], n_global: float) -> tuple[float, int]:
        """Backward of λ · (Σ NLL of this rank's corrected-thought tokens) / (their count over all
        ranks); returns (NLL sum, token count) of this rank. Collective-safe: every rank holds the
        same number of samples (zero-mask padding)."""
        scale = trainer.d.world_size / max(n_global, 1.0)
        nll_tot, n_tot = 0.0, 0
        for s in samples:
            logp, _ = trainer._forward_logps(trainer.actor, s, temperature=1.0)
            mask = torch.tensor(s.loss_mask[1:], device=logp.device)
            nll, n = sft_nll(logp, mask)
            (self.g.sft_weight * nll * scale).backward()
            nll_tot += float(nll.detach())
            n_tot += n
        return nll_tot, n_tot

    def save(self, ckpt: Path) -> None:
        self.buffer.save(Path(ckpt) / BUFFER_FILE)

    def load(self, ckpt: Path) -> None:
        p = Path(ckpt) / BUFFER_FILE
        if self.is_main and p.exists():
            self.buffer.load(p)
            log.info("GTR buffer restored: %d corrections", len(self.buffer.items))

    async def aclose(self) -> None:
        if isinstance(self.corrector, LLMCorrector):
            await self.corrector.close()


def _find_world(train_data: list[str]) -> str:
    """The synthetic world folder of an RL parquet (``<world>/local/x.parquet`` or ``<world>/parquet/x``)."""
    for p in train_data:
        for parent in Path(p).resolve().parents:
            if (parent / "world.json").exists():
                return str(parent)
    raise FileNotFoundError(f"gtr.corrector=oracle: no world.json above {train_data}; set gtr.world")
