"""The synthetic world's parquet rows in the released schemas: RL prompts, the main agent's and the
sub-agent's SFT conversations, the short-window perception rows and the text-only reading lessons,
built from the expert traces of :mod:`paravt.data.synthetic.traces`."""

from __future__ import annotations

import json
from typing import Any

from paravt.core.prompts import THINK_PREFIX, subagent_prompt, system_prompt
from paravt.core.seeding import py_rng
from paravt.data.tool_specs import DATA_TOOL_SCHEMAS
from paravt.data.synthetic.traces import (answer_sentence, answer_text, cover_windows, crop_times, describe_window,
                                          expert_trajectory, question_desc, reads_reports, tvg_span)
from paravt.data.synthetic.world import QUESTION_TYPES, VideoSpec, WorldConfig, make_question, make_spec, restate


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
    for s, e in cover_windows(spec.duration, cfg.coarse_window_s):
        ts = crop_times(spec, s, e, cfg)
        reports.append(f"[{s:.1f}-{e:.1f} s] {describe_window(spec, ts, cfg.report_wording, cfg.report_shapes)}")
        hits += [t for t in ts if ev.visible_at(t)]
    if not hits:
        return None
    desc = question_desc(ev, q["question_type"])
    answer = f"{restate(q)} {reads_reports(ev, hits, desc, cfg)}"
    if q["question_type"] != "tvg":
        answer += f" {answer_sentence(q)}"
    if cfg.reading_answer_tags:  # the episode's last turn: the thought, then the answer tag that copies it
        span = tvg_span(cfg, spec.duration, hits[0], hits[-1])
        answer = f"{THINK_PREFIX}{answer}\n</think>\n<answer>{answer_text(q, span)}</answer>"
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
