#!/usr/bin/env bash
# The main job on the embedded default (CPU, no downloads):
#   CPU venv -> tiny Qwen3-VL -> synthetic world -> materialize -> cold-start SFT
#   -> vanilla GRPO and PARA-GRPO (same steps, same seeds) -> eval at K=4 and K=64 -> report.
# Finished stages are reused on a rerun (delete OUT_DIR to start over).
#   bash scripts/quickstart.sh [OUT_DIR]             (default: runs/quickstart)
#   QUICKSTART_SMALL=1 bash scripts/quickstart.sh    (a few minutes: fewer videos, steps and eval samples; CI)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/runs/quickstart}"
bash "$ROOT/scripts/setup_env.sh" cpu
source "$ROOT/scripts/_common.sh" cpu
cd "$ROOT"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SEED="${SEED:-0}"
if [[ -n "${QUICKSTART_SMALL:-}" ]]; then
  WORLD_ARGS=(--n-train-videos 24 --n-eval-videos 8); SFT_STEPS=40; RL_STEPS=4; EVAL_LIMIT=8; EVAL_TOKENS=160
else
  WORLD_ARGS=(); SFT_STEPS="${SFT_STEPS:-600}"; RL_STEPS="${RL_STEPS:-30}"; EVAL_LIMIT="${EVAL_LIMIT:-30}"; EVAL_TOKENS=320
fi
T0=$(date +%s)
step() { echo; echo "== [$(( $(date +%s) - T0 ))s] $* =="; }

step "1/7 tiny Qwen3-VL -> $OUT/tiny_model"
if [[ -f "$OUT/tiny_model/paravt_tiny.json" ]]; then echo "reusing"; else
  python -m paravt.models.tiny --out "$OUT/tiny_model" --seed "$SEED"; fi

step "2/7 synthetic world -> $OUT/world"
if [[ -f "$OUT/world/world_stats.json" ]]; then echo "reusing"; else
  python -m paravt.data.synthetic --out "$OUT/world" --seed "$SEED" "${WORLD_ARGS[@]}"; fi

step "3/7 materialize -> $OUT/world/local"
if [[ -f "$OUT/world/local/materialize_report.json" ]]; then echo "reusing"; else
  python -m paravt.data.materialize --root "$OUT/world/media" --parquet-dir "$OUT/world/parquet" \
    --output-dir "$OUT/world/local"; fi

step "4/7 cold-start SFT ($SFT_STEPS steps) -> $OUT/sft"
if [[ -e "$OUT/sft/final/config.json" ]]; then echo "reusing"; else
  python -m paravt.sft.train configs/sft/tiny.yaml model_path="$OUT/tiny_model" output_dir="$OUT/sft" \
    data.0.path="$OUT/world/local/paravt_sft_synth.parquet" max_steps="$SFT_STEPS" \
    save_every="$SFT_STEPS" seed="$SEED"; fi
[[ "${QUICKSTART_STOP_AFTER:-}" == sft ]] && exit 0

for RUN in vanilla paragrpo; do
  RECIPE=configs/rl/tiny.yaml; [[ $RUN == vanilla ]] && RECIPE=configs/rl/tiny_vanilla.yaml
  step "5/7 RL: $RUN ($RL_STEPS steps) -> $OUT/rl_$RUN"
  if [[ -e "$OUT/rl_$RUN/final/config.json" ]]; then echo "reusing"; else
    python -m paravt.rl.train "$RECIPE" model_path="$OUT/sft/final" output_dir="$OUT/rl_$RUN" \
      "train_data=[$OUT/world/local/paravt_rl_synth.parquet]" max_steps="$RL_STEPS" save_every="$RL_STEPS" seed="$SEED"; fi
done

step "6/7 eval on the held-out synthetic set (K = 4 and 64, $EVAL_LIMIT samples each)"
COMMON=("split_paths={synthetic: $OUT/world/local}" "out=$OUT/eval" "limit=$EVAL_LIMIT" "max_new_tokens=$EVAL_TOKENS" "max_turns=2")
for K in 4 64; do
  python -m paravt.eval.driver model="$OUT/sft/final" row="sft-notool-K$K" nframes=$K max_turns=0 "${COMMON[@]:0:4}"
  python -m paravt.eval.driver model="$OUT/sft/final" row="sft-tool-K$K" nframes=$K "${COMMON[@]}"
  python -m paravt.eval.driver model="$OUT/rl_vanilla/final" row="vanilla-tool-K$K" nframes=$K think_prefix=false "${COMMON[@]}"
  python -m paravt.eval.driver model="$OUT/rl_paragrpo/final" row="paragrpo-tool-K$K" nframes=$K "${COMMON[@]}"
done > "$OUT/eval.log" 2>&1 || { tail -30 "$OUT/eval.log"; exit 1; }

step "7/7 report"
python -m paravt.report "$OUT"
echo "total: $(( $(date +%s) - T0 )) s"
