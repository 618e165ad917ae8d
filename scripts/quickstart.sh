#!/usr/bin/env bash
# The main job on the embedded default (CPU, no downloads):
#   CPU venv -> tiny Qwen3-VL -> synthetic world -> materialize -> perception pretraining of the tiny
#   base (stands in for Qwen3-VL's visual pretraining) -> cold-start SFT -> vanilla GRPO and PARA-GRPO (same steps, same seeds) -> eval at K=4 and K=64 -> report.
# Finished stages are reused on a rerun if made with the same arguments (else it stops and names the ones that
# differ; delete OUT_DIR to start over). SFT and RL run through the launchers
# users run on GPU nodes (scripts/run_sft.sh, scripts/run_rl.sh: preflight, torchrun for RL), one process each.
#   bash scripts/quickstart.sh [OUT_DIR]             (default: runs/quickstart)
#   QUICKSTART_SMALL=1 bash scripts/quickstart.sh    (a few minutes, CI's size: every stage through the same launchers at
#     its smallest: 24 videos, a 10-step copy warm-up, 10 + 10 + 10 + 10 SFT steps, 2 RL steps of 2 prompts, 4 questions
#     per eval cell)
#   Sizes (environment): PERC_STEPS (600), SFT_STEPS (900), RL_STEPS (12), EVAL_LIMIT (60 questions per cell: the first 60 of the
#     needle world's 120), EVAL_CONCURRENCY (64 eval samples in flight), SEED (0). bash scripts/reproduce_tiny.sh runs the
#     measured setting of docs/RESULTS.md, RL_STEPS=20 EVAL_LIMIT=120. With these defaults the pipeline took 929 s on 2 cores
#     at ~308 GFLOP/s and 1,169 s modelled at ~125 (2026-12-05; docs/RESULTS.md).
#   The world and the tiny base's lessons (defaults are the measured setting; docs/GUIDE.md "quickstart knobs"
#   says what each does): WORLD_PRESET (needle), HEAD (trained | frozen | tied), SFT_READING (1),
#   READING_FORMAT (user), SFT_PHASES ("reading_long:600 reading_episode:600"), WARMUP_STEPS (0), COPY_AUX (0),
#   TINY_ARGS and WORLD_FLAGS (extra flags of python -m paravt.models.tiny / python -m paravt.data.synthetic)
#   QUICKSTART_JOBS (2 where the machine has 2 cores, else 1): 2 runs RL and eval in two chains side by side, one
#     OpenMP thread each: PARA-GRPO's RL then its eval cells, vanilla GRPO's then its cells (each chain also two
#     SFT cells); a chain that fails, or a signal, stops both. 1: every stage alone, in order
#   SFT_ATTN: the SFT stages' attention (default: the recipe's sdpa_varlen, attention on each packed sequence alone;
#     sdpa: transformers' sdpa over the whole pack, the same logits ~1.5x slower, the setting of the tiny numbers
#     in docs/RESULTS.md up to 2026-11-28 unless their entry names sdpa_varlen)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for a in "$@"; do  # --help before any work (no venv needed)
  if [[ "$a" == "-h" || "$a" == "--help" ]]; then sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0" | sed '1s/^/usage: /'; exit 0; fi
done
OUT="${1:-$ROOT/runs/quickstart}"
JOBS="${QUICKSTART_JOBS:-$(( $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) >= 2 ? 2 : 1 ))}"  # nproc alone follows OMP_NUM_THREADS
[[ "$JOBS" == 1 || "$JOBS" == 2 ]] || { echo "QUICKSTART_JOBS must be 1 or 2, got '$JOBS'" >&2; exit 2; }
bash "$ROOT/scripts/setup_env.sh" cpu
source "$ROOT/scripts/_common.sh" cpu
cd "$ROOT"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SEED="${SEED:-0}"
SFT_ATTN_ARG=(); [[ -n "${SFT_ATTN:-}" ]] && SFT_ATTN_ARG=("attn_implementation=$SFT_ATTN")
if [[ -n "${QUICKSTART_SMALL:-}" ]]; then
  WORLD_ARGS=(--preset "${WORLD_PRESET:-needle}" --reading-format "${READING_FORMAT:-user}" --n-train-videos 24 --n-eval-videos 8 --reading-rows 300); WARMUP_STEPS=10; SFT_READING=1; COPY_AUX=1; PERC_STEPS=10; SFT_STEPS=10; SFT_PHASES="${SFT_PHASES-reading_long:10 reading_episode:10}"; RL_STEPS=2; EVAL_LIMIT=4; EVAL_TOKENS=160
  RL_EXTRA=(grpo.prompts_per_step=2)
