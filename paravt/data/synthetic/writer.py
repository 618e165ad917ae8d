"""``build_world``: the videos, parquets, world.json and world_stats.json of a synthetic world."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from paravt.core.prompts import system_prompt
from paravt.core.seeding import py_rng
from paravt.core.video import overview_timestamps
from paravt.data.synthetic.render import write_video
from paravt.data.tool_specs import DATA_TOOL_SCHEMAS
from paravt.data.synthetic.traces import direct_answer, expert_trajectory, habit_calls
from paravt.data.synthetic.rows import reading_rows, rl_record, sft_main_messages, short_window_rows, subagent_row
from paravt.data.synthetic.world import OVERVIEW_KS, QUESTION_TYPES, VideoSpec, WorldConfig, make_question, make_spec


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
    system = system_prompt(cfg.system_mode, DATA_TOOL_SCHEMAS)
    specs = {"train": [make_spec(cfg, "train", i) for i in range(cfg.n_train_videos)],
             "eval": [make_spec(cfg, "eval", i) for i in range(cfg.n_eval_videos)],
             "rl": [make_spec(cfg, "rl", i) for i in range(cfg.n_rl_videos)]}  # RL prompts the cold start never saw
    all_specs = specs["train"] + specs["eval"] + specs["rl"]
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
    n_sub = n_direct = n_calling = 0
    direct_system = system_prompt("direct")
    rl_split = "rl" if cfg.n_rl_videos else "train"
    for split in ("train", "eval", "rl"):
        rows = {"train": rl if rl_split == "train" else [], "eval": ev_rows, "rl": rl}[split]
        for spec in specs[split]:
            r = py_rng(cfg.seed, "questions", spec.id)
            for ei, ev in enumerate(spec.events):
                for qtype in QUESTION_TYPES:
                    q = make_question(spec, ev, qtype, r, cfg.mcq_options)
                    qid = f"{spec.id}_e{ei}_{qtype}"
                    rows.append(rl_record(spec, q, qid))
                    if split != "train":
                        continue
                    k = r.choice(OVERVIEW_KS)
                    traj = expert_trajectory(spec, q, k, cfg, call=habit_calls(cfg, qid))
                    n_calling += bool(traj["crops"])
                    sft.append({"id": qid, "kind": "main", "nframes": k,
                                "messages": json.dumps(sft_main_messages(spec, q, k, traj, system)),
                                "videos": [{"video": spec.rel_path}]})
                    for s, e in traj["crops"]:
                        sft.append(subagent_row(spec, cfg, f"{qid}_sub{n_sub}", s, e))
                        n_sub += 1
                    rd = py_rng(cfg.seed, "direct", qid)  # its own stream: the other rows stay as they were
                    if cfg.direct_rows and rd.random() < cfg.direct_rows:  # the no-tools arm's format
                        kd = rd.choice(OVERVIEW_KS)
                        turn = direct_answer(spec, q, kd, cfg)
                        sft.append({"id": f"{qid}_direct", "kind": "direct", "nframes": kd,
                                    "messages": json.dumps(sft_main_messages(spec, q, kd, {"turns": [turn]}, direct_system)),
                                    "videos": [{"video": spec.rel_path}]})
                        n_direct += 1
    perception = [row for spec in specs["train"] for row in short_window_rows(spec, cfg, "perception", cfg.perception_windows)]
    _write_parquet(sft, parquet_dir / "paravt_sft_synth.parquet")
    _write_parquet(perception, parquet_dir / "paravt_perception_synth.parquet")
    reading = reading_rows(cfg, cfg.reading_rows)
    if reading:
        _write_parquet(reading, parquet_dir / "paravt_reading_synth.parquet")
    if reading and cfg.reading_curriculum:  # the same tasks in the later phases' wrappers
        for name, phase in READING_PHASES.items():
            _write_parquet(reading_rows(replace(cfg, **phase), cfg.reading_rows), parquet_dir / f"paravt_{name}_synth.parquet")
    _write_parquet(rl, parquet_dir / "paravt_rl_synth.parquet")
    _write_parquet(ev_rows, parquet_dir / "paravt_eval_synth.parquet")

    world = {"config": asdict(cfg), "videos": {s.id: asdict(s) for s in all_specs}}
    (out / "world.json").write_text(json.dumps(world, indent=1, sort_keys=True))
    stats = world_stats(specs, cfg)
    stats.update({"sft_main_calling": n_calling, "rl_videos": "rl" if cfg.n_rl_videos else "train", "sft_rows": len(sft), "perception_rows": len(perception), "reading_rows": len(reading), "sft_main_rows": len(sft) - n_sub - n_direct, "sft_direct_rows": n_direct,
                  "sft_subagent_rows": n_sub,
                  "rl_rows": len(rl), "eval_rows": len(ev_rows), "build_seconds": round(time.time() - t0, 2),
                  "media_bytes": sum(p.stat().st_size for p in media.rglob("*.mp4"))})
    (out / "world_stats.json").write_text(json.dumps(stats, indent=2, sort_keys=True))
    return stats


# The later reading phases of reading_curriculum: file stem -> the WorldConfig knobs that make its rows.
READING_PHASES: dict[str, dict[str, Any]] = {
    "reading_long": {"reading_format": "user", "reading_system_frac": 0.5},
    "reading_episode": {"reading_format": "mixed", "reading_system_frac": 0.0},
}


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
