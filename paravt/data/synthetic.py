"""The synthetic long-video world of the embedded default.

``python -m paravt.data.synthetic --out DIR [--seed S]`` writes, deterministically:

* real mp4 videos (H.264, 64×64, 2 fps, 40–120 s) under ``DIR/media/`` in two of the released
  buckets (``selfqa/`` and ``longvt_source/synthetic/``): dark scenes whose background
  changes at scene cuts, a small grey square drifting all the time (a distractor), and 1–3
  short **events**: a coloured shape (circle / square / triangle, one of eight colours)
  visible for 2–4 s at a random time;
* parquets in the released schemas with **sentinel-relative** paths under ``DIR/parquet/``:
  ``paravt_sft_synth.parquet`` (expert main-agent trajectories and sub-agent examples),
  ``paravt_perception_synth.parquet`` (sub-agent examples on 1-4 s windows: the tiny model's
  visual pretraining, see :func:`short_window_rows`),
  ``paravt_rl_synth.parquet`` (RL prompts) and ``paravt_eval_synth.parquet`` (held-out videos);
* ``DIR/world.json`` (every video's script) and ``DIR/world_stats.json`` (sizes, and how often
  the asked event is visible in a K-frame overview: the Tool Necessity Gap).

Questions (one of each per event): ``mcq`` "What colour is the triangle?" with options A–D,
``oe`` the same question answered with a word, ``tvg`` "When does the red triangle appear?"
answered with ``[start, end]``. An event of 2–4 s is always caught by 64 overview frames of a
≤120 s video (spacing ≤ 1.9 s) and usually missed by 4 (spacing 10–30 s); a crop of the
right window at 1 fps always shows it. So tools are needed at small K and not at large K.

Expert trajectories follow REFERENCE §1: ``<think>`` → either an ``<answer>`` (event seen in
the overview) or several parallel ``crop_video`` calls in ONE turn covering the video →
``<tool_response>`` summaries → answer; temporal questions take a second, finer round.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

from paravt.core.prompts import THINK_PREFIX, subagent_prompt, system_prompt
from paravt.core.seeding import py_rng
from paravt.core.toolcall import format_tool_call
from paravt.core.video import crop_timestamps, overview_timestamps

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30),
    "green": (30, 200, 50),
    "blue": (40, 80, 250),
    "yellow": (245, 225, 30),
    "white": (250, 250, 250),
    "magenta": (225, 40, 225),
    "cyan": (30, 225, 225),
    "orange": (250, 140, 10),
}
SHAPES = ("circle", "square", "triangle")
BACKGROUNDS = [(12, 12, 12), (14, 14, 60), (60, 14, 14), (14, 50, 14), (45, 30, 10), (40, 10, 50)]
OVERVIEW_KS = (4, 8, 16, 32, 64)
QUESTION_TYPES = ("mcq", "oe", "tvg")


@dataclass
class WorldConfig:
    seed: int = 0
    n_train_videos: int = 120
    n_eval_videos: int = 40
    min_duration: int = 40
    max_duration: int = 120
    fps: int = 2
    size: int = 64
    min_events: int = 1
    max_events: int = 3
    min_event_s: float = 2.0
    max_event_s: float = 4.0
    coarse_window_s: float = 30.0  # expert's first-round crop length (16 frames → ≤1.9 s apart)
    fine_window_s: float = 12.0  # expert's temporal-refinement crop length (1 fps)
    crop_max_frames: int = 16
    # random crop windows per train video, as extra sub-agent SFT rows. 0: the perception stage now
    # teaches the sub-agent skill, and 4 (the old default) diluted the main-agent rows of the SFT mix
    # (K = 4 with tools on 90 held-out questions: 2.2% with 4, 7.8% with 0; session-2 measurement).
    extra_subagent_windows: int = 0
    short_subagent_windows: int = 0  # 1-4 s sub-agent windows per train video mixed into the SFT parquet
    perception_windows: int = 24  # 1-4 s sub-agent windows per train video in paravt_perception_synth.parquet
    text_skill_rows: int = 0  # text-only copy / lookup rows in paravt_text_synth.parquet (tried mixed into perception: no copying, perception lost)
    text_only_main_rows: bool = False  # SFT: also each tool-path expert trace with no overview frames (tried: no clear gain)
    system_mode: str = "agentic_general"

    def __post_init__(self):
        if not (0 < self.min_duration <= self.max_duration):
            raise ValueError(f"min_duration/max_duration: {self.min_duration}/{self.max_duration}")
        if not (1 <= self.min_events <= self.max_events <= len(SHAPES)):
            raise ValueError(f"events per video must be within 1..{len(SHAPES)}")
        if self.max_event_s * self.max_events * 3 > self.min_duration:
            raise ValueError("videos too short for their events")


@dataclass
class Event:
    shape: str
    colour: str
    start: float
    end: float
    x: int
    y: int
    size: int

    def visible_at(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass
class VideoSpec:
    id: str
    rel_path: str  # sentinel-relative path, as in the released parquets
    duration: int
    fps: int
    size: int
    scenes: list[tuple[float, int]]  # (start time, background index)
    events: list[Event] = field(default_factory=list)

    @property
    def num_frames(self) -> int:
        return self.duration * self.fps

    @property
    def name(self) -> str:
        return Path(self.rel_path).name


# ---------------------------------------------------------------------------------------
# Videos
# ---------------------------------------------------------------------------------------

def make_spec(cfg: WorldConfig, split: str, i: int) -> VideoSpec:
    r = py_rng(cfg.seed, "video", split, i)
    vid = f"{split}_{i:04d}"
    # File names do not tell the split: the model copies the name into its calls, and a tiny model
    # that only ever wrote "train_…" degenerates on "eval_…" (measured). Train videos are clip_0000…,
    # eval videos continue the numbering.
    offset = {"train": 0, "eval": cfg.n_train_videos}.get(split, cfg.n_train_videos + cfg.n_eval_videos)
    name = f"clip_{offset + i:04d}.mp4"
    rel = f"selfqa/{name}" if i % 2 == 0 else f"longvt_source/synthetic/{name}"
    duration = r.randint(cfg.min_duration, cfg.max_duration)
    scenes, t = [], 0.0
    while t < duration:
        scenes.append((t, r.randrange(len(BACKGROUNDS))))
        t += r.randint(10, 30)
    n_events = r.randint(cfg.min_events, cfg.max_events)
    shapes = r.sample(SHAPES, n_events)
    colours = r.sample(sorted(COLOURS), n_events)
    # Non-overlapping slots: split the video into n_events equal parts, one event in each.
    events = []
    part = duration / n_events
    for k in range(n_events):
        length = r.choice(np.arange(cfg.min_event_s, cfg.max_event_s + 0.01, 0.5).tolist())
        lo, hi = k * part + 1.0, (k + 1) * part - length - 1.0
        start = round(r.uniform(lo, hi) * 2) / 2
        sz = r.randint(22, 30)
        events.append(Event(shapes[k], colours[k], start, start + length,
                            r.randint(2, cfg.size - sz - 2), r.randint(2, cfg.size - sz - 2), sz))
    return VideoSpec(vid, rel, duration, cfg.fps, cfg.size, scenes, events)


def _background(spec: VideoSpec, t: float) -> tuple[int, int, int]:
    idx = [b for s, b in spec.scenes if s <= t][-1]
    return BACKGROUNDS[idx]


def render_frame(spec: VideoSpec, t: float) -> np.ndarray:
    img = Image.new("RGB", (spec.size, spec.size), _background(spec, t))
    d = ImageDraw.Draw(img)
    # Distractor: a small grey square drifting across the frame.
    gx = int((t * 3) % (spec.size - 8))
    gy = int(spec.size - 12 - 6 * math.sin(t / 5))
    d.rectangle([gx, gy, gx + 6, gy + 6], fill=(110, 110, 110))
    for ev in spec.events:
        if ev.visible_at(t):
            box = [ev.x, ev.y, ev.x + ev.size, ev.y + ev.size]
            col = COLOURS[ev.colour]
            if ev.shape == "circle":
                d.ellipse(box, fill=col)
            elif ev.shape == "square":
                d.rectangle(box, fill=col)
            else:
                d.polygon([(ev.x + ev.size / 2, ev.y), (ev.x, ev.y + ev.size), (ev.x + ev.size, ev.y + ev.size)], fill=col)
    return np.asarray(img)


def write_video(spec: VideoSpec, path: Path) -> None:
    import av  # noqa: PLC0415

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.mp4")
    with av.open(str(tmp), mode="w") as container:
        stream = container.add_stream("libx264", rate=spec.fps)
        stream.width = stream.height = spec.size
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "12", "preset": "veryfast", "threads": "1", "bframes": "0"}
        stream.codec_context.thread_count = 1
        for i in range(spec.num_frames):
            frame = av.VideoFrame.from_ndarray(render_frame(spec, i / spec.fps), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------
# Questions and expert traces
# ---------------------------------------------------------------------------------------

def make_question(spec: VideoSpec, ev: Event, qtype: str, r) -> dict[str, Any]:
    if qtype == "tvg":
        text = f"When does the {ev.colour} {ev.shape} appear? Answer with [start, end] in seconds."
        answer: Any = f"[{ev.start:.1f}, {ev.end:.1f}]"
    elif qtype == "mcq":
        others = r.sample([c for c in sorted(COLOURS) if c != ev.colour], 3)
        options = others + [ev.colour]
        r.shuffle(options)
        letters = "ABCD"
        text = f"What colour is the {ev.shape}?\n" + "\n".join(f"{l}. {o}" for l, o in zip(letters, options))
        text += "\nAnswer with the option letter."
        answer = letters[options.index(ev.colour)]
    else:
        text = f"What colour is the {ev.shape}? Answer with one word."
        answer = ev.colour
    return {"question": text, "answer": answer, "question_type": qtype, "shape": ev.shape, "colour": ev.colour,
            "span": [ev.start, ev.end], "options": options if qtype == "mcq" else None}


def restate(q: dict[str, Any]) -> str:
    """The expert's first sentence: what the question asks and in which form to answer. Later
    turns read the task from here, a few tokens back, instead of from the question past the
    frames and tool responses (a tiny model learns that far sooner)."""
    if q["question_type"] == "mcq":
        opts = ", ".join(f"{l} {o}" for l, o in zip("ABCD", q["options"]))
        return f"The question asks the colour of the {q['shape']} as an option letter: {opts}."
    if q["question_type"] == "oe":
        return f"The question asks the colour of the {q['shape']} in one word."
    return f"The question asks when the {q['colour']} {q['shape']} appears, as [start, end] in seconds."


def _answer_sentence(q: dict[str, Any]) -> str:
    if q["question_type"] == "mcq":
        return f"It is {q['colour']}, option {q['answer']}."
    return f"It is {q['colour']}."


def describe_window(spec: VideoSpec, timestamps: list[float]) -> str:
    """The expert sub-agent summary of the frames at ``timestamps``."""
    if not timestamps:
        return "No frames."
    lines = []
    for ev in sorted(spec.events, key=lambda e: e.start):
        seen = [t for t in timestamps if ev.visible_at(t)]
        if seen:
            if len(seen) == 1:
                lines.append(f"A {ev.colour} {ev.shape} is visible at {seen[0]:.1f} seconds.")
            else:
                lines.append(f"A {ev.colour} {ev.shape} is visible from {seen[0]:.1f} to {seen[-1]:.1f} seconds.")
    if not lines:
        return f"From {timestamps[0]:.1f} to {timestamps[-1]:.1f} seconds no coloured shape is visible."
    return " ".join(lines)


def _answer_text(q: dict[str, Any], span: tuple[float, float] | None = None) -> str:
    if q["question_type"] == "tvg":
        s, e = span
        return f"[{s:.1f}, {e:.1f}]"
    return q["answer"]


def _windows(duration: float, length: float) -> list[tuple[float, float]]:
    n = max(1, math.ceil(duration / length))
    step = duration / n
    return [(round(i * step, 1), round(min(duration, (i + 1) * step), 1)) for i in range(n)]


def expert_trajectory(spec: VideoSpec, q: dict[str, Any], k: int, cfg: WorldConfig) -> dict[str, Any]:
    """Assistant turns and tool responses of the expert for question ``q`` at overview budget k.

    Returns {"turns": [assistant text, [tool texts], assistant text, ...], "crops": [(s, e), ...]}."""
    ev = next(e for e in spec.events if e.shape == q["shape"])
    ov = overview_timestamps(spec.num_frames, spec.fps, k)
    seen = [t for t in ov if ev.visible_at(t)]
    spacing = spec.duration / max(1, len(ov))
    turns: list[Any] = []
    crops: list[tuple[float, float]] = []
    desc = f"the {ev.colour} {ev.shape}" if q["question_type"] == "tvg" else f"the {ev.shape}"

    def lead(text: str) -> str:  # the first turn opens with the restated task
        return f"{restate(q)} {text}" if not turns else text

    def crop_call(s: float, e: float) -> str:
        crops.append((s, e))
        return format_tool_call("crop_video", {"video_path": spec.name, "start_time": s, "end_time": e})

    def crop_response(s: float, e: float) -> tuple[str, list[float]]:
        ts = crop_timestamps(spec.num_frames, spec.fps, s, e, 1.0, 1, cfg.crop_max_frames)
        return describe_window(spec, ts), [t for t in ts if ev.visible_at(t)]

    def fine_round(centre_lo: float, centre_hi: float, why: str) -> None:
        half = cfg.fine_window_s / 2
        mid = (centre_lo + centre_hi) / 2
        s = round(max(0.0, mid - half), 1)
        e = round(min(float(spec.duration), s + cfg.fine_window_s), 1)
        turns.append(f"{THINK_PREFIX}{lead(why)} I will look closely at {s:.1f} to {e:.1f} seconds.\n</think>\n" + crop_call(s, e))
        text, hits = crop_response(s, e)
        turns.append([text])
        a, b = (hits[0], hits[-1]) if hits else (s, e)
        span = (max(0.0, a - 0.5), min(float(spec.duration), b + 0.5))
        turns.append(f"{THINK_PREFIX}{desc.capitalize()} is visible from {a:.1f} to {b:.1f} seconds.\n</think>\n"
                     f"<answer>{_answer_text(q, span)}</answer>")

    if seen:
        where = f"at {seen[0]:.1f} seconds" if len(seen) == 1 else f"from {seen[0]:.1f} to {seen[-1]:.1f} seconds"
        if q["question_type"] != "tvg":
            turns.append(f"{THINK_PREFIX}{lead(f'In the overview {desc} is visible {where}.')} {_answer_sentence(q)}\n</think>\n"
                         f"<answer>{_answer_text(q)}</answer>")
        elif spacing <= 2.0:
            span = (max(0.0, seen[0] - spacing / 2), min(float(spec.duration), seen[-1] + spacing / 2))
            turns.append(f"{THINK_PREFIX}{lead(f'In the overview {desc} is visible {where}.')}\n</think>\n"
                         f"<answer>{_answer_text(q, span)}</answer>")
        else:
            fine_round(seen[0], seen[-1], f"In the overview {desc} is visible {where}, but the frames are sparse.")
        return {"turns": turns, "crops": crops}

    windows = _windows(spec.duration, cfg.coarse_window_s)
    calls = "\n".join(crop_call(s, e) for s, e in windows)
    turns.append(f"{THINK_PREFIX}{lead(desc.capitalize() + ' is not visible in the overview frames.')} "
                 f"I will check {len(windows)} windows of the video in parallel.\n</think>\n{calls}")
    responses, hits = [], []
    for s, e in windows:
        text, h = crop_response(s, e)
        responses.append(text)
        hits += h
    turns.append(responses)
    if not hits:  # cannot happen with the default knobs; keep the trace well-formed anyway
        turns.append(f"{THINK_PREFIX}{desc.capitalize()} was not found.\n</think>\n<answer>unknown</answer>")
    elif q["question_type"] != "tvg":
        turns.append(f"{THINK_PREFIX}{desc.capitalize()} is visible from {hits[0]:.1f} to {hits[-1]:.1f} seconds. "
                     f"{_answer_sentence(q)}\n</think>\n<answer>{_answer_text(q)}</answer>")
    else:
        fine_round(hits[0], hits[-1], f"{desc.capitalize()} is visible near {hits[0]:.1f} seconds.")
    return {"turns": turns, "crops": crops}


# ---------------------------------------------------------------------------------------
# Rows in the released schemas
# ---------------------------------------------------------------------------------------

def _video_header(spec: VideoSpec) -> str:
    return f"Video: {spec.name}\nDuration: {float(spec.duration):.1f} seconds\n"


def rl_record(spec: VideoSpec, q: dict[str, Any], qid: str) -> dict[str, Any]:
    extra = {"id": qid, "video_id": spec.id, "answer": q["answer"], "question_type": q["question_type"], "duration": float(spec.duration),
             "video_name": spec.name, "span": q["span"], "shape": q["shape"], "colour": q["colour"]}
    return {
        "prompt": [{"role": "user", "content": f"<video>\n{q['question']}"}],
        "videos": [{"video": spec.rel_path}],
        "extra_info": json.dumps(extra, sort_keys=True),
    }


def sft_main_messages(spec: VideoSpec, q: dict[str, Any], k: int, traj: dict[str, Any], system: str) -> list[dict[str, Any]]:
    """The main agent's conversation; ``k == 0``: text only (no overview frames)."""
    video = [{"type": "video_url", "video_url": {"url": spec.rel_path}, "nframes": k}] if k else []
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": [{"type": "text", "text": system}]},
        {"role": "user", "content": [{"type": "text", "text": _video_header(spec)}, *video,
                                     {"type": "text", "text": "\n" + q["question"]}]},
    ]
    for turn in traj["turns"]:
        if isinstance(turn, list):
            msgs.extend({"role": "tool", "content": [{"type": "text", "text": t}]} for t in turn)
        else:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": turn}]})
    return msgs


