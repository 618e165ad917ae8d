#!/usr/bin/env bash
# How compliant the fragility base is at RL start, per length of its cold start: the measurement behind
# scripts/fragility_tiny.sh's COLD_STEPS (the fragility criterion asks for a base 25-65% compliant at RL start).
#   bash experiments/fragility_cold_steps.sh SEED_DIR [OUT_DIR]   (SEED_DIR: a quickstart folder, as fragility_tiny.sh)
#   STEPS ("10 20 40 80 150"): cold-start lengths measured (one SFT run, a checkpoint every 10 steps);
#   FRAG_BASE (sft), PRIOR_STEPS (300), NATIVE_REASONING (keep), FRAG_K (4), SEED (0), EVAL_Q (20
#   questions), DRAWS (4 per question).
# The prior and the cold start are fragility_tiny.sh's own stages (the same commands, FRAG_DIR=OUT_DIR). The
# cold start's schedule is planned over the longest length, so the checkpoint at step s is the cold start that
# COLD_STEPS=s COLD_SCHEDULE_STEPS=<longest> gives fragility_tiny.sh (same seed). Each checkpoint is then
# sampled at the rollout temperature on held-out questions at K = FRAG_K, twice: without the forced "<think>"
# prefix (vanilla GRPO's rollouts) and with it (PARA-GRPO's constrained decoding); its format compliance is the
# share of episodes well formed.
# Writes OUT_DIR/cold_steps.tsv: steps, think prefix, compliance, score, P(call).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ "${1:-}" == -h || "${1:-}" == --help || $# -lt 1 ]]; then sed -n 2,14p "$0"; [[ $# -ge 1 ]]; exit $?; fi
SRC="$(cd "$1" && pwd)"; OUT="${2:-$SRC/fragility_cold_steps}"
STEPS="${STEPS:-10 20 40 80 150}"; MAX=$(tr ' ' '\n' <<<"$STEPS" | sort -n | tail -1)
for s in $STEPS; do (( s % 10 == 0 )) || { echo "STEPS: $s is not a multiple of 10 (a checkpoint every 10 steps)" >&2; exit 2; }; done
cd "$ROOT"
source scripts/_common.sh cpu
# The prior and a cold start of MAX steps that keeps every 10th step's checkpoint; no RL (FRAG_RL_STEPS is
# not reached: the script stops before RL when STOP_BEFORE_RL=1).
FRAG_DIR="$OUT" COLD_STEPS="$MAX" COLD_SAVE_EVERY=10 STOP_BEFORE_RL=1 SEED="${SEED:-0}" \
  bash scripts/fragility_tiny.sh "$SRC"
CROP=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['config']['crop_max_frames'])" "$SRC/world/world.json")
K="${FRAG_K:-4}"; [[ "$K" == recipe ]] && K=64
printf 'steps\tthink_prefix\tcompliance\tscore\tp_call\n' > "$OUT/cold_steps.tsv"
for s in $STEPS; do for PREFIX in false true; do
  M="$OUT/sft/checkpoints/$(printf step_%06d "$s")/hf"; [[ $s == "$MAX" ]] && M="$OUT/sft/final"
  ROW="cold$s-prefix_$PREFIX-K$K"
  python -m paravt.eval.driver row="$ROW" model="$M" nframes="$K" think_prefix="$PREFIX" "split_paths={synthetic: $SRC/world/local}" \
    out="$OUT/eval" limit="${EVAL_Q:-20}" overview=paravt resume=auto max_new_tokens=320 concurrency=64 progress=false \
    temperature=1.0 samples_per_question="${DRAWS:-4}" sample_seed="${SEED:-0}" max_turns=2 crop.mode=subagent \
    crop.subagent_temperature=0.0 crop.subagent_max_tokens=64 crop.max_frames="$CROP" > "$OUT/eval_$ROW.log" 2>&1
  python - "$OUT/eval/$ROW/image_url/synthetic.json" "$s" "$PREFIX" >> "$OUT/cold_steps.tsv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{s['format_compliance']:.3f}\t{s['score']:.3f}\t{s['tool_usage_rate']:.3f}")
PY
done; done
column -t "$OUT/cold_steps.tsv"
