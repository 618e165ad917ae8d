#!/usr/bin/env bash
# Format Fragility at tiny scale: a base with a tool prior of its own, a cold-start SFT, then vanilla
# GRPO and PARA-GRPO from that SFT (same steps, same seed). Runs inside a finished quickstart folder.
#   bash scripts/fragility_tiny.sh SEED_DIR        (a quickstart OUT_DIR: needs world/ and sft_reading_long/final)
#   Sizes (environment): PRIOR_STEPS (300), COLD_STEPS (150), FRAG_RL_STEPS (60), SEED (0);
#     QUICKSTART_SMALL=1: 10 / 10 / 4 (a few minutes; CI)
# The prior: the quickstart's episode rows rewritten in the native format of an instruct model
# (Hermes tool calls, plain answers, no <think> block, no answer tags; python -m paravt.data.synthetic.native),
# trained on top of the reading lessons (sft_reading_long). The cold start then teaches the structured
# format (the quickstart's last SFT phase, COLD_STEPS instead of 600). Training-time compliance of both
# RL runs is in SEED_DIR/fragility/rl_*/metrics.jsonl (format/compliance); python -m paravt.eval.seeds
# puts it in the table across seeds. Finished stages are reused on a rerun.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for a in "$@"; do
  if [[ "$a" == "-h" || "$a" == "--help" ]]; then sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0" | sed '1s/^/usage: /'; exit 0; fi
done
[[ $# -ge 1 ]] || { echo "usage: bash scripts/fragility_tiny.sh SEED_DIR (a finished quickstart folder)" >&2; exit 2; }
[[ -d "$1" ]] || { echo "error: $1 is not a folder (give a finished quickstart OUT_DIR)" >&2; exit 2; }
source "$ROOT/scripts/_common.sh" cpu
cd "$ROOT"
SRC="$(cd "$1" && pwd)"
OUT="$SRC/fragility"
SEED="${SEED:-0}"
if [[ -n "${QUICKSTART_SMALL:-}" ]]; then
  PRIOR_STEPS="${PRIOR_STEPS:-10}"; COLD_STEPS="${COLD_STEPS:-10}"; FRAG_RL_STEPS="${FRAG_RL_STEPS:-4}"
else
  PRIOR_STEPS="${PRIOR_STEPS:-300}"; COLD_STEPS="${COLD_STEPS:-150}"; FRAG_RL_STEPS="${FRAG_RL_STEPS:-60}"
fi
W="$SRC/world/local"
for need in "$W/paravt_sft_synth.parquet" "$W/paravt_reading_episode_synth.parquet" "$SRC/sft_reading_long/final/config.json"; do
  [[ -e "$need" ]] || { echo "error: $need does not exist (run bash scripts/quickstart.sh $SRC first)" >&2; exit 2; }
done
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo; echo "== [$(( $(date +%s) - T0 ))s] fragility seed $SEED: $* =="; }

say "native-format rows -> $OUT/native.parquet"
[[ -f "$OUT/native.parquet" ]] || python -m paravt.data.synthetic.native "$W/paravt_sft_synth.parquet" \
  "$W/paravt_reading_episode_synth.parquet" --out "$OUT/native.parquet"

say "the base's own prior: $PRIOR_STEPS steps on native rows -> $OUT/prior"
[[ -e "$OUT/prior/final/config.json" ]] || NPROC=1 bash scripts/run_sft.sh configs/sft/tiny.yaml \
  model_path="$SRC/sft_reading_long/final" output_dir="$OUT/prior" "data=[{path: $OUT/native.parquet, name: native}]" \
  max_steps="$PRIOR_STEPS" save_every="$PRIOR_STEPS" seed="$SEED"

say "cold-start SFT: $COLD_STEPS steps of the structured format -> $OUT/sft"
[[ -e "$OUT/sft/final/config.json" ]] || NPROC=1 bash scripts/run_sft.sh configs/sft/tiny.yaml \
  model_path="$OUT/prior/final" output_dir="$OUT/sft" \
  "data=[{path: $W/paravt_sft_synth.parquet, name: synthetic_sft}, {path: $W/paravt_reading_episode_synth.parquet, name: synthetic_reading_episode}]" \
  max_steps="$COLD_STEPS" save_every="$COLD_STEPS" seed="$SEED"

CROP_FRAMES=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['config']['crop_max_frames'])" "$SRC/world/world.json")
for RUN in vanilla paragrpo; do
  RECIPE=configs/rl/tiny.yaml; [[ $RUN == vanilla ]] && RECIPE=configs/rl/tiny_vanilla.yaml
  say "RL: $RUN ($FRAG_RL_STEPS steps) -> $OUT/rl_$RUN"
  [[ -e "$OUT/rl_$RUN/final/config.json" ]] || NPROC=1 bash scripts/run_rl.sh "$RECIPE" model_path="$OUT/sft/final" \
    output_dir="$OUT/rl_$RUN" "train_data=[$W/paravt_rl_synth.parquet]" max_steps="$FRAG_RL_STEPS" \
    save_every="$FRAG_RL_STEPS" seed="$SEED" hierarchical_agent.crop.max_frames="$CROP_FRAMES"
done
say "done"
