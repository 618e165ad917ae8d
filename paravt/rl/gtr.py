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

(:func:`paravt.rl.grpo.gtr_objective`, the function the trainer backpropagates) over the SFT
samples :meth:`GTR.draw` returns, drawn from the buffer at ``sft_ratio`` per RL sample (1:1 as
in GTR), no ratio, clip or KL on them. The rollouts themselves are never replaced. ``mode:
observe`` judges and logs the collapse metrics without the NLL term (a cheap diagnostic for any
run).

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from paravt.core.scoring import ANSWER_RE, extract_span, normalize_answer, temporal_iou
from paravt.core.seeding import stable_hash
from paravt.models.images import ImageInputs
from paravt.models.tokenize import encode_text
from paravt.rl.rollout import Sample

log = logging.getLogger("paravt.rl.gtr")

BUFFER_FILE = "gtr_buffer.json"

from paravt.rl.gtr_correctors import Corrector, LLMCorrector, OracleCorrector, first_thought, turn_states


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


# ---------------------------------------------------------------------------------------
# The component the trainer holds
# ---------------------------------------------------------------------------------------

class GTR:
    """Rank 0 judges and buffers (in the rollout thread) and draws each step's SFT samples; the trainer
    adds their NLL term (:func:`paravt.rl.grpo.gtr_objective`, the objective it backpropagates)."""

    def __init__(self, cfg, processor, is_main: bool):
        self.cfg, self.g, self.processor, self.is_main = cfg, cfg.gtr, processor, is_main
        self.buffer = CorrectionBuffer(self.g.buffer_size, cfg.seed)
        self.corrector: Corrector | None = None
        self.resolve_images: Callable[[str, int], Any] | None = None  # set by attach()
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

    def attach(self, images_of: Callable[[str, int], Any]) -> None:
        """Rank 0: where a buffered correction's images come from once they are gone (after a resume):
        ``images_of(sample_id, K)``, the K-frame overview that prompt's episodes saw (None: unknown)."""
        self.resolve_images = images_of

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