else
  WORLD_ARGS=(--preset "${WORLD_PRESET:-needle}" --reading-format "${READING_FORMAT:-user}"); WARMUP_STEPS="${WARMUP_STEPS:-0}"; SFT_READING="${SFT_READING:-1}"; COPY_AUX="${COPY_AUX:-0}"; PERC_STEPS="${PERC_STEPS:-600}"; SFT_STEPS="${SFT_STEPS:-900}"; SFT_PHASES="${SFT_PHASES-reading_long:600 reading_episode:600}"; RL_STEPS="${RL_STEPS:-12}"; EVAL_LIMIT="${EVAL_LIMIT:-60}"; EVAL_TOKENS=320
  RL_EXTRA=()
fi
HEAD="${HEAD:-trained}"
case "$HEAD" in
  frozen) TINY_HEAD=(--no-tie-embeddings); FREEZE=true ;;
  trained) TINY_HEAD=(--no-tie-embeddings); FREEZE=false ;;
  tied) TINY_HEAD=(--tie-embeddings); FREEZE=false ;;
  *) echo "HEAD must be frozen, trained or tied, got '$HEAD'" >&2; exit 2 ;;
esac
read -ra TINY_EXTRA <<< "${TINY_ARGS:-}"
read -ra WORLD_EXTRA <<< "${WORLD_FLAGS:-}"
# This machine's speed (fp32 matmul GFLOP/s) for the report's header: stage times compare across machines only
# beside it. ~13 s; measured on every run, before any stage.
python -m paravt.core.machine_speed --out "$OUT/machine_speed.json" ${QUICKSTART_SMALL:+--seconds 0.5}
T0=$(date +%s)
TS=$T0; STAGE=""
# Each stage's wall-clock seconds go to $OUT/stage_seconds.tsv (reused stages are not timed again).
step() {
  local now; now=$(date +%s)
  if [[ -n "$STAGE" && "${REUSED:-0}" == 0 ]]; then printf '%s\t%s\n' "$STAGE" "$(( now - TS ))" >> "$OUT/stage_seconds.tsv"; fi
  TS=$now; STAGE="$1"; REUSED=0; shift
  echo; echo "== [$(( now - T0 ))s] $* =="
}
reuse() { echo "reusing"; REUSED=1; }
# A finished stage is reused only if it was made with the arguments this run would give it: each stage writes
# its arguments to DIR/quickstart_args.txt (this OUT_DIR's path as <out>), and a rerun asking for others (another
# RL_STEPS, SEED, SFT_ATTN, world flag, ...) stops with the lines that differ instead of reusing it. A stage that
# is a link (a world or base shared between seeds) or has no such file (made by another script) is reused as is.
args_of() {  # one line per key=value or --flag [value]
  local a line=""
  for a in "$@"; do
    a="${a//"$OUT"/<out>}"
    if [[ -n "$line" && "$a" != --* ]]; then printf '%s %s\n' "$line" "$a"; line=""; continue; fi
    [[ -n "$line" ]] && printf '%s\n' "$line"
    if [[ "$a" == --* ]]; then line="$a"; else printf '%s\n' "$a"; line=""; fi
  done
  [[ -z "$line" ]] || printf '%s\n' "$line"
}
record() { local dir="$1"; shift; args_of "$@" > "$dir/quickstart_args.txt"; }
reuse_if_same() {  # reuse_if_same DIR ARGS...
  local dir="$1" rec="$1/quickstart_args.txt"; shift
  if [[ ! -L "$dir" && -f "$rec" && "$(args_of "$@")" != "$(cat "$rec")" ]]; then
    echo "quickstart: $dir was made with other settings than this run gives it:" >&2
    grep -Fxv -f "$rec" <(args_of "$@") | sed 's/^/  this run:   /' >&2 || true
    grep -Fxv -f <(args_of "$@") "$rec" | sed 's/^/  that stage: /' >&2 || true
    echo "  delete $dir and the stages after it to make them again, or give another OUT_DIR" >&2
    exit 2
  fi
  reuse
}

