#!/usr/bin/env bash
# PARA-GRPO vs PARA-GRPO+GTR (oracle corrector) from the quickstart's SFT checkpoint, same steps and
# seeds; eval at K = 4 and 64 on the held-out synthetic questions; report with paired bootstrap
# intervals and the thought-collapse metrics over training (OUT/gtr_report.md, OUT/gtr_curves.png).
#   bash experiments/ablate_gtr.sh [QUICKSTART_DIR] [OUT_DIR]   (default runs/quickstart, QUICKSTART_DIR/gtr_ablation)
#   Sizes (environment): RL_STEPS (20), EVAL_LIMIT (60 per cell), SEED (0)
# The PARA-GRPO arm runs GTR in observe mode: the same collapse metrics, no extra loss.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for a in "$@"; do
  if [[ "$a" == "-h" || "$a" == "--help" ]]; then sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0" | sed '1s/^/usage: /'; exit 0; fi
done
source "$ROOT/scripts/_common.sh" cpu
cd "$ROOT"
SRC="$(cd "${1:-runs/quickstart}" && pwd)"
OUT="${2:-$SRC/gtr_ablation}"
[[ -e "$SRC/sft/final/config.json" ]] || { echo "no SFT checkpoint at $SRC/sft/final: run bash scripts/quickstart.sh first" >&2; exit 1; }
mkdir -p "$OUT"
STEPS="${RL_STEPS:-20}"; LIMIT="${EVAL_LIMIT:-60}"; SEED="${SEED:-0}"
for RUN in para_observe gtr; do
  if [[ $RUN == gtr ]]; then ARGS=(configs/rl/tiny_gtr.yaml); else ARGS=(configs/rl/tiny.yaml gtr.mode=observe); fi
  if [[ -e "$OUT/rl_$RUN/final/config.json" ]]; then echo "reusing $OUT/rl_$RUN"; continue; fi
  echo "== RL: $RUN ($STEPS steps) -> $OUT/rl_$RUN"
  NPROC=1 bash scripts/run_rl.sh "${ARGS[@]}" model_path="$SRC/sft/final" output_dir="$OUT/rl_$RUN" \
    "train_data=[$SRC/world/local/paravt_rl_synth.parquet]" max_steps="$STEPS" save_every="$STEPS" seed="$SEED"
done
COMMON=("split_paths={synthetic: $SRC/world/local}" "out=$OUT/eval" "limit=$LIMIT" "max_new_tokens=320" "overview=paravt"
        "resume=auto" "max_turns=2" "crop.mode=subagent" "crop.subagent_temperature=0.0" "crop.subagent_max_tokens=64"
        "progress=false")
for K in 4 64; do
  for ARM in paragrpo gtr; do
    RUN=para_observe; [[ $ARM == gtr ]] && RUN=gtr
    echo "== eval $ARM K=$K"
    python -m paravt.eval.driver row="$ARM-K$K" model="$OUT/rl_$RUN/final" nframes=$K "${COMMON[@]}" >> "$OUT/eval.log" 2>&1 \
      || { tail -30 "$OUT/eval.log"; exit 1; }
  done
done
python -m paravt.analysis.report --gtr "$OUT"