def sft_subagent_messages(spec: VideoSpec, s: float, e: float, cfg: WorldConfig) -> list[dict[str, Any]]:
    ts = crop_timestamps(spec.num_frames, spec.fps, s, e, 1.0, 1, cfg.crop_max_frames)
    return [
        {"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": spec.rel_path}, "video_start": s, "video_end": e,
             "fps": 1.0, "max_frames": cfg.crop_max_frames},
            {"type": "text", "text": "\n" + subagent_prompt(s, e)},
        ]},
        {"role": "assistant", "content": [{"type": "text", "text": describe_window(spec, ts)}]},
    ]


def short_window_rows(spec: VideoSpec, cfg: WorldConfig, tag: str, n: int) -> list[dict[str, Any]]:
    """Sub-agent rows on 1-4 s windows (1-4 frames at 1 fps), two thirds of them on an event.

    The same task as every other sub-agent row, with a dense perception signal: a random-init
    tiny model first learns here to see colours and shapes and to copy frame times, which the
    real base model (Qwen3-VL-8B) brings from its pretraining."""
    r = py_rng(cfg.seed, f"{tag}-windows", spec.id)
    rows = []
    for j in range(n):
        length = float(r.randint(1, 4))
        if j % 3 != 2:
            ev = r.choice(spec.events)
            centre = r.uniform(ev.start, ev.end)
        else:
            centre = r.uniform(0, spec.duration)
        rows.append(window_row(spec, cfg, f"{spec.id}_{tag}{j}", centre, length))
    return rows