step tiny_model "1/8 tiny Qwen3-VL (copy warm-up: $WARMUP_STEPS steps) -> $OUT/tiny_model"
A=(--out "$OUT/tiny_model" --seed "$SEED" --copy-warmup-steps "$WARMUP_STEPS" "${TINY_HEAD[@]}" "${TINY_EXTRA[@]}")
if [[ -f "$OUT/tiny_model/paravt_tiny.json" ]]; then reuse_if_same "$OUT/tiny_model" "${A[@]}"; else
  python -m paravt.models.tiny "${A[@]}"; record "$OUT/tiny_model" "${A[@]}"; fi

step world "2/8 synthetic world -> $OUT/world"
A=(--out "$OUT/world" --seed "${WORLD_SEED:-$SEED}" "${WORLD_ARGS[@]}" "${WORLD_EXTRA[@]}")
if [[ -f "$OUT/world/world_stats.json" ]]; then reuse_if_same "$OUT/world" "${A[@]}"; else
  python -m paravt.data.synthetic "${A[@]}"; record "$OUT/world" "${A[@]}"; fi

step materialize "3/8 materialize -> $OUT/world/local"
if [[ -f "$OUT/world/local/materialize_report.json" ]]; then reuse; else
  python -m paravt.data.materialize --root "$OUT/world/media" --parquet-dir "$OUT/world/parquet" \
    --output-dir "$OUT/world/local"; fi

# Perception runs on its own rows only: anything mixed in (reading rows) leaves it at chance (docs/RESULTS.md).
# From a copy-warmed base it needs ~1200 steps instead of 600.
step perception "4/8 perception pretraining of the tiny base ($PERC_STEPS steps) -> $OUT/perception"
A=(configs/sft/tiny_perception.yaml model_path="$OUT/tiny_model" output_dir="$OUT/perception"
   data.0.path="$OUT/world/local/paravt_perception_synth.parquet" max_steps="$PERC_STEPS"
   save_every="$PERC_STEPS" seed="$SEED" copy_aux.weight="$COPY_AUX" optim.freeze_lm_head="$FREEZE" "${SFT_ATTN_ARG[@]}")
if [[ -e "$OUT/perception/final/config.json" ]]; then reuse_if_same "$OUT/perception" "${A[@]}"; else
  NPROC=1 bash scripts/run_sft.sh "${A[@]}"; record "$OUT/perception" "${A[@]}"; fi

