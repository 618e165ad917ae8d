"""The synthetic world's script: video specs (scenes, events) and the questions asked about them.

Everything is a pure function of ``WorldConfig.seed`` (stable-hash seeded draws)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from paravt.core.seeding import py_rng

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
REPORT_WORDINGS = ("colour_first", "shape_first")
THOUGHT_SIGHTINGS = ("question", "report")
MCQ_OPTIONS = ("random", "fixed")
READING_FORMATS = ("user", "episode", "episode_answer", "mixed")


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
    # tvg: after the coarse round the expert looks again at fine_window_s around the sightings (the
    # paper's second, finer round; its window is arithmetic on the reported times). False: it answers
    # from the coarse sightings (dense enough when coarse_window_s <= crop_max_frames seconds: 1 fps).
    fine_round: bool = True
    # tvg answers pad the sighted frame times by this many seconds ([first - pad, last + pad]; with
    # the overview's spacing the pad is half of it). 0: the answer copies the sighted times.
    tvg_pad_s: float = 0.5
    # random: four colours in random order (the answer's letter is a lookup in the question's options);
    # fixed: each colour always under the same letter (A blue/cyan, B green/magenta, C orange/red,
    # D white/yellow), the other letters one of their two colours, so the letter follows the colour.
    mcq_options: str = "random"
    crop_max_frames: int = 16
    perception_windows: int = 24  # 1-4 s sub-agent windows per train video in paravt_perception_synth.parquet
    # Fraction of the train questions that also get a row without tools (the direct prompt, K overview
    # frames, one answer turn), so "no tools at K" is the model answering from its K frames, not a tool
    # call it cannot make (a fair no-tools arm). 0: none.
    direct_rows: float = 0.0
    reading_rows: int = 3000  # text-only reading rows (reports -> answer) in paravt_reading_synth.parquet
    # user: the reports and the question in one user message, the answer;
    # episode: the main agent's own conversation without overview frames (system prompt, question,
    # the expert's crop calls, the perfect reports as tool messages, the expert's answer turns);
    # episode_answer: the same with only the last assistant turn supervised (the others "weight": 0);
    # mixed: every other row in each of user and episode (the probe reads the first, episodes the second)
    reading_format: str = "user"
    # Fraction of the user-format reading rows that carry the world's system prompt (system_mode) as a
    # system message, spread evenly (0: none). The tiny model's copy learnt on ~210-token rows fails at
    # episode length (teacher-forced, same rows: 100% -> 55% with the 480-token prompt before them;
    # docs/RESULTS.md, "reading curriculum"): rows with the long prefix teach the copy at the length it is used.
    reading_system_frac: float = 0.0
    # Also write the later phases of the tiny main agent's reading lessons (docs/RESULTS.md, "reading curriculum"):
    # paravt_reading_long_synth.parquet (the same tasks, user format, every other row after the system
    # prompt: the copy kept at episode length) and paravt_reading_episode_synth.parquet (the same tasks,
    # every other row as the main agent's own episode: the copy into tool messages and the answer tag).
    # The quickstart trains on them in turn after paravt_reading_synth.parquet (SFT_PHASES).
    reading_curriculum: bool = False
    # The user-format reading answers end as the episode's last turn does: "<think>\n...</think>\n<answer>X</answer>".
    # The tag's colour ("yellow") is another token than the thought's (" yellow") and is predicted only in
    # the open answers' tags otherwise: without these rows the tiny agent's open answers are one constant
    # (measured in docs/RESULTS.md: K = 4 with tools 35.6 -> 67.2 on the same world and perception).
    reading_answer_tags: bool = False
    # How a sighting is worded in the sub-agent reports and the expert's thoughts. colour_first (the
    # default): "A yellow circle is visible from 14.0 to 17.0 seconds."; shape_first:
    # "The circle is yellow, visible from 14.0 to 17.0 seconds." - the key (shape) before the values
    # (colour, times), so the main agent's "The circle is" is continued by copying the report
    # (induction), and no other thought starts "The <shape> is".
    report_wording: str = "colour_first"
    # False: the sub-agent reports name no shape ("A yellow shape is visible from 14.0 to 17.0 seconds."):
    # the tiny model perceives colour far better than shape (colour+shape ~30% on held-out crops), and a
    # token it is trained to predict but cannot see drifts to the prior; with one event per video the
    # question's shape is the only one, so the answer needs no shape from the reports.
    report_shapes: bool = True
    # How the main agent's thought says what the reports found (colour_first reports). question (the
    # default): in the question's words, the colour after the times ("The square is visible from 64.5 to
    # 66.5 seconds. It is yellow."); report: the matching report's sentence word for word, then the answer
    # sentence ("A yellow shape is visible from 64.5 to 66.5 seconds. It is yellow."), so the colour is
    # copied forward like the times (the token after the report's "A"), not looked up backwards from them.
    # shape_first reports are always copied as they are.
    thought_sighting: str = "question"
    system_mode: str = "agentic_general"
    # The cold start's tool habit. None: the expert's rule, a row calls tools exactly when its K-frame
    # overview misses the event (so the SFT policy's calls already depend on K). A rate p: each main
    # row calls tools by a seeded coin with probability p, independent of K and of what the overview
    # shows; a row that does not call answers from its overview, and where the overview missed the
    # event it guesses (a seeded option, colour or span), never the gold answer for free. RL then has
    # the K-dependence of calling to learn.
    sft_tool_rate: float | None = None
    # With sft_tool_rate: the call-or-skip decision as its own sentence after what the overview shows,
    # the same words wherever the event was seen or missed: "... I will check N windows ..." or
    # "... I will answer from them." Off: a seen event's call hangs on the sighting ("...; the crops
    # will show it at 1 fps.") and a skip ends it with "." as every sighting of the reading rows does.
    # (Either way, on seed 0 the tiny SFT policy called far less at K = 64 than its rows do.)
    habit_sentence: bool = False
    # The episode rows of the reading lessons (reading_format episode/mixed, the reading_episode phase) are
    # made without an overview, so their first turn always says "... not visible in the overview frames.
    # I will check N windows ...". True: that turn is supervised with the rest. False: only the answer
    # turns are (as episode_answer does): the lessons teach reading the reports, not when to call. With
    # sft_tool_rate this matters: supervised, 1,500 such turns after 'not visible' taught the tiny cold
    # start to call when the overview misses the event and skip when it shows it, the K-dependence the
    # habit's coin is there to remove (docs/RESULTS.md, "where the cold start's K-dependence comes from").
    reading_episode_calls: bool = True
    # Videos whose questions are the RL prompts and that the cold start never saw (0: the RL prompts
    # are the SFT videos' questions).
    n_rl_videos: int = 0

    def __post_init__(self):
        if self.sft_tool_rate is not None and not 0.0 <= self.sft_tool_rate <= 1.0:
            raise ValueError(f"sft_tool_rate must be in [0, 1] or None, got {self.sft_tool_rate}")
        if self.n_rl_videos < 0:
            raise ValueError(f"n_rl_videos must be >= 0, got {self.n_rl_videos}")
        if not (0 < self.min_duration <= self.max_duration):
            raise ValueError(f"min_duration/max_duration: {self.min_duration}/{self.max_duration}")
        if not (1 <= self.min_events <= self.max_events <= len(SHAPES)):
            raise ValueError(f"events per video must be within 1..{len(SHAPES)}")
        if self.max_event_s * self.max_events * 3 > self.min_duration:
            raise ValueError("videos too short for their events")
        if self.perception_windows < 0 or self.reading_rows < 0:
            raise ValueError(f"perception_windows/reading_rows must be >= 0, got {self.perception_windows}/{self.reading_rows}")
        if not 0.0 <= self.direct_rows <= 1.0:
            raise ValueError(f"direct_rows must be in [0, 1], got {self.direct_rows}")
        if not 0.0 <= self.reading_system_frac <= 1.0:
            raise ValueError(f"reading_system_frac must be in [0, 1], got {self.reading_system_frac}")
        if self.reading_format not in READING_FORMATS:
            raise ValueError(f"reading_format must be one of {', '.join(READING_FORMATS)}, got {self.reading_format!r}")
        if self.mcq_options not in MCQ_OPTIONS:
            raise ValueError(f"mcq_options must be one of {', '.join(MCQ_OPTIONS)}, got {self.mcq_options!r}")
        if self.tvg_pad_s < 0 or self.coarse_window_s <= 0 or self.fine_window_s <= 0:
            raise ValueError(f"tvg_pad_s must be >= 0 and window lengths > 0, got {self.tvg_pad_s}/{self.coarse_window_s}/{self.fine_window_s}")
        if self.report_wording not in REPORT_WORDINGS:
            raise ValueError(f"report_wording must be one of {', '.join(REPORT_WORDINGS)}, got {self.report_wording!r}")
        if self.thought_sighting not in THOUGHT_SIGHTINGS:
            raise ValueError(f"thought_sighting must be one of {', '.join(THOUGHT_SIGHTINGS)}, got {self.thought_sighting!r}")


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


def mcq_slot(colour: str) -> int:
    """``mcq_options="fixed"``: the option index of a colour (two colours per letter, sorted names)."""
    return sorted(COLOURS).index(colour) // 2


def make_question(spec: VideoSpec, ev: Event, qtype: str, r, mcq_options: str = "random") -> dict[str, Any]:
    if qtype == "tvg":
        text = f"When does the {ev.colour} {ev.shape} appear? Answer with [start, end] in seconds."
        answer: Any = f"[{ev.start:.1f}, {ev.end:.1f}]"
    elif qtype == "mcq":
        letters = "ABCD"
        if mcq_options == "fixed":
            names = sorted(COLOURS)
            options = [ev.colour if k == mcq_slot(ev.colour) else r.choice(names[2 * k:2 * k + 2]) for k in range(4)]
        else:
            others = r.sample([c for c in sorted(COLOURS) if c != ev.colour], 3)
            options = others + [ev.colour]
            r.shuffle(options)
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
        opts = ", ".join(f"{l}. {o}" for l, o in zip("ABCD", q["options"]))  # as the question writes them
        return f"The question asks the colour of the {q['shape']} as an option letter: {opts}."
    if q["question_type"] == "oe":
        return f"The question asks the colour of the {q['shape']} in one word."
    return f"The question asks when the {q['colour']} {q['shape']} appears, as [start, end] in seconds."
