"""Expert traces: what a perfect main agent and sub-agent write about a video.

The main agent thinks, then either answers (the event is in the overview) or dispatches several
parallel ``crop_video`` calls in ONE turn covering the video, reads the sub-agents' summaries
and answers; temporal questions take a second, finer round (the paper's §3.1 trajectory). The
parquet rows built from them: :mod:`paravt.data.synthetic.rows`."""

from __future__ import annotations

import math
from typing import Any

from paravt.core.prompts import THINK_PREFIX
from paravt.core.seeding import py_rng
from paravt.core.toolcall import format_tool_call
from paravt.core.video import crop_timestamps, overview_timestamps
from paravt.data.synthetic.world import COLOURS, Event, VideoSpec, WorldConfig, restate


def crop_times(spec: VideoSpec, s: float, e: float, cfg: WorldConfig) -> list[float]:
    """Frame times a sub-agent sees for the crop [s, e] (1 fps, at most ``cfg.crop_max_frames``)."""
    return crop_timestamps(spec.num_frames, spec.fps, s, e, 1.0, 1, cfg.crop_max_frames)


def answer_sentence(q: dict[str, Any]) -> str:
    if q["question_type"] == "mcq":
        return f"It is {q['colour']}, option {q['answer']}."
    return f"It is {q['colour']}."


def sighting(shape: str, colour: str, times: list[float], wording: str = "colour_first", shapes: bool = True) -> str:
    """One sighting in the words of the reports (``WorldConfig.report_wording``): colour_first "A
    yellow circle is visible from 14.0 to 17.0 seconds."; shape_first "The circle is yellow, visible
    from 14.0 to 17.0 seconds." (one frame: "at 14.0 seconds"). ``shapes=False``: "shape" for the shape."""
    shape = shape if shapes else "shape"
    if wording == "shape_first":
        return f"The {shape} is {colour}, visible {where(times)}."
    return f"A {colour} {shape} is visible {where(times)}."


def question_desc(ev: Event, question_type: str) -> str:
    """How the thoughts name the question's event: "the square"; tvg questions name its colour too
    ("the yellow square")."""
    return f"the {ev.colour} {ev.shape}" if question_type == "tvg" else f"the {ev.shape}"


def reads_reports(ev: Event, times: list[float], desc: str, cfg: WorldConfig) -> str:
    """The main agent's thought on what the reports found (``cfg.thought_sighting``): the report's own
    sentence (shape_first reports, or ``thought_sighting="report"``), else the question's words
    (``desc``: "the square", tvg "the yellow square") with the report's times."""
    if cfg.report_wording == "shape_first":
        return sighting(ev.shape, ev.colour, times, "shape_first")
    if cfg.thought_sighting == "report":
        return sighting(ev.shape, ev.colour, times, "colour_first", cfg.report_shapes)
    return f"{desc.capitalize()} is visible {where(times)}."


def describe_window(spec: VideoSpec, timestamps: list[float], wording: str = "colour_first", shapes: bool = True) -> str:
    """The expert sub-agent summary of the frames at ``timestamps``."""
    if not timestamps:
        return "No frames."
    lines = []
    for ev in sorted(spec.events, key=lambda e: e.start):
        seen = [t for t in timestamps if ev.visible_at(t)]
        if seen:
            lines.append(sighting(ev.shape, ev.colour, seen, wording, shapes))
    if not lines:
        return f"From {timestamps[0]:.1f} to {timestamps[-1]:.1f} seconds no coloured shape is visible."
    return " ".join(lines)


def where(times: list[float]) -> str:
    """Where in time something is visible, in the words of the sub-agent reports (one frame: "at
    X seconds"; several: "from X to Y seconds"), so the main agent's thought copies a report."""
    if times[0] == times[-1]:
        return f"at {times[0]:.1f} seconds"
    return f"from {times[0]:.1f} to {times[-1]:.1f} seconds"


