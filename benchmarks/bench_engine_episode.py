"""Engine batching, parallel crop dispatch and the overview cache, on the embedded engine.

    python benchmarks/bench_engine_episode.py [--out benchmarks/results/engine_episode.json]

Uses the tiny model and a synthetic video. The main agent's turn is scripted to dispatch N
crops (the tiny model is random); every sub-agent is the real tiny model on the real HF
engine, generating up to --sub-tokens tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from _util import write_result  # benchmarks/_util.py: the script's folder is on sys.path
from paravt.models.tokenize import encode_prompt
from paravt.agent.episode import EpisodeConfig, EpisodeSample, OverviewCache, run_episode
from paravt.agent.tools import CropConfig
from paravt.core.prompts import THINK_PREFIX, build_messages
from paravt.core.toolcall import format_tool_call
from paravt.core.video import sample_overview
from paravt.data.materialize import materialize
from paravt.data.schema import load_rl_rows
from paravt.data.synthetic.world import WorldConfig
from paravt.data.synthetic.writer import build_world
from paravt.data.tool_specs import DATA_TOOL_SCHEMAS
from paravt.engines.base import GenerationOutput, InferenceEngine, SamplingParams
from paravt.engines.hf import HFEngine
from paravt.models.tiny import build_tiny


class ScriptedMain(InferenceEngine):
    """Main-agent turns are scripted; sub-agent requests go to the real engine."""

    def __init__(self, real: HFEngine, n_calls: int, duration: float):
        self.real, self.n, self.duration = real, n_calls, duration
        self.tok = real.tokenizer
        self.eos = self.tok.convert_tokens_to_ids("<|im_end|>")
        self.sub_calls: list = []  # (arrival time, ids, images, params) of each sub-agent request
        self.turn_start = 0.0

    async def generate(self, input_ids, images, params):
        tail = self.tok.decode(input_ids[-300:])
        if "Describe concisely" in tail:
            self.sub_calls.append((time.perf_counter() - self.turn_start, list(input_ids), images, params))
            return await self.real.generate(input_ids, images, params)
        if "<tool_response>" in tail:
            text = "Done.\n</think>\n<answer>A</answer>"
        else:
            w = self.duration / self.n
            self.turn_start = time.perf_counter()
            text = "Checking.\n</think>\n" + "\n".join(
                format_tool_call("crop_video", {"video_path": "v.mp4", "start_time": round(i * w, 1),
                                                "end_time": round((i + 1) * w, 1)}) for i in range(self.n))
        ids = self.tok.encode(text, add_special_tokens=False) + [self.eos]
        return GenerationOutput(ids, [0.0] * len(ids), "stop")

    async def update_weights(self, source, version=None):
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/engine_episode.json")
    ap.add_argument("--sub-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp())
    build_tiny(tmp / "tiny")
    build_world(tmp / "world", WorldConfig(n_train_videos=2, n_eval_videos=1, min_duration=120, max_duration=120),
                progress=False)
    materialize(tmp / "world/media", tmp / "world/parquet", tmp / "world/local")
    rows, _ = load_rl_rows([tmp / "world/local/paravt_rl_synth.parquet"])
    sample = EpisodeSample.from_row(rows[0])
    real = HFEngine.from_pretrained(tmp / "tiny")
    proc = real.processor
    res: dict = {"machine": f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}",
                 "sub_tokens": a.sub_tokens}

    # 1. Parallel dispatch: one turn with N crops, concurrent vs sequential.
    dispatch = {}
    for n in (1, 2, 4, 8):
        eng = ScriptedMain(real, n, sample.duration)
        row = {}
        for mode, seq in (("concurrent", False), ("sequential", True)):
            cfg = EpisodeConfig(crop=CropConfig(subagent_max_tokens=a.sub_tokens, subagent_temperature=1.0),
                                sequential_tools=seq, max_parallel=8)
            cache = OverviewCache()
            times = []
            for r in range(a.repeats + 1):
                t0 = time.perf_counter()
                traj = asyncio.run(run_episode(sample, eng, proc, cfg, k=8, seed=r, cache=cache))
                times.append(time.perf_counter() - t0)
                assert traj.stats["tool_calls_ok"] == n, traj.stats
            row[mode] = statistics.median(times[1:])
            if mode == "concurrent":
                last = eng.sub_calls[-n:]  # the last concurrent run's sub-agent requests
        # where the time goes: when the sub-agent requests reach the engine after the main turn
        # ends (decode + preprocessing), and the bound: the same requests sent to the engine at once
        row["sub_request_arrival_s"] = [round(c[0], 3) for c in last]

        async def replay():
            return await asyncio.gather(*[real.generate(ids, im, prm) for _, ids, im, prm in last])
        bound = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            asyncio.run(replay())
            bound.append(time.perf_counter() - t0)
        row["engine_bound_s"] = statistics.median(bound)
        row["episode_over_bound"] = row["concurrent"] / row["engine_bound_s"]
        dispatch[n] = row
    base = dispatch[1]["concurrent"]
    for n, row in dispatch.items():
        row["concurrent_vs_1crop"] = row["concurrent"] / base
        row["speedup_vs_sequential"] = row["sequential"] / row["concurrent"]
    res["dispatch"] = dispatch

    # 2. Engine throughput at 1, 4, 8 concurrent requests (same prompt, different seeds).
    frames = sample_overview(sample.video_path, 8)
    ids, imgs = encode_prompt(proc, build_messages("agentic_minimal", sample.question, frames, "v.mp4", 120.0,
                                                    tool_schemas=DATA_TOOL_SCHEMAS),
                              THINK_PREFIX)
    thr = {}
    for c in (1, 4, 8):
        async def go():
            return await asyncio.gather(*[real.generate(ids, imgs, SamplingParams(temperature=1.0, max_new_tokens=64,
                                                                                  seed=s)) for s in range(c)])
        asyncio.run(go())
        t0 = time.perf_counter()
        outs = asyncio.run(go())
        dt = time.perf_counter() - t0
        ntok = sum(len(o.token_ids) for o in outs)
        thr[c] = {"seconds": dt, "tokens": ntok, "tokens_per_s": ntok / dt}
    res["throughput"] = thr

    # 3. Overview cache for a GRPO group of 8 at K = 64.
    eng = ScriptedMain(real, 1, sample.duration)
    eng.generate = _answer_only(eng)
    cache = OverviewCache()
    t0 = time.perf_counter()
    asyncio.run(run_episode(sample, eng, proc, EpisodeConfig(), k=64, seed=0, cache=cache))
    first = time.perf_counter() - t0

    async def group():
        return await asyncio.gather(*[run_episode(sample, eng, proc, EpisodeConfig(), 64, seed=i, cache=cache)
                                     for i in range(1, 8)])
    t0 = time.perf_counter()
    asyncio.run(group())
    rest = (time.perf_counter() - t0) / 7
    res["overview_cache"] = {"group": 8, "hits": cache.hits, "misses": cache.misses,
                             "first_episode_s": first, "cached_episode_s": rest}

    return write_result(a.out, res)


def _answer_only(eng):
    async def gen(input_ids, images, params):
        ids = eng.tok.encode("<answer>A</answer>", add_special_tokens=False) + [eng.eos]
        return GenerationOutput(ids, [0.0] * len(ids), "stop")
    return gen


if __name__ == "__main__":
    sys.exit(main())
