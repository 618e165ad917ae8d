#!/usr/bin/env bash
# What R_tool does to the RL-made effects, across seeds: one cold start per seed (the RL-effects design of
# rl_effects_pilot.sh), then both RL arms and the sampled eval once per tool weight from that same cold start,
# so the weights differ in the reward alone. Then the effects across seeds per weight (python -m paravt.analysis.effects).
#   bash experiments/tool_weight_ablation.sh [OUT_DIR]          (default runs/tool_weight_ablation)
#   SEEDS ("0 1 2"); WEIGHTS ("1 0": paravt.reward.tool_weight, 1 = the release's reward)
#   WORLD_FLAGS (default "--habit-sentence --no-reading-episode-calls", the cold start of docs/RESULTS.md's runs)
#   Every knob of rl_effects_pilot.sh applies (RL_STEPS, LR, EVAL_Q, DRAWS, ...; RL_ARGS is set here per weight).
# The weights of one seed run side by side, one core and one thread each, when the machine has a core per
# weight; otherwise one after another. ~75 min per seed on 2 cores (cold start ~20, the arms ~55).
# Resumable: finished cold starts, RL runs and eval cells are reused (rerun the same command).
# Writes OUT/coldstart/seed_<s>/, OUT/w<weight>/seed_<s>/ (rl_effects_pilot.sh folders), OUT/w<weight>/effects.md and,
# per later weight, OUT/w<weight>_minus_w<first>.md (python -m paravt.analysis.effects --against: paired by seed and question).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0" | sed '1s/^/usage: /'; exit 0; fi
OUT="${1:-$ROOT/runs/tool_weight_ablation}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SEEDS=(${SEEDS:-0 1 2}); WEIGHTS=(${WEIGHTS:-1 0})
export WORLD_FLAGS="${WORLD_FLAGS---habit-sentence --no-reading-episode-calls}"
PILOT="$ROOT/experiments/rl_effects_pilot.sh"
# what a cold start leaves that the RL arms read
SHARED=(tiny_model world perception sft_reading sft_reading_long sft probe_perception.json probe_sft.json)
# the cores this script may use (its own affinity: under an outer taskset, not every core of the machine)
ALLOWED=($(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))'))
CORES=${#ALLOWED[@]}

for S in "${SEEDS[@]}"; do
  COLD="$OUT/coldstart/seed_$S"
  SHARE=""; [[ "$S" != "${SEEDS[0]}" ]] && SHARE="$OUT/coldstart/seed_${SEEDS[0]}"
  echo "=== seed $S: cold start -> $COLD ==="
  SEED="$S" SHARE_FROM="$SHARE" PILOT_STOP_AFTER=coldstart bash "$PILOT" "$COLD"
  PIDS=(); i=0
  for W in "${WEIGHTS[@]}"; do
    RUN="$OUT/w$W/seed_$S"
    mkdir -p "$RUN"
    for D in "${SHARED[@]}"; do
      [[ -e "$COLD/$D" ]] || { echo "tool_weight_ablation: the cold start left no $COLD/$D" >&2; exit 1; }
      [[ -e "$RUN/$D" ]] || ln -s "$COLD/$D" "$RUN/$D"
    done
    echo "=== seed $S, tool_weight $W -> $RUN (log: $RUN.log) ==="
    if (( CORES >= ${#WEIGHTS[@]} )); then
      SEED="$S" RL_ARGS="paravt.reward.tool_weight=$W" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 taskset -c "${ALLOWED[$i]}" \
        bash "$PILOT" "$RUN" > "$RUN.log" 2>&1 &
      PIDS+=($!)
    else
      SEED="$S" RL_ARGS="paravt.reward.tool_weight=$W" bash "$PILOT" "$RUN" > "$RUN.log" 2>&1 \
        || { echo "tool_weight_ablation: seed $S, tool_weight $W failed (its log: $RUN.log)" >&2; exit 1; }
    fi
    i=$(( i + 1 ))
  done
  FAILED=0
  for P in "${PIDS[@]}"; do wait "$P" || FAILED=1; done
  if (( FAILED )); then echo "tool_weight_ablation: a run of seed $S failed (its log: $OUT/w*/seed_$S.log)" >&2; exit 1; fi
done

source "$ROOT/scripts/_common.sh" cpu
cd "$ROOT"
for W in "${WEIGHTS[@]}"; do
  RUNS=(); for S in "${SEEDS[@]}"; do RUNS+=("$OUT/w$W/seed_$S"); done
  echo "=== tool_weight $W across seeds ${SEEDS[*]} -> $OUT/w$W/effects.md ==="
  python -m paravt.analysis.effects "${RUNS[@]}" --out "$OUT/w$W/effects.md"
done
# each other weight against the first, seed by seed and question by question (same cold starts, same questions)
for W in "${WEIGHTS[@]:1}"; do
  BASE=(); OTHER=(); for S in "${SEEDS[@]}"; do BASE+=("$OUT/w${WEIGHTS[0]}/seed_$S"); OTHER+=("$OUT/w$W/seed_$S"); done
  echo "=== tool_weight $W minus tool_weight ${WEIGHTS[0]}, paired -> $OUT/w${W}_minus_w${WEIGHTS[0]}.md ==="
  python -m paravt.analysis.effects "${BASE[@]}" --against "${OTHER[@]}" --out "$OUT/w${W}_minus_w${WEIGHTS[0]}.md"
done