def answer_text(q: dict[str, Any], span: tuple[float, float] | None = None) -> str:
    if q["question_type"] == "tvg":
        s, e = span
        return f"[{s:.1f}, {e:.1f}]"
    return q["answer"]


def tvg_span(cfg: WorldConfig, duration: float, a: float, b: float, pad: float | None = None) -> tuple[float, float]:
    """A tvg answer's span: the sighted times padded by ``pad`` (default ``cfg.tvg_pad_s``) inside the
    video; with ``tvg_pad_s`` 0 the times themselves (the answer copies them)."""
    pad = cfg.tvg_pad_s if pad is None else pad
    return (max(0.0, a - pad), min(float(duration), b + pad)) if cfg.tvg_pad_s else (a, b)


def cover_windows(duration: float, length: float) -> list[tuple[float, float]]:
    n = max(1, math.ceil(duration / length))
    step = duration / n
    return [(round(i * step, 1), round(min(duration, (i + 1) * step), 1)) for i in range(n)]


def overview_sighting(shape: str, colour: str, desc: str, at: str, wording: str) -> str:
    """The thought that says where the overview shows the event, in the world's report wording."""
    if wording == "shape_first":
        return f"In the overview the {shape} is {colour}, visible {at}."
    return f"In the overview {desc} is visible {at}."


def overview_missing(desc: str, wording: str) -> str:
    """The thought that says the overview misses the event (shape_first: no "<shape> is" outside the
    sightings, so "The circle is" has one continuation to copy)."""
    if wording == "shape_first":
        return f"The overview frames show no {desc[4:]}."
    return f"{desc.capitalize()} is not visible in the overview frames."


