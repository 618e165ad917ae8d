#!/usr/bin/env bash
# Tiny vanilla GRPO vs tiny PARA-GRPO from the same SFT checkpoint, same steps and seeds;
# writes a table + plot of format compliance, tool-call frequency and accuracy.
#   bash experiments/ablate_tiny.sh [OUT_DIR] [key=value ...]     (needs OUT_DIR/sft/final: run the quickstart first)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/_common.sh" cpu
cd "$ROOT"
OUT="${1:-runs/quickstart}"; shift || true
[[ -e "$OUT/sft/final/config.json" ]] || { echo "no SFT checkpoint at $OUT/sft/final: run bash scripts/quickstart.sh first" >&2; exit 1; }
for RUN in vanilla paragrpo; do
  RECIPE=configs/rl/tiny.yaml; [[ $RUN == vanilla ]] && RECIPE=configs/rl/tiny_vanilla.yaml
  NPROC=1 bash scripts/run_rl.sh "$RECIPE" model_path="$OUT/sft/final" output_dir="$OUT/rl_$RUN" \
    "train_data=[$OUT/world/local/paravt_rl_synth.parquet]" "$@"
done
python -m paravt.analysis.report "$OUT"
