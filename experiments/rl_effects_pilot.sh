#!/usr/bin/env bash
# One seed of the RL-effects design on the embedded default: a cold start whose tool habit does not
# depend on K (WorldConfig.sft_tool_rate: a seeded coin per SFT row; rows that skip guess where the
# overview missed the event), RL prompts from videos the cold start never saw (n_rl_videos), RL with
# 8 rollouts x 2 prompts a step through scripts/run_rl.sh, and sampled eval (several draws per
# question at the rollout temperature) at K = 4 and K = 64 for SFT, vanilla GRPO and PARA-GRPO.
#
#   bash experiments/rl_effects_pilot.sh [OUT_DIR]          (default runs/rl_effects_pilot)
#   SEED, TOOL_RATE (0.5), RL_VIDEOS (40), RL_STEPS (60), LR (1e-4), N_SAMPLES (8), PROMPTS (2),
#   EVAL_Q (40 questions), DRAWS (4 per question), and the quickstart's sizes for the cold start.
#   WORLD_FLAGS="--habit-sentence": the call-or-skip decision as its own sentence, seen or missed (on seed 0
#   the SFT policy still called far less at K = 64: docs/RESULTS.md).
#   WORLD_FLAGS="--habit-sentence --no-reading-episode-calls": also leave the reading episodes' call turns (made
#   without an overview, always "not visible ... I will check") unsupervised (seed 0: gap +59.4 -> +13.8 points).
#   RL_ARGS="key=value ...": extra overrides for both RL arms, e.g. RL_ARGS="paravt.reward.tool_weight=0" (calls paid
#   only through accuracy; docs/GUIDE.md "The RL-made effects").
#   ARMS ("vanilla paragrpo"): the RL arms to train and evaluate, e.g. ARMS=paragrpo for a learning-rate pilot of
#   the gated arm alone (the SFT cells are always evaluated).
#   PILOT_STOP_AFTER=coldstart: stop after the cold start (other runs can then share it: tool_weight_ablation.sh).
#   SHARE_FROM=DIR: take the tiny model, the world and the perception base from another seed's OUT_DIR
#   (one base model for every seed, as the paper has one Qwen3-VL-8B; seeds then differ in SFT, RL and eval).
#
# Writes OUT_DIR/pilot_summary.json and prints, per model and K: score, P(call), the score of the
# episodes that called and of those that did not. One seed: an effect needs three (reproduce_tiny.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0" | sed '1s/^/usage: /'; exit 0; fi
OUT="${1:-runs/rl_effects_pilot}"
SEED="${SEED:-0}"; RATE="${TOOL_RATE:-0.5}"; RL_VIDEOS="${RL_VIDEOS:-40}"; RL_STEPS="${RL_STEPS:-60}"
read -ra ARMS <<< "${ARMS:-vanilla paragrpo}"
for A in "${ARMS[@]}"; do [[ $A == vanilla || $A == paragrpo ]] || { echo "ARMS: '$A' is not vanilla or paragrpo" >&2; exit 2; }; done
LR="${LR:-1e-4}"; N="${N_SAMPLES:-8}"; P="${PROMPTS:-2}"; EVAL_Q="${EVAL_Q:-40}"; DRAWS="${DRAWS:-4}"

if [[ -n "${SHARE_FROM:-}" ]]; then
  SHARE="$(cd "$SHARE_FROM" && pwd)"
  mkdir -p "$OUT"
  for D in tiny_model world perception; do
    [[ -e "$SHARE/$D" ]] || { echo "SHARE_FROM: $SHARE/$D does not exist (run that seed first)" >&2; exit 2; }
    [[ -e "$OUT/$D" ]] || ln -s "$SHARE/$D" "$OUT/$D"
  done
fi

# 1. The cold start: the quickstart's stages up to SFT, on a world with the habit and its own RL videos.
WORLD_FLAGS="${WORLD_FLAGS:-} --sft-tool-rate $RATE --n-rl-videos $RL_VIDEOS" QUICKSTART_STOP_AFTER=sft SEED="$SEED" \
  bash scripts/quickstart.sh "$OUT"
[[ "${PILOT_STOP_AFTER:-}" == coldstart ]] && exit 0
source .venv-cpu/bin/activate
read -ra RL_EXTRA <<< "${RL_ARGS:-}"
CROP=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['config']['crop_max_frames'])" "$OUT/world/world.json")

