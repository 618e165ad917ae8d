"""Answer one question about one video and print the episode turn by turn.

    python scripts/inference.py --model runs/quickstart/rl_paragrpo/final --video FILE.mp4 --question "..."
    python scripts/inference.py --server http://127.0.0.1:30000 --model DIR --video FILE --question "..."

Shows the thoughts, the parallel crop windows of each turn, each sub-agent's summary, the
answer and timings. The embedded engine runs in-process; ``--server`` talks to an SGLang (or
``paravt.engines.hf_server``) server with SGLang's native API (``--model`` is then only used
for the processor).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from paravt.agent.episode import EpisodeConfig, EpisodeSample, run_episode
from paravt.agent.tools import CropConfig
from paravt.core.scoring import extract_answer
from paravt.core.video import probe
from paravt.engines.factory import build_engine


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint directory (processor + weights)")
    ap.add_argument("--video", required=True)
    ap.add_argument("--question", required=True)
    ap.add_argument("--server", help="URL of an SGLang-API server instead of the in-process engine")
    ap.add_argument("--nframes", type=int, default=64, help="overview frames K")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-parallel", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=1024)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--prompt-mode", default="agentic_general")
    ap.add_argument("--no-think-prefix", action="store_true")
    ap.add_argument("--frames-mode", action="store_true", help="eval-style: crop frames go back to the main agent")
    a = ap.parse_args(argv)

    from paravt.core.video_reader import VideoError  # noqa: PLC0415

    def fail(msg: str) -> int:  # the user's input: one line, exit 2
        print(f"inference.py: {msg}", file=sys.stderr)
        return 2

    for name, v, lo in (("--nframes", a.nframes, 1), ("--max-turns", a.max_turns, 0), ("--max-parallel", a.max_parallel, 1),
                        ("--max-new-tokens", a.max_new_tokens, 1)):
        if v < lo:
            return fail(f"{name} must be >= {lo}, got {v}")
    if a.temperature < 0:
        return fail(f"--temperature must be >= 0, got {a.temperature}")
    if not Path(a.model, "config.json").is_file():
        return fail(f"--model {a.model}: not a checkpoint directory (no config.json)")
    try:
        info = probe(a.video)
    except (VideoError, OSError) as exc:
        return fail(f"--video {a.video}: {' '.join(str(exc).split())}")
    from paravt.models.loading import load_processor  # noqa: PLC0415 - torch and transformers: after the checks

    t0 = time.perf_counter()
    handle = build_engine("remote" if a.server else "hf", a.model, url=a.server)
    engine = handle.engine
    processor = engine.processor if not a.server else load_processor(a.model)
    t_load = time.perf_counter() - t0
    cfg = EpisodeConfig(prompt_mode=a.prompt_mode, max_turns=a.max_turns, max_parallel=a.max_parallel,
                        think_prefix=not a.no_think_prefix, temperature=a.temperature, max_new_tokens=a.max_new_tokens,
                        crop=CropConfig(mode="frames" if a.frames_mode else "subagent", subagent_temperature=a.temperature))
    sample = EpisodeSample("demo", a.question, a.video, info.duration)
    traj = asyncio.run(run_episode(sample, engine, processor, cfg, a.nframes))
    if traj.faults:  # the answer below is incomplete: say so and exit non-zero
        print(f"inference.py: the episode lost work: {traj.faults[0]}", file=sys.stderr)

    print(f"video: {a.video} ({info.duration:.1f} s, {info.num_frames} frames), overview K = {a.nframes}")
    print(f"question: {a.question}\n")
    subs = {s.call_index: s for s in traj.subagents}
    for t in traj.turns:
        print(f"--- turn {t.index + 1}  ({t.n_generated} tokens, {t.generate_seconds:.2f} s, {t.finish_reason})")
        print(t.text.strip())
        if t.calls:
            print(f"\n  {len(t.calls)} crop(s) dispatched in parallel ({t.tools_seconds:.2f} s for all):")
            for i, c in enumerate(t.calls):
                win = f"[{c.window[0]:.1f}, {c.window[1]:.1f}] s" if c.window else "invalid"
                status = "ok" if c.ok else f"error: {c.error}"
                print(f"   #{i + 1} {win} ({c.seconds:.2f} s, {status})")
                sub = subs.get((t.index, i))
                print(f"      -> {(sub.text if sub else c.response).strip()[:300]}")
        for e in t.parse_errors:
            print(f"  unparseable call: {e}")
        print()
    print(f"answer: {extract_answer(traj.completion_text)!r}   (end: {traj.end_reason})")
    print(f"timings: load {t_load:.1f} s, episode {traj.seconds:.2f} s; stats {traj.stats}")
    return 1 if traj.faults else 0


if __name__ == "__main__":
    sys.exit(main())