COPY_WORDS = (*sorted(COLOURS), *SHAPES, "A", "B", "C", "D", "option", "visible", "from", "to", "at", "seconds",
              "the", "is", "no", "coloured", "shape", "window", "question", "colour", "appears")


def lookup_example(cfg: WorldConfig, split: str, j: int, r) -> dict[str, Any] | None:
    """A text-only reading task: the reports a perfect sub-agent writes for the coarse windows of a
    random, unrendered video (``make_spec(cfg, split, j)``) plus a question about one event. The
    answer restates the task and copies the matching report's times and colour, in the words of
    the expert traces. None when the coarse frames miss the event."""
    spec = make_spec(cfg, split, j)
    ev = r.choice(spec.events)
    q = make_question(spec, ev, r.choice(QUESTION_TYPES), r)
    reports, hits = [], []
    for s, e in _windows(spec.duration, cfg.coarse_window_s):
        ts = crop_timestamps(spec.num_frames, spec.fps, s, e, 1.0, 1, cfg.crop_max_frames)
        reports.append(f"[{s:.1f}-{e:.1f} s] {describe_window(spec, ts)}")
        hits += [t for t in ts if ev.visible_at(t)]
    if not hits:
        return None
    desc = f"The {ev.colour} {ev.shape}" if q["question_type"] == "tvg" else f"The {ev.shape}"
    answer = f"{restate(q)} {desc} is visible from {hits[0]:.1f} to {hits[-1]:.1f} seconds."
    if q["question_type"] != "tvg":
        answer += f" {_answer_sentence(q)}"
    return {"user": "Reports:\n" + "\n".join(reports) + f"\n{q['question']}", "answer": answer, "question": q,
            "hits": [hits[0], hits[-1]]}