# 2. Both RL arms from the same checkpoint, as users launch them (a checkpoint every 20 steps: a rerun resumes).
for RUN in "${ARMS[@]}"; do
  RECIPE=configs/rl/tiny.yaml; [[ $RUN == vanilla ]] && RECIPE=configs/rl/tiny_vanilla.yaml
  [[ -e "$OUT/rl_$RUN/final/config.json" ]] && continue
  NPROC=1 bash scripts/run_rl.sh "$RECIPE" model_path="$OUT/sft/final" output_dir="$OUT/rl_$RUN" \
    "train_data=[$OUT/world/local/paravt_rl_synth.parquet]" max_steps="$RL_STEPS" save_every=20 seed="$SEED" \
    grpo.n_samples="$N" grpo.prompts_per_step="$P" optim.lr="$LR" hierarchical_agent.crop.max_frames="$CROP" \
    logging.progress=false "${RL_EXTRA[@]}"
done

# 3. Sampled eval: the policies' distributions at the rollout temperature, not their greedy modes.
# max_new_tokens as in training (the driver's default, 2048, lets a sampled tiny model ramble for minutes)
BASE=("split_paths={synthetic: $OUT/world/local}" "out=$OUT/eval" "limit=$EVAL_Q" "overview=paravt" "resume=auto"
      "max_new_tokens=${EVAL_TOKENS:-320}"
      "concurrency=64" "progress=false" "temperature=1.0" "samples_per_question=$DRAWS" "sample_seed=$SEED"
      "max_turns=2" "crop.mode=subagent" "crop.subagent_temperature=0.0" "crop.subagent_max_tokens=64" "crop.max_frames=$CROP")
for K in 4 64; do
  python -m paravt.eval.driver row="sft-K$K" model="$OUT/sft/final" nframes=$K "${BASE[@]}" > "$OUT/eval_sft_K$K.log" 2>&1
  for A in "${ARMS[@]}"; do
    PREFIX=(); [[ $A == vanilla ]] && PREFIX=(think_prefix=false)
    python -m paravt.eval.driver row="$A-K$K" model="$OUT/rl_$A/final" nframes=$K "${PREFIX[@]}" "${BASE[@]}" \
      > "$OUT/eval_${A}_K$K.log" 2>&1
  done
done

python - "$OUT" "${ARMS[@]}" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
stats = json.loads((out / "world/world_stats.json").read_text())
res = {"sft_main_calling": stats.get("sft_main_calling"), "sft_main_rows": stats.get("sft_main_rows"), "cells": {}}
arms = sys.argv[2:]
for m in ("sft", *arms):
    for k in (4, 64):
        s = json.loads((out / f"eval/{m}-K{k}/image_url/synthetic.json").read_text())
        res["cells"][f"{m}-K{k}"] = {"score": s["score"], "p_call": s["tool_usage_rate"], "calling": s["calling"],
                                     "skipping": s["skipping"], "compliance": s["format_compliance"],
                                     "episodes": s["n"], "questions": s.get("questions"), "lost": s["lost"]}
        c = res["cells"][f"{m}-K{k}"]
        f = lambda v: "  -  " if v is None else f"{100 * v:5.1f}"
        print(f"{m:9s} K={k:<3d} score {f(c['score'])}  P(call) {f(c['p_call'])}  calling {f(c['calling']['score'])} "
              f"(n={c['calling']['n']})  skipping {f(c['skipping']['score'])} (n={c['skipping']['n']})")
for m in arms:
    for k in (4, 64):
        log = [json.loads(x) for x in (out / f"rl_{m}/metrics.jsonl").read_text().splitlines() if x.strip()]
        key = f"tools_by_K/call_frequency_K{k}"
        vals = [r[key] for r in log if key in r]
        if vals:
            fifth = max(1, len(vals) // 5)
            res.setdefault("training", {})[f"{m}-K{k}"] = {"call_first_fifth": sum(vals[:fifth]) / fifth,
                                                           "call_last_fifth": sum(vals[-fifth:]) / fifth}
(out / "pilot_summary.json").write_text(json.dumps(res, indent=2))
print(json.dumps(res.get("training", {}), indent=1))
PY