# SFT_READING=1: the tiny model's reading lessons (text-only reports -> answer, paravt_reading_synth.parquet) are
# mixed into the SFT batches. Then SFT_PHASES: each continues from the previous phase on the SFT rows plus the
# world's paravt_NAME_synth.parquet (the needle world writes reading_long and reading_episode: the copy learnt on
# short rows is kept after the 480-token system prompt, then carried into tool messages and the answer tag;
# docs/RESULTS.md, "reading curriculum"). The last phase is $OUT/sft; earlier ones are $OUT/sft_<name>.
SFT_ROWS="{path: $OUT/world/local/paravt_sft_synth.parquet, name: synthetic_sft}"
read -ra LATER <<< "${SFT_PHASES}"
[[ "$SFT_READING" == 1 ]] || LATER=()
PHASES=("$([[ "$SFT_READING" == 1 ]] && echo reading || echo none):$SFT_STEPS" "${LATER[@]}")
PREV="$OUT/perception"
for i in "${!PHASES[@]}"; do
  NAME="${PHASES[$i]%%:*}"; STEPS="${PHASES[$i]##*:}"
  if [[ "$NAME" == "${PHASES[$i]}" || ! "$STEPS" =~ ^[1-9][0-9]*$ ]]; then
    echo "SFT_PHASES: '${PHASES[$i]}' is not NAME:STEPS (e.g. reading_episode:600)" >&2; exit 2; fi
  DATA="$SFT_ROWS"
  if [[ "$NAME" != none ]]; then
    SHARD="$OUT/world/local/paravt_${NAME}_synth.parquet"
    if [[ ! -f "$SHARD" ]]; then
      echo "SFT phase '$NAME': $SHARD does not exist (the needle preset's --reading-curriculum writes reading_long and" \
           "reading_episode; set SFT_PHASES=\"\" for one phase)" >&2; exit 2; fi
    DATA="$DATA, {path: $SHARD, name: synthetic_$NAME}"
  fi
  DEST="$OUT/sft_$NAME"; (( i == ${#PHASES[@]} - 1 )) && DEST="$OUT/sft"
  step "sft_$NAME" "5/8 cold-start SFT phase $(( i + 1 ))/${#PHASES[@]}: $NAME ($STEPS steps) -> $DEST"
  A=(configs/sft/tiny.yaml model_path="$PREV/final" output_dir="$DEST" "data=[$DATA]" max_steps="$STEPS"
     save_every="$STEPS" seed="$SEED" copy_aux.weight="$COPY_AUX" optim.freeze_lm_head="$FREEZE" "${SFT_ATTN_ARG[@]}")
  if [[ -e "$DEST/final/config.json" ]]; then reuse_if_same "$DEST" "${A[@]}"; else
    NPROC=1 bash scripts/run_sft.sh "${A[@]}"; record "$DEST" "${A[@]}"; fi
  PREV="$DEST"
done
step probe "5b/8 what the sub-agents see (python -m paravt.analysis.probe)"
for M in perception sft; do
  if [[ -f "$OUT/probe_$M.json" ]]; then reuse; else
    python -m paravt.analysis.probe --model "$OUT/$M/final" --world "$OUT/world" --limit "$EVAL_LIMIT" \
      --out "$OUT/probe_$M.json" > /dev/null; fi
done
[[ "${QUICKSTART_STOP_AFTER:-}" == sft ]] && exit 0
# the sub-agents see as many frames per crop as the world's expert did (the needle preset: 30 at 1 fps)
CROP_FRAMES=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['config']['crop_max_frames'])" "$OUT/world/world.json")

rl_args() {  # rl_args vanilla|paragrpo: RLA = that arm's arguments of scripts/run_rl.sh
  local recipe=configs/rl/tiny.yaml; [[ $1 == vanilla ]] && recipe=configs/rl/tiny_vanilla.yaml
  RLA=("$recipe" model_path="$OUT/sft/final" output_dir="$OUT/rl_$1" "train_data=[$OUT/world/local/paravt_rl_synth.parquet]"
       max_steps="$RL_STEPS" save_every="$RL_STEPS" seed="$SEED" hierarchical_agent.crop.max_frames="$CROP_FRAMES" "${RL_EXTRA[@]}")
}
rl_arm() {  # rl_arm vanilla|paragrpo: one RL arm from the SFT checkpoint through scripts/run_rl.sh
  local RLA; rl_args "$1"
  NPROC=1 bash scripts/run_rl.sh "${RLA[@]}" && record "$OUT/rl_$1" "${RLA[@]}"
}
rl_done() { [[ -e "$OUT/rl_$1/final/config.json" ]]; }

# Eval on the held-out synthetic set, K = 4 and 64, EVAL_LIMIT questions per cell.
# Tools run as in training (weight-sharing sub-agents, greedy): the tiny model never saw crop frames
# returned to the main agent, which is the paper's eval protocol for the 8B (crop.mode=frames).
# overview=paravt: the overview in the tiny model's training format (timestamps, header, "<think>\n").
# resume=restart: finished samples are reused only if the checkpoint and settings are the same.
# EVAL_CONCURRENCY (64): samples in flight, so the in-process engine runs full batches (its cap is 32
# sequences); greedy answers are the same as at the driver's default of 8, a tools cell at K = 4 takes 53 s instead of 120.
BASE=("split_paths={synthetic: $OUT/world/local}" "out=$OUT/eval" "limit=$EVAL_LIMIT" "max_new_tokens=$EVAL_TOKENS" "overview=paravt" "resume=restart"
      "concurrency=${EVAL_CONCURRENCY:-64}")
TOOLS=("max_turns=2" "crop.mode=subagent" "crop.subagent_temperature=0.0" "crop.subagent_max_tokens=64" "crop.max_frames=$CROP_FRAMES")
evalrow() {  # one eval cell: its full log goes to LOG, one line to the console when it ends
  local log="$1" row="$2"; shift 2
  local t; t=$(date +%s)
  python -m paravt.eval.driver row="$row" progress=false "$@" >> "$log" 2>&1 \
    || { echo "  $row FAILED (exit $?); the end of $log:"; tail -30 "$log"; return 1; }
  python - "$row" "$OUT/eval/$row/image_url/synthetic.json" "$(( $(date +%s) - t ))" <<'PY'
import json, sys
s = json.load(open(sys.argv[2]))
print(f"  {sys.argv[1]:<20} score {100 * s['score']:5.1f}  compliance {100 * s['format_compliance']:5.1f}"
      f"  tools {100 * s['tool_usage_rate']:5.1f}%  ({s['evaluated']} q, {sys.argv[3]} s)", flush=True)
PY
}
evalcell() {  # evalcell LOG ROW: one of the eight cells, by name
  local log="$1" row="$2" K="${2##*-K}"
  case "$row" in
    sft-notool-*) evalrow "$log" "$row" model="$OUT/sft/final" nframes=$K prompt_mode=direct "${BASE[@]}" ;;
    sft-tool-*) evalrow "$log" "$row" model="$OUT/sft/final" nframes=$K "${BASE[@]}" "${TOOLS[@]}" ;;
    vanilla-tool-*) evalrow "$log" "$row" model="$OUT/rl_vanilla/final" nframes=$K think_prefix=false "${BASE[@]}" "${TOOLS[@]}" ;;
    paragrpo-tool-*) evalrow "$log" "$row" model="$OUT/rl_paragrpo/final" nframes=$K "${BASE[@]}" "${TOOLS[@]}" \
                       save_trajectory=true trajectory_thumbnails=48 ;;
  esac
}
evalcells() {  # evalcells LOG ROW...: cells one after another, the first failure ends the chain
  local log="$1" row; shift
  for row in "$@"; do evalcell "$log" "$row" || return 1; done
}
tree() {  # tree PID: the process and all its descendants (Linux /proc; no procps needed)
  local kid; echo "$1"; for kid in $(cat /proc/"$1"/task/*/children 2>/dev/null); do tree "$kid"; done
}

if (( JOBS == 1 )) || rl_done vanilla || rl_done paragrpo; then
  for RUN in vanilla paragrpo; do
    step "rl_$RUN" "6/8 RL: $RUN ($RL_STEPS steps) -> $OUT/rl_$RUN"
    if rl_done "$RUN"; then rl_args "$RUN"; reuse_if_same "$OUT/rl_$RUN" "${RLA[@]}"; else rl_arm "$RUN"; fi
  done
  step eval "7/8 eval on the held-out synthetic set (K = 4 and 64, $EVAL_LIMIT samples each)"
  : > "$OUT/eval.log"  # this run's eval log only
  evalcells "$OUT/eval.log" sft-notool-K4 sft-tool-K4 vanilla-tool-K4 paragrpo-tool-K4 \
    sft-notool-K64 sft-tool-K64 vanilla-tool-K64 paragrpo-tool-K64 || exit 1
else
  # Two chains side by side, one OpenMP thread each (the tiny model's ops gain little from a second thread),
  # each an RL arm and then the eval cells of its model, then two of the SFT cells (which need only the SFT
  # checkpoint): about equal work each, so neither core waits for the other. PARA-GRPO's RL log is on the
  # console, vanilla GRPO's in rl_vanilla.log; the cells' logs are eval.log and eval_b.log, one line each here.
  # A chain that fails stops the other at once; the run exits with the failed chain's code.
  step rl_eval "6-7/8 RL and eval side by side: PARA-GRPO then its cells, vanilla GRPO then its cells ($RL_STEPS RL steps each, $EVAL_LIMIT questions per cell)"
  echo "vanilla GRPO's log: $OUT/rl_vanilla.log"
  : > "$OUT/eval.log"; : > "$OUT/eval_b.log"
  chain_para() {
    local t rc=0; t=$(date +%s)
    rl_arm paragrpo || rc=$?
    if (( rc )); then echo "RL PARA-GRPO failed (exit $rc)" >&2; return "$rc"; fi
    echo "PARA-GRPO RL finished ($(( $(date +%s) - t )) s); its eval cells follow"
    evalcells "$OUT/eval.log" paragrpo-tool-K4 paragrpo-tool-K64 sft-notool-K4 sft-notool-K64
  }
  chain_vanilla() {
    local t rc=0; t=$(date +%s)
    rl_arm vanilla > "$OUT/rl_vanilla.log" 2>&1 || rc=$?
    if (( rc )); then
      echo "RL vanilla GRPO failed (exit $rc); the end of $OUT/rl_vanilla.log:" >&2; tail -40 "$OUT/rl_vanilla.log" >&2
      return "$rc"
    fi
    echo "vanilla GRPO finished beside it ($(( $(date +%s) - t )) s): $(tail -n 1 "$OUT/rl_vanilla.log")"
    evalcells "$OUT/eval_b.log" vanilla-tool-K4 vanilla-tool-K64 sft-tool-K4 sft-tool-K64
  }
  ( export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1; chain_para ) & PARA=$!
  ( export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1; chain_vanilla ) & VANILLA=$!
  SIGNALLED=0
  trap 'SIGNALLED=1; kill -TERM $(tree $PARA) $(tree $VANILLA) 2>/dev/null' TERM INT
  rc=0; wait -n || rc=$?  # the first chain to end (they are this shell's only background jobs)
  if (( rc )); then  # it failed (or a signal came): stop the other one (its launcher passes TERM on to torchrun)
    kill -TERM $(tree "$PARA") $(tree "$VANILLA") 2>/dev/null || true
    wait "$PARA" "$VANILLA" 2>/dev/null || true
    if (( SIGNALLED )); then echo "quickstart: stopped by a signal; both chains stopped" >&2; exit 143; fi
    echo "quickstart: a chain failed (exit $rc); the other was stopped" >&2
    exit "$rc"
  fi
  rc=0; wait "$PARA" || rc=$?; vrc=0; wait "$VANILLA" || vrc=$?  # the finished one returns at once
  trap - TERM INT
  (( rc == 0 && vrc == 0 )) || exit $(( rc ? rc : vrc ))
fi
# The trajectory viewer: every PARA-GRPO eval episode (K = 4 and 64) on one static page.
python -m paravt.viz "$OUT"/eval/paragrpo-tool-K*/image_url/synthetic.jsonl -o "$OUT/viewer_eval.html" \
  --title "PARA-GRPO eval episodes (quickstart)"

step report "8/8 report"
REUSED=1
python -m paravt.analysis.report "$OUT"
echo "total: $(( $(date +%s) - T0 )) s"