def text_skill_rows(cfg: WorldConfig, n: int) -> list[dict[str, Any]]:
    """Text-only reading practice for the random-init tiny base (no video, no system prompt).

    Qwen3-VL-8B arrives able to copy from its context; the tiny model does not, and the cold-start
    data alone does not teach it in a CPU budget (measured: after SFT its next-token logits for the
    restated shape did not move when the question's shape was swapped). Half the rows are "repeat
    exactly" over random word/number strings (induction copying), half are ``lookup_example``s."""
    r = py_rng(cfg.seed, "text-skills")
    rows = []
    for j in range(n):
        if j % 2 == 0:
            words = [r.choice(COPY_WORDS) if r.random() < 0.6 else
                     (f"clip_{r.randrange(10000):04d}.mp4" if r.random() < 0.2 else f"{r.randrange(2400) / 2:.1f}")
                     for _ in range(r.randint(4, 24))]
            text = " ".join(words)
            user, answer = f"Repeat exactly: {text}", text
        else:
            ex = lookup_example(cfg, "text", j, r)
            if ex is None:
                continue
            user, answer = ex["user"], ex["answer"]
        rows.append({"id": f"text_{j:05d}", "kind": "text", "nframes": 0, "videos": [],
                     "messages": json.dumps([{"role": "user", "content": [{"type": "text", "text": user}]},
                                             {"role": "assistant", "content": [{"type": "text", "text": answer}]}])})
    return rows


