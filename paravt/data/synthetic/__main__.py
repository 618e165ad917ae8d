"""``python -m paravt.data.synthetic --out DIR``: build a synthetic world (see the package docstring)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from paravt.data.synthetic import __doc__ as DOC
from paravt.data.synthetic.world import MCQ_OPTIONS, READING_FORMATS, REPORT_WORDINGS, THOUGHT_SIGHTINGS, WorldConfig
from paravt.data.synthetic.writer import build_world


# Named sets of world knobs (explicit flags still override them). "needle": the quickstart's world - one event per 120 s video, four parallel 30 s crops at 1 fps, and every answer a copy of what
# the world shows (no arithmetic on times, no lookup among options, no shape to perceive): the tasks a
# 4 x 128 model trained in minutes can learn to read (docs/RESULTS.md).
PRESETS: dict[str, dict] = {
    "default": {},
    "needle": {"max_events": 1, "min_duration": 120, "max_duration": 120, "coarse_window_s": 30.0,
               "crop_max_frames": 30, "fine_round": False, "tvg_pad_s": 0.0, "mcq_options": "fixed",
               "report_shapes": False, "reading_curriculum": True, "reading_answer_tags": True, "direct_rows": 0.5},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paravt.data.synthetic", description=DOC.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder (media/, parquet/, world.json)")
    p.add_argument("--preset", default="default", choices=sorted(PRESETS),
                   help="a named set of the knobs below (explicit flags override it); needle: "
                        + ", ".join(f"{k}={v}" for k, v in PRESETS["needle"].items()))
    p.add_argument("--seed", type=int, default=WorldConfig.seed)
    p.add_argument("--n-train-videos", type=int, default=WorldConfig.n_train_videos)
    p.add_argument("--n-eval-videos", type=int, default=WorldConfig.n_eval_videos)
    p.add_argument("--min-duration", type=int, default=WorldConfig.min_duration)
    p.add_argument("--max-duration", type=int, default=WorldConfig.max_duration)
    p.add_argument("--min-events", type=int, default=WorldConfig.min_events, help="events (shapes) per video, at least")
    p.add_argument("--max-events", type=int, default=WorldConfig.max_events,
                   help="events per video, at most (1: every report names the only shape; no lookup by shape)")
    p.add_argument("--coarse-window-s", type=float, default=WorldConfig.coarse_window_s,
                   help="the expert's first-round crop length (the video is split into ceil(duration / this) equal windows)")
    p.add_argument("--crop-max-frames", type=int, default=WorldConfig.crop_max_frames,
                   help="frames a sub-agent sees per crop (1 fps up to this; eval/RL must pass the same crop.max_frames)")
    p.add_argument("--no-fine-round", dest="fine_round", action="store_false",
                   help="tvg: answer from the first round's sightings (no second, finer crop whose window is arithmetic)")
    p.add_argument("--tvg-pad-s", type=float, default=WorldConfig.tvg_pad_s,
                   help="tvg answers pad the sighted times by this (0: the answer copies them)")
    p.add_argument("--mcq-options", default=WorldConfig.mcq_options, choices=MCQ_OPTIONS,
                   help="random: four colours in random order; fixed: each colour always under one letter")
    p.add_argument("--perception-windows", type=int, default=WorldConfig.perception_windows,
                   help="1-4 s sub-agent windows per train video in paravt_perception_synth.parquet")
    p.add_argument("--reading-rows", type=int, default=WorldConfig.reading_rows,
                   help="text-only reading rows (reports -> answer) in paravt_reading_synth.parquet (0: none)")
    p.add_argument("--reading-format", default=WorldConfig.reading_format, choices=READING_FORMATS,
                   help="user: reports + question in one message; episode: the main agent's own conversation "
                        "(crop calls, reports as tool messages) without overview frames; episode_answer: loss on its last turn only; "
                        "mixed: every other row each")
    p.add_argument("--reading-system-frac", type=float, default=WorldConfig.reading_system_frac,
                   help="fraction of the user-format reading rows preceded by the world's system prompt "
                        "(the copy taught at episode length; 0: none)")
    p.add_argument("--reading-curriculum", action=argparse.BooleanOptionalAction, default=WorldConfig.reading_curriculum,
                   help="also write paravt_reading_long_synth.parquet (half after the system prompt) and "
                        "paravt_reading_episode_synth.parquet (half as episodes): the later SFT reading phases")
    p.add_argument("--reading-answer-tags", action=argparse.BooleanOptionalAction, default=WorldConfig.reading_answer_tags,
                   help="user-format reading answers end as the episode's last turn: <think>...</think><answer>X</answer>")
    p.add_argument("--report-wording", default=WorldConfig.report_wording, choices=REPORT_WORDINGS,
                   help="sightings in reports and thoughts: colour_first 'A yellow circle is visible from ...' or "
                        "shape_first 'The circle is yellow, visible from ...' (the key before the values)")
    p.add_argument("--no-report-shapes", dest="report_shapes", action="store_false",
                   help="sub-agent reports name the colour, not the shape ('A yellow shape is visible ...')")
    p.add_argument("--thought-sighting", default=WorldConfig.thought_sighting, choices=THOUGHT_SIGHTINGS,
                   help="how the main agent's thought says what the reports found: question 'The square is visible "
                        "from ... It is yellow.' or report: the report's sentence word for word 'A yellow shape is "
                        "visible from ... It is yellow.' (the colour copied forward, as the times are)")
    p.add_argument("--system-mode", default=WorldConfig.system_mode,
                   help="system prompt of the expert main-agent traces (a mode of paravt.core.prompts)")
    p.add_argument("--sft-tool-rate", type=float, default=WorldConfig.sft_tool_rate,
                   help="fraction of SFT main rows that call tools, by a seeded coin independent of K and of the "
                        "overview (default: call exactly when the overview misses the event)")
    p.add_argument("--habit-sentence", action=argparse.BooleanOptionalAction, default=WorldConfig.habit_sentence,
                   help="with --sft-tool-rate: the call-or-skip decision as its own sentence ('I will check N "
                        "windows ...' / 'I will answer from them.') whether the overview saw the event or not")
    p.add_argument("--reading-episode-calls", action=argparse.BooleanOptionalAction,
                   default=WorldConfig.reading_episode_calls,
                   help="the reading episodes' call turns (always 'not visible ... I will check', made without an "
                        "overview) are supervised; --no-reading-episode-calls: only their answer turns")
    p.add_argument("--n-rl-videos", type=int, default=WorldConfig.n_rl_videos,
                   help="videos whose questions are the RL prompts, unseen by the cold start (0: the SFT videos)")
    p.add_argument("--overwrite", action="store_true", help="delete --out first")
    known, _ = p.parse_known_args(argv)
    p.set_defaults(**PRESETS[known.preset])
    a = p.parse_args(argv)
    if a.overwrite and Path(a.out).exists():
        shutil.rmtree(a.out)
    # every WorldConfig field that has a flag (argparse dest = field name)
    cfg = WorldConfig(**{f: getattr(a, f) for f in WorldConfig.__dataclass_fields__ if hasattr(a, f)})
    stats = build_world(a.out, cfg)
    print(json.dumps(stats, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