def expert_trajectory(spec: VideoSpec, q: dict[str, Any], k: int, cfg: WorldConfig,
                      call: bool | None = None) -> dict[str, Any]:
    """Assistant turns and tool responses of the expert for question ``q`` at overview budget k.
    ``call`` (the cold start's habit, ``WorldConfig.sft_tool_rate``): None — call tools exactly when the
    overview misses the event; True — always call (the overview's sighting, if any, is said and checked);
    False — answer from the overview alone (:func:`overview_answer`).

    Returns {"turns": [assistant text, [tool texts], assistant text, ...], "crops": [(s, e), ...]}."""
    if call is False:
        return {"turns": [overview_answer(spec, q, k, cfg)], "crops": []}
    ev = next(e for e in spec.events if e.shape == q["shape"])
    ov = overview_timestamps(spec.num_frames, spec.fps, k) if k else []  # k = 0: no overview (reading rows)
    seen = [t for t in ov if ev.visible_at(t)]
    spacing = spec.duration / max(1, len(ov))
    turns: list[Any] = []
    crops: list[tuple[float, float]] = []
    desc = question_desc(ev, q["question_type"])
    wording = cfg.report_wording
    shape_first = wording == "shape_first"

    def in_overview(at: str) -> str:
        return overview_sighting(ev.shape, ev.colour, desc, at, wording)

    def padded(a: float, b: float, pad: float | None = None) -> tuple[float, float]:  # tvg_pad_s 0: copy the times
        return tvg_span(cfg, spec.duration, a, b, pad)

    def lead(text: str) -> str:  # the first turn opens with the restated task
        return f"{restate(q)} {text}" if not turns else text

    def crop_call(s: float, e: float) -> str:
        crops.append((s, e))
        return format_tool_call("crop_video", {"video_path": spec.name, "start_time": s, "end_time": e})

    def crop_response(s: float, e: float) -> tuple[str, list[float]]:
        ts = crop_times(spec, s, e, cfg)
        return describe_window(spec, ts, wording, cfg.report_shapes), [t for t in ts if ev.visible_at(t)]

    def fine_round(centre_lo: float, centre_hi: float, why: str) -> None:
        half = cfg.fine_window_s / 2
        mid = (centre_lo + centre_hi) / 2
        s = round(max(0.0, mid - half), 1)
        e = round(min(float(spec.duration), s + cfg.fine_window_s), 1)
        turns.append(f"{THINK_PREFIX}{lead(why)} I will look closely at {s:.1f} to {e:.1f} seconds.\n</think>\n" + crop_call(s, e))
        text, hits = crop_response(s, e)
        turns.append([text])
        a, b = (hits[0], hits[-1]) if hits else (s, e)
        span = padded(a, b)
        turns.append(f"{THINK_PREFIX}{reads_reports(ev, hits or [a, b], desc, cfg)}\n</think>\n<answer>{answer_text(q, span)}</answer>")

    if seen and call is None:
        at = where(seen)
        if q["question_type"] != "tvg":
            turns.append(f"{THINK_PREFIX}{lead(in_overview(at))} {answer_sentence(q)}\n</think>\n"
                         f"<answer>{answer_text(q)}</answer>")
        elif spacing <= 2.0:
            span = padded(seen[0], seen[-1], spacing / 2)
            turns.append(f"{THINK_PREFIX}{lead(in_overview(at))}\n</think>\n"
                         f"<answer>{answer_text(q, span)}</answer>")
        elif cfg.fine_round:
            fine_round(seen[0], seen[-1], f"{in_overview(at)[:-1]}, but the frames are sparse.")
        if turns:
            return {"turns": turns, "crops": crops}

    windows = cover_windows(spec.duration, cfg.coarse_window_s)
    calls = "\n".join(crop_call(s, e) for s, e in windows)
    missing = overview_missing(desc, wording)
    if seen and call and cfg.habit_sentence:  # the sighting said as the skipping rows say it, then the decision
        missing = in_overview(where(seen))
    elif seen and call:  # the habit calls whatever the overview shows: the sighting is checked in the crops
        missing = f"{in_overview(where(seen))[:-1]}; the crops will show it at 1 fps."
    elif seen:  # tvg, sparse overview, no fine round: the coarse round looks again at 1 fps
        missing = f"{in_overview(where(seen))[:-1]}, but the frames are sparse."
    turns.append(f"{THINK_PREFIX}{lead(missing)} "
                 f"I will check {len(windows)} windows of the video in parallel.\n</think>\n{calls}")
    responses, hits = [], []
    for s, e in windows:
        text, h = crop_response(s, e)
        responses.append(text)
        hits += h
    turns.append(responses)
    if not hits:  # cannot happen with the default knobs; keep the trace well-formed anyway
        nothing = f"No {desc[4:]} was found." if shape_first else f"{desc.capitalize()} was not found."
        turns.append(f"{THINK_PREFIX}{nothing}\n</think>\n<answer>unknown</answer>")
    elif q["question_type"] != "tvg":
        turns.append(f"{THINK_PREFIX}{reads_reports(ev, hits, desc, cfg)} {answer_sentence(q)}\n</think>\n<answer>{answer_text(q)}</answer>")
    elif not cfg.fine_round:  # the coarse sightings are the answer
        turns.append(f"{THINK_PREFIX}{reads_reports(ev, hits, desc, cfg)}\n</think>\n<answer>{answer_text(q, padded(hits[0], hits[-1]))}</answer>")
    else:
        near = (f"The {ev.shape} is {ev.colour}, visible near {hits[0]:.1f} seconds." if shape_first
                else f"{desc.capitalize()} is visible near {hits[0]:.1f} seconds.")
        fine_round(hits[0], hits[-1], near)
    return {"turns": turns, "crops": crops}


def habit_calls(cfg: WorldConfig, qid: str) -> bool | None:
    """Whether the cold start's row ``qid`` calls tools: None (the expert's rule: when the overview
    misses the event) unless ``cfg.sft_tool_rate`` is set, then a coin of that probability seeded by
    the world's seed and the row alone — independent of K and of what the overview shows."""
    if cfg.sft_tool_rate is None:
        return None
    return py_rng(cfg.seed, "tool_habit", qid).random() < cfg.sft_tool_rate


