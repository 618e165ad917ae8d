#!/usr/bin/env bash
# The tiny reproduction across seeds: N training seeds x {SFT, vanilla GRPO, PARA-GRPO} on one world,
# every eval cell of the quickstart per seed, then effects with intervals across seeds.
#   bash scripts/reproduce_tiny.sh [OUT_DIR]          (default: runs/reproduce_tiny)
#   SEEDS ("0 1 2"): training seeds; WORLD_SEED (0): the world all seeds share
#   FRAGILITY (1): also run scripts/fragility_tiny.sh in each seed's folder (Format Fragility on a base with a
#     tool prior of its own: ~20 more minutes per seed; its sizes PRIOR_STEPS, COLD_STEPS, FRAG_RL_STEPS apply)
#   Every size knob of scripts/quickstart.sh applies to each seed; RL_STEPS (20) and EVAL_LIMIT (120: every held-out
#   question) default to the measured setting of docs/RESULTS.md, larger than the quickstart's own (12, 60).
# Resumable: finished stages of each seed are reused (rerun the same command). Each seed takes ~30-34 min on
# 2 cores plus the fragility runs (~25 min); the world is built once and shared.
# Writes OUT/seed_<s>/ (a quickstart run each, its report.md) and OUT/report.md (python -m paravt.analysis.seeds).
#   EFFECTS=1: instead, the RL-effects design per seed (experiments/rl_effects_pilot.sh: a cold start with a
#     K-independent tool habit, RL on videos it never saw, sampled eval at K = 4 and 64), the first seed's base
#     model and world shared by the others, then OUT/effects.md (python -m paravt.analysis.effects: E1, E2 with
#     intervals, judged against the criteria in its docstring). Its own knobs (TOOL_RATE, RL_STEPS, LR, ...) apply.
#     WORLD_FLAGS defaults to the cold start of the README's effects table, "--habit-sentence
#     --no-reading-episode-calls" (set WORLD_FLAGS="" for the first design, whose SFT policy's calls depend on K).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for a in "$@"; do
  if [[ "$a" == "-h" || "$a" == "--help" ]]; then sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0" | sed '1s/^/usage: /'; exit 0; fi
done
OUT="${1:-$ROOT/runs/reproduce_tiny}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SEEDS=(${SEEDS:-0 1 2})
if [[ "${EFFECTS:-0}" == 1 ]]; then
  export WORLD_FLAGS="${WORLD_FLAGS---habit-sentence --no-reading-episode-calls}"
  RUNS=()
  for S in "${SEEDS[@]}"; do
    echo "=== RL effects, seed $S -> $OUT/seed_$S ==="
    SHARE=""; [[ "$S" != "${SEEDS[0]}" ]] && SHARE="$OUT/seed_${SEEDS[0]}"
    SEED="$S" SHARE_FROM="$SHARE" bash "$ROOT/experiments/rl_effects_pilot.sh" "$OUT/seed_$S"
    RUNS+=("$OUT/seed_$S")
  done
  source "$ROOT/scripts/_common.sh" cpu
  cd "$ROOT"
  exec python -m paravt.analysis.effects "${RUNS[@]}" --out "$OUT/effects.md"
fi
export WORLD_SEED="${WORLD_SEED:-0}"
export RL_STEPS="${RL_STEPS:-20}" EVAL_LIMIT="${EVAL_LIMIT:-120}"
FIRST="${SEEDS[0]}"
i=0
for S in "${SEEDS[@]}"; do
  i=$(( i + 1 ))
  echo "=== seed $S ($i of ${#SEEDS[@]}) -> $OUT/seed_$S ==="
  mkdir -p "$OUT/seed_$S"
  if [[ "$S" != "$FIRST" && ! -e "$OUT/seed_$S/world" && -f "$OUT/seed_$FIRST/world/world_stats.json" ]]; then
    ln -s "../seed_$FIRST/world" "$OUT/seed_$S/world"  # one world for every seed
  fi
  SEED="$S" bash "$ROOT/scripts/quickstart.sh" "$OUT/seed_$S"
  if [[ "${FRAGILITY:-1}" == 1 ]]; then SEED="$S" bash "$ROOT/scripts/fragility_tiny.sh" "$OUT/seed_$S"; fi
done
source "$ROOT/scripts/_common.sh" cpu
cd "$ROOT"
python -m paravt.analysis.seeds "$OUT"
