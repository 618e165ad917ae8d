"""One PARA-GRPO step split into rollout / weight sync / train, per rollout engine and staleness.

    python benchmarks/bench_rl_engines.py --model runs/quickstart/sft/final --world runs/quickstart/world \\
        [--steps 8] [--out benchmarks/results/rl_engines.json]

Runs ``python -m paravt.rl.train configs/rl/tiny.yaml`` (the same world, seed and sizes: 2 prompts x 4
rollouts, 96 new tokens per turn, one trainer process) with the in-process engine, one vLLM rollout
server and two (``configs/rl/tiny_vllm.yaml``, ``rollout.replicas``), at staleness 0 and 2, and reports
the mean ``time/rollout`` (collecting a batch), ``time/wait_rollout`` (the trainer waiting for it),
``time/sync`` (export + push), ``time/train`` and ``time/step`` over the steps after the first (warm-up),
plus the mean reward curve of each run. vLLM runs need ``.venv-vllm`` (``bash scripts/setup_env.sh vllm``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _util import write_result  # benchmarks/_util.py: the script's folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]
RUNS = {  # name: (recipe, overrides)
    "hf": ("configs/rl/tiny.yaml", []),
    "vllm_1": ("configs/rl/tiny_vllm.yaml", ["rollout.vllm.port=0"]),
    "vllm_2": ("configs/rl/tiny_vllm.yaml", ["rollout.vllm.port=0", "rollout.replicas=2"]),
}
KEYS = ("time/rollout", "time/wait_rollout", "time/sync", "time/train", "time/step")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="an SFT checkpoint (save_pretrained directory)")
    p.add_argument("--world", required=True, help="a synthetic world (its local/paravt_rl_synth.parquet)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 2])
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/rl_engines.json"))
    a = p.parse_args(argv)
    res: dict = {"steps": a.steps, "model": a.model}
    tmp = Path(tempfile.mkdtemp())
    for name in a.runs:
        recipe, over = RUNS[name]
        for st in a.staleness:
            out = tmp / f"{name}_s{st}"
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "paravt.rl.train", recipe, f"model_path={a.model}",
                                f"output_dir={out}", f"train_data=[{a.world}/local/paravt_rl_synth.parquet]",
                                f"max_steps={a.steps}", f"save_every={a.steps}", "grpo.prompts_per_step=2",
                                "grpo.n_samples=4", "hierarchical_agent.max_new_tokens=96",
                                "hierarchical_agent.crop.subagent_max_tokens=32", f"grpo.max_staleness={st}",
                                "trainer.strategy=none", "logging.wandb_project=null", "logging.progress=false", *over],
                               cwd=ROOT, capture_output=True, text=True)
            if r.returncode != 0:
                res[f"{name}_s{st}"] = {"error": r.stderr[-500:]}
                continue
            m = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
            body = m[1:] or m
            row = {k.split("/")[1] + "_s": round(sum(x[k] for x in body) / len(body), 3) for k in KEYS}
            row["sync_share"] = round(row["sync_s"] / row["step_s"], 3)
            row["reward_total"] = [round(x["reward/total"], 3) for x in m]
            row["logprob_gap_max"] = max(x.get("rollout/logprob_gap_max", 0.0) for x in m[:1] + (m[1:] if st == 0 else []))
            row["wall_s"] = round(time.perf_counter() - t0, 1)
            res[f"{name}_s{st}"] = row
        if all(f"{name}_s{s}" in res and "step_s" in res[f"{name}_s{s}"] for s in (0, 2)):
            res[f"{name}_async_ratio"] = round(res[f"{name}_s2"]["step_s"] / res[f"{name}_s0"]["step_s"], 3)
    return write_result(a.out, res)


if __name__ == "__main__":
    sys.exit(main())