def overview_answer(spec: VideoSpec, q: dict[str, Any], k: int, cfg: WorldConfig) -> str:
    """The main agent's one turn without a call (the agentic prompt, tools available but not used):
    what the K overview frames show and the answer they support. An event the overview misses gets a
    guess drawn from the question's seed — a wrong option, colour or span as often as chance makes it
    — not the gold answer: skipping the tools must not be taught to pay where it cannot."""
    ev = next(e for e in spec.events if e.shape == q["shape"])
    ov = overview_timestamps(spec.num_frames, spec.fps, k)
    seen = [t for t in ov if ev.visible_at(t)]
    desc = question_desc(ev, q["question_type"])
    if seen:
        thought = f"In the overview {desc} is visible {where(seen)}."
        if cfg.habit_sentence:  # the calling rows' sighting, then the decision in the same place as theirs
            thought = overview_sighting(ev.shape, ev.colour, desc, where(seen), cfg.report_wording)
            thought += " I will answer from them."
        if q["question_type"] == "tvg":
            spacing = spec.duration / max(1, len(ov))
            answer = answer_text(q, tvg_span(cfg, spec.duration, seen[0], seen[-1], spacing / 2))
        else:
            thought += f" {answer_sentence(q)}"
            answer = answer_text(q)
        return f"{THINK_PREFIX}{restate(q)} {thought}\n</think>\n<answer>{answer}</answer>"
    r = py_rng(cfg.seed, "overview_guess", spec.id, q["shape"], q["question_type"], k)
    missing = overview_missing(desc, cfg.report_wording) if cfg.habit_sentence else \
        f"{desc.capitalize()} is not visible in the overview frames."
    thought = f"{missing} I will answer from them."
    if q["question_type"] == "mcq":
        answer = r.choice([chr(ord("A") + i) for i in range(len(q["options"]))])
    elif q["question_type"] == "tvg":
        length = q["span"][1] - q["span"][0]
        s = round(r.uniform(0.0, max(0.0, spec.duration - length)), 1)
        answer = answer_text(q, (s, round(s + length, 1)))
    else:
        answer = r.choice(sorted(COLOURS))
    return f"{THINK_PREFIX}{restate(q)} {thought}\n</think>\n<answer>{answer}</answer>"


def direct_answer(spec: VideoSpec, q: dict[str, Any], k: int, cfg: WorldConfig) -> str:
    """The expert's one turn without tools (the ``direct`` prompt): what the K overview frames show,
    then the answer. An event the overview misses is answered all the same (the gold answer, as any
    video QA SFT row is): the no-tools arm learns the answer format and answers from what it sees."""
    ev = next(e for e in spec.events if e.shape == q["shape"])
    ov = overview_timestamps(spec.num_frames, spec.fps, k)
    seen = [t for t in ov if ev.visible_at(t)]
    desc = question_desc(ev, q["question_type"])
    span = None
    if seen:
        thought = f"In the overview {desc} is visible {where(seen)}."
        if q["question_type"] == "tvg":
            spacing = spec.duration / max(1, len(ov))
            span = tvg_span(cfg, spec.duration, seen[0], seen[-1], spacing / 2)
    else:
        thought = f"{desc.capitalize()} is not visible in the overview frames."
        if q["question_type"] == "tvg":
            span = tuple(q["span"])
    tail = f" {answer_sentence(q)}" if seen and q["question_type"] != "tvg" else ""
    return f"{THINK_PREFIX}{restate(q)} {thought}{tail}\n</think>\n<answer>{answer_text(q, span)}</answer>"


# ---------------------------------------------------------------------------------------
# Rows in the released schemas
# ---------------------------------------------------------------------------------------
