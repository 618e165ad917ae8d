#!/usr/bin/env bash
# Format Fragility at tiny scale: a base with a tool prior of its own, a cold-start SFT, then vanilla
# GRPO and PARA-GRPO from that SFT (same steps, same seed). Runs inside a finished quickstart folder.
#   bash scripts/fragility_tiny.sh SEED_DIR        (a quickstart OUT_DIR: needs world/ and FRAG_BASE/final)
#   Sizes (environment): PRIOR_STEPS (300), COLD_STEPS (20, planned over 80: ~50% compliant at RL start, measured
#     in docs/RESULTS.md), FRAG_RL_STEPS (30), SEED (0);
#     QUICKSTART_SMALL=1: 10 / 10 / 2, RL steps of 2 prompts (a few minutes; CI)
#   FRAG_K (4): both RL arms train at this one overview budget, so their compliance compares on the same
#     episodes (PARA-GRPO keeps its format reward and anchoring, without nFrames gating); FRAG_K=recipe: each
#     arm at its recipe's K (vanilla 64, PARA-GRPO gated over 4..64).
#   COLD_SCHEDULE_STEPS (80 with the default COLD_STEPS, else COLD_STEPS): the cold start's warm-up + cosine is
#     planned over this many steps and stopped at COLD_STEPS, as the authors plan 1500 SFT steps and release
#     step 500; a checkpoint of a longer run is then the same model as a run stopped there.
#     COLD_SAVE_EVERY (COLD_STEPS): a cold-start checkpoint every N steps, all kept; STOP_BEFORE_RL=1 stops
#     after the cold start (experiments/fragility_cold_steps.sh measures compliance per cold-start length
#     with the three).
#   FRAG_BASE (sft): the quickstart checkpoint under SEED_DIR the prior starts from. sft_reading_long has
#     the reading lessons but not yet the episodes; sft (the quickstart's last phase) already answers the episodes,
#     so the native prior and the cold start then change its format more than its skill.
#   NATIVE_REASONING (keep): the native rows keep the think block's text as plain text, so they answer as well
#     as the structured rows; drop: python -m paravt.data.synthetic.native --drop-reasoning.
# The prior: the quickstart's episode rows rewritten in the native format of an instruct model
# (Hermes tool calls, plain answers, no think tags, no answer tags; python -m paravt.data.synthetic.native),
# trained on top of FRAG_BASE (by default the quickstart's cold-started model). The cold start then teaches the
# structured format (the quickstart's last SFT phase, COLD_STEPS instead of 600): fewer steps leave a base less compliant
# at RL start, with more to protect. Training-time compliance of both RL runs is in
# SEED_DIR/fragility/rl_*/metrics.jsonl (format/compliance); python -m paravt.analysis.seeds puts it in the
# table across seeds, judged against the E3 criterion. Finished stages are reused on a rerun (a change of
# FRAG_K or NATIVE_REASONING needs a fresh fragility folder: FRAG_DIR).
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
OUT="${FRAG_DIR:-$SRC/fragility}"
SEED="${SEED:-0}"
FRAG_K="${FRAG_K:-4}"; NATIVE_REASONING="${NATIVE_REASONING:-keep}"; FRAG_BASE="${FRAG_BASE:-sft}"
[[ "$FRAG_K" == recipe || "$FRAG_K" =~ ^[1-9][0-9]*$ ]] || { echo "FRAG_K must be a frame count or 'recipe', got '$FRAG_K'" >&2; exit 2; }
case "$NATIVE_REASONING" in keep) NATIVE_FLAGS=() ;; drop) NATIVE_FLAGS=(--drop-reasoning) ;;
  *) echo "NATIVE_REASONING must be keep or drop, got '$NATIVE_REASONING'" >&2; exit 2 ;; esac
if [[ -n "${QUICKSTART_SMALL:-}" ]]; then
  PRIOR_STEPS="${PRIOR_STEPS:-10}"; COLD_STEPS="${COLD_STEPS:-10}"; FRAG_RL_STEPS="${FRAG_RL_STEPS:-2}"
  FRAG_RL_EXTRA=(grpo.prompts_per_step=2)
else
  FRAG_RL_EXTRA=()
  [[ -z "${COLD_STEPS:-}" ]] && COLD_SCHEDULE_STEPS="${COLD_SCHEDULE_STEPS:-80}"
  PRIOR_STEPS="${PRIOR_STEPS:-300}"; COLD_STEPS="${COLD_STEPS:-20}"; FRAG_RL_STEPS="${FRAG_RL_STEPS:-30}"
fi
COLD_SCHEDULE="${COLD_SCHEDULE_STEPS:-$COLD_STEPS}"
[[ "$COLD_SCHEDULE" =~ ^[1-9][0-9]*$ ]] && (( COLD_SCHEDULE >= COLD_STEPS )) || {
  echo "COLD_SCHEDULE_STEPS must be a step count >= COLD_STEPS ($COLD_STEPS), got '$COLD_SCHEDULE'" >&2; exit 2; }
