"""Expert traces: what a perfect main agent and sub-agent write about a video, and the SFT/RL rows.

The main agent thinks, then either answers (the event is in the overview) or dispatches several
parallel ``crop_video`` calls in ONE turn covering the video, reads the sub-agents' summaries
and answers; temporal questions take a second, finer round (the paper's §3.1 trajectory)."""

from __future__ import annotations

import json
import math
from typing import Any

from paravt.core.prompts import THINK_PREFIX, subagent_prompt, system_prompt
from paravt.core.seeding import py_rng
from paravt.core.toolcall import format_tool_call
from paravt.core.video import crop_timestamps, overview_timestamps
from paravt.data.tool_specs import DATA_TOOL_SCHEMAS
from paravt.data.synthetic.world import COLOURS, QUESTION_TYPES, Event, VideoSpec, WorldConfig, make_question, make_spec, restate


def crop_times(spec: VideoSpec, s: float, e: float, cfg: WorldConfig) -> list[float]:
    """Frame times a sub-agent sees for the crop [s, e] (1 fps, at most ``cfg.crop_max_frames``)."""
    return crop_timestamps(spec.num_frames, spec.fps, s, e, 1.0, 1, cfg.crop_max_frames)


def _answer_sentence(q: dict[str, Any]) -> str:
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


def _answer_text(q: dict[str, Any], span: tuple[float, float] | None = None) -> str:
    if q["question_type"] == "tvg":
        s, e = span
        return f"[{s:.1f}, {e:.1f}]"
    return q["answer"]


def tvg_span(cfg: WorldConfig, duration: float, a: float, b: float, pad: float | None = None) -> tuple[float, float]:
    """A tvg answer's span: the sighted times padded by ``pad`` (default ``cfg.tvg_pad_s``) inside the
    video; with ``tvg_pad_s`` 0 the times themselves (the answer copies them)."""
    pad = cfg.tvg_pad_s if pad is None else pad
    return (max(0.0, a - pad), min(float(duration), b + pad)) if cfg.tvg_pad_s else (a, b)


def _windows(duration: float, length: float) -> list[tuple[float, float]]:
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
        turns.append(f"{THINK_PREFIX}{reads_reports(ev, hits or [a, b], desc, cfg)}\n</think>\n<answer>{_answer_text(q, span)}</answer>")

    if seen and call is None:
        at = where(seen)
        if q["question_type"] != "tvg":
            turns.append(f"{THINK_PREFIX}{lead(in_overview(at))} {_answer_sentence(q)}\n</think>\n"
                         f"<answer>{_answer_text(q)}</answer>")
        elif spacing <= 2.0:
            span = padded(seen[0], seen[-1], spacing / 2)
            turns.append(f"{THINK_PREFIX}{lead(in_overview(at))}\n</think>\n"
                         f"<answer>{_answer_text(q, span)}</answer>")
        elif cfg.fine_round:
            fine_round(seen[0], seen[-1], f"{in_overview(at)[:-1]}, but the frames are sparse.")
        if turns:
            return {"turns": turns, "crops": crops}

    windows = _windows(spec.duration, cfg.coarse_window_s)
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
        turns.append(f"{THINK_PREFIX}{reads_reports(ev, hits, desc, cfg)} {_answer_sentence(q)}\n</think>\n<answer>{_answer_text(q)}</answer>")
    elif not cfg.fine_round:  # the coarse sightings are the answer
        turns.append(f"{THINK_PREFIX}{reads_reports(ev, hits, desc, cfg)}\n</think>\n<answer>{_answer_text(q, padded(hits[0], hits[-1]))}</answer>")
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
            answer = _answer_text(q, tvg_span(cfg, spec.duration, seen[0], seen[-1], spacing / 2))
        else:
            thought += f" {_answer_sentence(q)}"
            answer = _answer_text(q)
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
        answer = _answer_text(q, (s, round(s + length, 1)))
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
    tail = f" {_answer_sentence(q)}" if seen and q["question_type"] != "tvg" else ""
    return f"{THINK_PREFIX}{restate(q)} {thought}{tail}\n</think>\n<answer>{_answer_text(q, span)}</answer>"


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
    ts = crop_times(spec, s, e, cfg)
    return [
        {"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": spec.rel_path}, "video_start": s, "video_end": e,
             "fps": 1.0, "max_frames": cfg.crop_max_frames},
            {"type": "text", "text": "\n" + subagent_prompt(s, e)},
        ]},
        {"role": "assistant", "content": [{"type": "text", "text": describe_window(spec, ts, cfg.report_wording, cfg.report_shapes)}]},
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