def subagent_row(spec: VideoSpec, cfg: WorldConfig, row_id: str, s: float, e: float) -> dict[str, Any]:
    return {"id": row_id, "kind": "subagent", "nframes": 0,
            "messages": json.dumps(sft_subagent_messages(spec, s, e, cfg)), "videos": [{"video": spec.rel_path}]}


def window_row(spec: VideoSpec, cfg: WorldConfig, row_id: str, centre: float, length: float) -> dict[str, Any]:
    """A sub-agent row on a ``length``-second window around ``centre``, kept inside the video."""
    s = round(max(0.0, min(spec.duration - length, centre - length / 2)), 1)
    e = round(min(float(spec.duration), s + length), 1)
    return subagent_row(spec, cfg, row_id, s, e)


def _write_parquet(records: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(pa.Table.from_pylist(records), tmp)
    os.replace(tmp, path)


def build_world(out: str | Path, cfg: WorldConfig | None = None, progress: bool = True) -> dict[str, Any]:
    cfg = cfg or WorldConfig()
    out = Path(out)
    media, parquet_dir = out / "media", out / "parquet"
    t0 = time.time()
    system = system_prompt(cfg.system_mode)
    specs = {"train": [make_spec(cfg, "train", i) for i in range(cfg.n_train_videos)],
             "eval": [make_spec(cfg, "eval", i) for i in range(cfg.n_eval_videos)]}
    all_specs = specs["train"] + specs["eval"]
    try:
        from tqdm import tqdm  # noqa: PLC0415

        it = tqdm(all_specs, desc="synthetic videos", disable=not progress)
    except ImportError:  # pragma: no cover
        it = all_specs
    for spec in it:
        path = media / spec.rel_path
        if not path.exists():
            write_video(spec, path)

    sft, rl, ev_rows = [], [], []
    n_sub = n_text = 0
    for split, rows in (("train", rl), ("eval", ev_rows)):
        for spec in specs[split]:
            r = py_rng(cfg.seed, "questions", spec.id)
            for ei, ev in enumerate(spec.events):
                for qtype in QUESTION_TYPES:
                    q = make_question(spec, ev, qtype, r)
                    qid = f"{spec.id}_e{ei}_{qtype}"
                    rows.append(rl_record(spec, q, qid))
                    if split != "train":
                        continue
                    k = r.choice(OVERVIEW_KS)
                    traj = expert_trajectory(spec, q, k, cfg)
                    sft.append({"id": qid, "kind": "main", "nframes": k,
                                "messages": json.dumps(sft_main_messages(spec, q, k, traj, system)),
                                "videos": [{"video": spec.rel_path}]})
                    for s, e in traj["crops"]:
                        sft.append(subagent_row(spec, cfg, f"{qid}_sub{n_sub}", s, e))
                        n_sub += 1
                    if cfg.text_only_main_rows:  # the tool path without overview frames (K = 4 trace)
                        t4 = expert_trajectory(spec, q, 4, cfg)
                        if len(t4["turns"]) > 1:
                            sft.append({"id": f"{qid}_text", "kind": "main_text", "nframes": 0,
                                        "messages": json.dumps(sft_main_messages(spec, q, 0, t4, system)),
                                        "videos": [{"video": spec.rel_path}]})
                            n_text += 1
    for spec in specs["train"]:  # extra perception practice: random windows, half of them on an event
        r = py_rng(cfg.seed, "extra-windows", spec.id)
        for j in range(cfg.extra_subagent_windows):
            length = r.uniform(6.0, cfg.coarse_window_s)
            if j % 2 == 0:
                ev = r.choice(spec.events)
                centre = (ev.start + ev.end) / 2 + r.uniform(-length / 3, length / 3)
            else:
                centre = r.uniform(0, spec.duration)
            sft.append(window_row(spec, cfg, f"{spec.id}_win{j}", centre, length))
            n_sub += 1
        sft += short_window_rows(spec, cfg, "short", cfg.short_subagent_windows)
        n_sub += cfg.short_subagent_windows
    perception = [row for spec in specs["train"] for row in short_window_rows(spec, cfg, "perception", cfg.perception_windows)]
    _write_parquet(sft, parquet_dir / "paravt_sft_synth.parquet")
    _write_parquet(perception, parquet_dir / "paravt_perception_synth.parquet")
    text = text_skill_rows(cfg, cfg.text_skill_rows)
    if text:
        _write_parquet(text, parquet_dir / "paravt_text_synth.parquet")
    _write_parquet(rl, parquet_dir / "paravt_rl_synth.parquet")
    _write_parquet(ev_rows, parquet_dir / "paravt_eval_synth.parquet")

    world = {"config": asdict(cfg), "videos": {s.id: asdict(s) for s in all_specs}}
    (out / "world.json").write_text(json.dumps(world, indent=1, sort_keys=True))
    stats = world_stats(specs, cfg)
    stats.update({"sft_rows": len(sft), "perception_rows": len(perception), "text_skill_rows": len(text), "sft_main_rows": len(sft) - n_sub - n_text,
                  "sft_text_only_main_rows": n_text, "sft_subagent_rows": n_sub,
                  "rl_rows": len(rl), "eval_rows": len(ev_rows), "build_seconds": round(time.time() - t0, 2),
                  "media_bytes": sum(p.stat().st_size for p in media.rglob("*.mp4"))})
    (out / "world_stats.json").write_text(json.dumps(stats, indent=2, sort_keys=True))
    return stats


def world_stats(specs: dict[str, list[VideoSpec]], cfg: WorldConfig) -> dict[str, Any]:
    """How often the asked event is visible in a K-frame overview (the Tool Necessity Gap)."""
    visible: dict[str, float] = {}
    for k in OVERVIEW_KS:
        hits = n = 0
        for spec in specs["eval"]:
            ov = overview_timestamps(spec.num_frames, spec.fps, k)
            for ev in spec.events:
                n += 1
                hits += any(ev.visible_at(t) for t in ov)
        visible[str(k)] = round(hits / max(n, 1), 4)
    durations = [s.duration for s in specs["train"] + specs["eval"]]
    return {"eval_event_visible_in_overview": visible, "videos": len(durations),
            "mean_duration_s": round(float(np.mean(durations)), 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paravt.data.synthetic", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder (media/, parquet/, world.json)")
    p.add_argument("--seed", type=int, default=WorldConfig.seed)
    p.add_argument("--n-train-videos", type=int, default=WorldConfig.n_train_videos)
    p.add_argument("--n-eval-videos", type=int, default=WorldConfig.n_eval_videos)
    p.add_argument("--min-duration", type=int, default=WorldConfig.min_duration)
    p.add_argument("--max-duration", type=int, default=WorldConfig.max_duration)
    p.add_argument("--short-subagent-windows", type=int, default=WorldConfig.short_subagent_windows,
                   help="1-4 s sub-agent windows per train video (perception curriculum)")
    p.add_argument("--extra-subagent-windows", type=int, default=WorldConfig.extra_subagent_windows,
                   help="random 6-30 s sub-agent windows per train video added to the SFT parquet")
    p.add_argument("--perception-windows", type=int, default=WorldConfig.perception_windows,
                   help="1-4 s sub-agent windows per train video in paravt_perception_synth.parquet")
    p.add_argument("--text-skill-rows", type=int, default=WorldConfig.text_skill_rows,
                   help="text-only copy / lookup rows in paravt_text_synth.parquet")
    p.add_argument("--system-mode", default=WorldConfig.system_mode,
                   help="system prompt of the expert main-agent traces (a mode of paravt.core.prompts)")
    p.add_argument("--overwrite", action="store_true", help="delete --out first")
    a = p.parse_args(argv)
    if a.overwrite and Path(a.out).exists():
        shutil.rmtree(a.out)
    cfg = WorldConfig(seed=a.seed, n_train_videos=a.n_train_videos, n_eval_videos=a.n_eval_videos,
                      min_duration=a.min_duration, max_duration=a.max_duration,
                      short_subagent_windows=a.short_subagent_windows, perception_windows=a.perception_windows,
                      extra_subagent_windows=a.extra_subagent_windows, system_mode=a.system_mode,
                      text_skill_rows=a.text_skill_rows)
    stats = build_world(a.out, cfg)
    print(json.dumps(stats, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