W="$SRC/world/local"
for need in "$W/paravt_sft_synth.parquet" "$W/paravt_reading_episode_synth.parquet" "$SRC/$FRAG_BASE/final/config.json"; do
  [[ -e "$need" ]] || { echo "error: $need does not exist (run bash scripts/quickstart.sh $SRC first)" >&2; exit 2; }
done
mkdir -p "$OUT"
SETTINGS="{\"base\": \"$FRAG_BASE\", \"frag_k\": \"$FRAG_K\", \"native_reasoning\": \"$NATIVE_REASONING\", \"prior_steps\": $PRIOR_STEPS, \"cold_steps\": $COLD_STEPS, \"cold_schedule_steps\": $COLD_SCHEDULE, \"rl_steps\": $FRAG_RL_STEPS}"
if [[ -f "$OUT/settings.json" && "$(cat "$OUT/settings.json")" != "$SETTINGS" ]]; then
  echo "error: $OUT was made with $(cat "$OUT/settings.json"), not $SETTINGS: set FRAG_DIR to a fresh folder" >&2; exit 2
elif [[ ! -f "$OUT/settings.json" && -e "$OUT/native.parquet" ]]; then
  echo "error: $OUT holds a run whose settings were not recorded (an older fragility_tiny.sh): set FRAG_DIR to a fresh folder" >&2; exit 2
fi
echo "$SETTINGS" > "$OUT/settings.json"
T0=$(date +%s)
say() { echo; echo "== [$(( $(date +%s) - T0 ))s] fragility seed $SEED: $* =="; }

say "native-format rows -> $OUT/native.parquet"
[[ -f "$OUT/native.parquet" ]] || python -m paravt.data.synthetic.native "$W/paravt_sft_synth.parquet" \
  "$W/paravt_reading_episode_synth.parquet" --out "$OUT/native.parquet" "${NATIVE_FLAGS[@]}"

say "the base's own prior: $PRIOR_STEPS steps on native rows from $FRAG_BASE -> $OUT/prior"
[[ -e "$OUT/prior/final/config.json" ]] || NPROC=1 bash scripts/run_sft.sh configs/sft/tiny.yaml \
  model_path="$SRC/$FRAG_BASE/final" output_dir="$OUT/prior" "data=[{path: $OUT/native.parquet, name: native}]" \
  max_steps="$PRIOR_STEPS" save_every="$PRIOR_STEPS" seed="$SEED"

say "cold-start SFT: $COLD_STEPS steps of the structured format (schedule planned over $COLD_SCHEDULE) -> $OUT/sft"
[[ -e "$OUT/sft/final/config.json" ]] || NPROC=1 bash scripts/run_sft.sh configs/sft/tiny.yaml \
  model_path="$OUT/prior/final" output_dir="$OUT/sft" \
  "data=[{path: $W/paravt_sft_synth.parquet, name: synthetic_sft}, {path: $W/paravt_reading_episode_synth.parquet, name: synthetic_reading_episode}]" \
  max_steps="$COLD_STEPS" optim.schedule_steps="$COLD_SCHEDULE" save_every="${COLD_SAVE_EVERY:-$COLD_STEPS}" \
  keep_last=$(( COLD_STEPS / ${COLD_SAVE_EVERY:-$COLD_STEPS} + 1 )) seed="$SEED"
[[ "${STOP_BEFORE_RL:-0}" == 1 ]] && { say "stopping before RL (STOP_BEFORE_RL=1)"; exit 0; }

CROP_FRAMES=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['config']['crop_max_frames'])" "$SRC/world/world.json")
SAME_K=()  # both arms at one K: gating off, the one overview budget
[[ "$FRAG_K" != recipe ]] && SAME_K=(paravt.gating.nframes_gating=false hierarchical_agent.nframes="$FRAG_K")
for RUN in vanilla paragrpo; do
  RECIPE=configs/rl/tiny.yaml; [[ $RUN == vanilla ]] && RECIPE=configs/rl/tiny_vanilla.yaml
  say "RL: $RUN ($FRAG_RL_STEPS steps) -> $OUT/rl_$RUN"
  [[ -e "$OUT/rl_$RUN/final/config.json" ]] || NPROC=1 bash scripts/run_rl.sh "$RECIPE" model_path="$OUT/sft/final" \
    output_dir="$OUT/rl_$RUN" "train_data=[$W/paravt_rl_synth.parquet]" max_steps="$FRAG_RL_STEPS" \
    save_every="$FRAG_RL_STEPS" seed="$SEED" hierarchical_agent.crop.max_frames="$CROP_FRAMES" "${SAME_K[@]}" \
    "${FRAG_RL_EXTRA[@]}"
done
say "done"