def lookup_example(cfg: WorldConfig, split: str, j: int, r) -> dict[str, Any] | None:
    """A text-only reading task: the reports a perfect sub-agent writes for the coarse windows of a
    random, unrendered video (``make_spec(cfg, split, j)``) plus a question about one event. The
    answer restates the task and copies the matching report's times and colour, in the words of
    the expert traces. None when the coarse frames miss the event."""
    spec = make_spec(cfg, split, j)
    ev = r.choice(spec.events)
    q = make_question(spec, ev, r.choice(QUESTION_TYPES), r, cfg.mcq_options)
    reports, hits = [], []
    for s, e in _windows(spec.duration, cfg.coarse_window_s):
        ts = crop_times(spec, s, e, cfg)
        reports.append(f"[{s:.1f}-{e:.1f} s] {describe_window(spec, ts, cfg.report_wording, cfg.report_shapes)}")
        hits += [t for t in ts if ev.visible_at(t)]
    if not hits:
        return None
    desc = question_desc(ev, q["question_type"])
    answer = f"{restate(q)} {reads_reports(ev, hits, desc, cfg)}"
    if q["question_type"] != "tvg":
        answer += f" {_answer_sentence(q)}"
    if cfg.reading_answer_tags:  # the episode's last turn: the thought, then the answer tag that copies it
        span = tvg_span(cfg, spec.duration, hits[0], hits[-1])
        answer = f"{THINK_PREFIX}{answer}\n</think>\n<answer>{_answer_text(q, span)}</answer>"
    return {"user": "Reports:\n" + "\n".join(reports) + f"\n{q['question']}", "answer": answer, "question": q,
            "hits": [hits[0], hits[-1]]}


def reading_rows(cfg: WorldConfig, n: int) -> list[dict[str, Any]]:
    """``n`` text-only SFT rows of the main agent's last step (:func:`lookup_example` on the split
    "reading": unrendered random videos, never the train, eval or probe ones): the user turn holds the
    reports of a perfect sub-agent and a question, the assistant answers in the expert's words.

    The tiny model's reading lessons (the embedded default only; Qwen3-VL-8B reads from its
    pretraining): mixed into the SFT batches (quickstart ``SFT_READING=1``) they turn the copy
    warm-up's induction circuit into a lookup; mixed into the perception batches they leave perception
    at chance (docs/RESULTS.md)."""
    r = py_rng(cfg.seed, "reading-rows")
    rows, j = [], 0
    prompt = system_prompt(cfg.system_mode, DATA_TOOL_SCHEMAS)
    system = prompt if cfg.reading_format != "user" else None  # episode rows
    prefix = prompt if cfg.reading_system_frac else None  # user rows after the system prompt
    while len(rows) < n:
        ex = lookup_example(cfg, "reading", j, r)
        j += 1
        if ex is None:
            continue
        as_episode = system is not None and (cfg.reading_format != "mixed" or len(rows) % 2 == 1)
        if as_episode:  # the same video and question as an episode without overview frames
            spec, q = make_spec(cfg, "reading", j - 1), ex["question"]
            msgs = sft_main_messages(spec, q, 0, expert_trajectory(spec, q, 0, cfg), system)
            if cfg.reading_format == "episode_answer" or not cfg.reading_episode_calls:  # the answer turn only
                last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
                for m in msgs[:last]:
                    if m["role"] == "assistant":
                        m["weight"] = 0
        else:
            msgs = [{"role": "user", "content": [{"type": "text", "text": ex["user"]}]},
                    {"role": "assistant", "content": [{"type": "text", "text": ex["answer"]}]}]
            i, f = len(rows), cfg.reading_system_frac
            if prefix and int((i + 1) * f) > int(i * f):  # this row carries the system prompt (spread evenly)
                msgs.insert(0, {"role": "system", "content": [{"type": "text", "text": prefix}]})
        rows.append({"id": f"reading_{j - 1:05d}", "kind": "reading", "nframes": 0, "messages": json.dumps(msgs),
                     "videos": []})
    return rows


def subagent_row(spec: VideoSpec, cfg: WorldConfig, row_id: str, s: float, e: float) -> dict[str, Any]:
    return {"id": row_id, "kind": "subagent", "nframes": 0,
            "messages": json.dumps(sft_subagent_messages(spec, s, e, cfg)), "videos": [{"video": spec.rel_path}]}


def window_row(spec: VideoSpec, cfg: WorldConfig, row_id: str, centre: float, length: float) -> dict[str, Any]:
    """A sub-agent row on a ``length``-second window around ``centre``, kept inside the video."""
    s = round(max(0.0, min(spec.duration - length, centre - length / 2)), 1)
    e = round(min(float(spec.duration), s + length), 1)
    return subagent_row(spec, cfg, row_id, s, e)
