#!/usr/bin/env bash
# PARA-GRPO with and without dynamic sampling (grpo.dynamic_sampling) from one cold start, over seeds:
# per seed both arms train through scripts/run_rl.sh with the same seed, steps and prompts per step, then a
# sampled eval (several draws per question at the rollout temperature) at K = 4 and K = 64. Dynamic sampling
# draws extra prompts when groups have no reward spread, so its arm generates more per step: the report gives
# its extra generation share beside the scores (a fair arm in optimizer steps and in groups per update, not in
# generation).
#
#   bash experiments/dynamic_sampling_seeds.sh COLDSTART_DIR [OUT_DIR]
#     COLDSTART_DIR: a cold start of experiments/rl_effects_pilot.sh (PILOT_STOP_AFTER=coldstart), with
#     sft/final and world/ (its RL videos unseen by SFT); OUT_DIR default COLDSTART_DIR/dynamic_sampling
#   SEEDS ("0 1 2"), RL_STEPS (10), N_SAMPLES (8), PROMPTS (2), LR (1e-4), EVAL_Q (40 questions), DRAWS (2 per
#   question), RL_ARGS (extra key=value overrides for both arms), REPLICATE (1: a third arm per seed, "rep", the
#   "off" arm run again with the same seed: rep − off is the run-to-run noise the same settings show, since the
#   rollouts' batching and the async producer's timing are not bitwise reproducible)
#
# Writes OUT_DIR/summary.json and OUT_DIR/summary.md: per seed and arm the score at K = 4 and 64, the training
# reward, the share of groups with zero spread and the extra generation share; the paired difference (on - off)
# across seeds with its 95% t-interval. One cold start for every seed (as the paper has one base model): seeds
# differ in RL and eval draws.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ "${1:-}" == -h || "${1:-}" == --help || -z "${1:-}" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0" | sed '1s/^/usage: /'; [[ -n "${1:-}" ]]; exit $?
fi
BASE="$(cd "$1" && pwd)"
OUT="${2:-$BASE/dynamic_sampling}"
[[ -e "$BASE/sft/final/config.json" && -e "$BASE/world/world.json" ]] || {
  echo "dynamic_sampling_seeds.sh: $BASE has no sft/final or world/ (run experiments/rl_effects_pilot.sh with PILOT_STOP_AFTER=coldstart)" >&2; exit 2; }
read -ra SEEDS <<< "${SEEDS:-0 1 2}"
STEPS="${RL_STEPS:-10}"; N="${N_SAMPLES:-8}"; P="${PROMPTS:-2}"; LR="${LR:-1e-4}"; EVAL_Q="${EVAL_Q:-40}"; DRAWS="${DRAWS:-2}"
read -ra EXTRA <<< "${RL_ARGS:-}"
source .venv-cpu/bin/activate
mkdir -p "$OUT"
CROP=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['config']['crop_max_frames'])" "$BASE/world/world.json")
ARMS=(off on); [[ "${REPLICATE:-0}" == 1 ]] && ARMS+=(rep)
for S in "${SEEDS[@]}"; do
  for DS in "${ARMS[@]}"; do
    RUN="$OUT/seed$S/$DS"
    if [[ ! -e "$RUN/rl/final/config.json" ]]; then
      echo "[ds] seed $S dynamic_sampling=$DS: RL ($STEPS steps)"
      NPROC=1 bash scripts/run_rl.sh configs/rl/tiny.yaml model_path="$BASE/sft/final" output_dir="$RUN/rl" \
        "train_data=[$BASE/world/local/paravt_rl_synth.parquet]" max_steps="$STEPS" save_every="$STEPS" seed="$S" \
        grpo.n_samples="$N" grpo.prompts_per_step="$P" optim.lr="$LR" hierarchical_agent.crop.max_frames="$CROP" \
        grpo.dynamic_sampling="$([[ $DS == on ]] && echo true || echo false)" logging.progress=false \
        logging.wandb_project=null "${EXTRA[@]}" > "$OUT/seed${S}_${DS}_rl.log" 2>&1
    fi
    EVAL=("split_paths={synthetic: $BASE/world/local}" "out=$RUN/eval" "limit=$EVAL_Q" "overview=paravt" "resume=auto"
          "max_new_tokens=320" "concurrency=64" "progress=false" "temperature=1.0" "samples_per_question=$DRAWS"
          "sample_seed=$S" "max_turns=2" "crop.mode=subagent" "crop.subagent_temperature=0.0"
          "crop.subagent_max_tokens=64" "crop.max_frames=$CROP")
    for K in 4 64; do
      echo "[ds] seed $S dynamic_sampling=$DS: eval K=$K"
      # a cell that lost samples exits non-zero; its summary counts them (``lost`` in summary.json)
      python -m paravt.eval.driver row="paragrpo-K$K" model="$RUN/rl/final" nframes=$K "${EVAL[@]}" \
        > "$OUT/seed${S}_${DS}_eval_K$K.log" 2>&1 || echo "[ds] seed $S dynamic_sampling=$DS K=$K: the eval lost samples (see its log)"
    done
  done
done

python - "$OUT" "${REPLICATE:-0}" "${SEEDS[@]}" <<'PY'
import json, math, sys
from pathlib import Path
out, replicate, seeds = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3:]
arms = ("off", "on", "rep") if replicate else ("off", "on")
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
rows, res = [], {"seeds": seeds, "runs": {}, "diff": {}}
for s in seeds:
    for ds in arms:
        run = out / f"seed{s}" / ds
        log = [json.loads(x) for x in (run / "rl/metrics.jsonl").read_text().splitlines() if x.strip()]
        steps = [r for r in log if "step" in r]
        mean = lambda k: sum(r[k] for r in steps if k in r) / max(1, sum(1 for r in steps if k in r))
        cell = {"reward_acc": mean("reward/acc"), "zero_std": mean("frac_reward_zero_std"),
                "extra_generation": mean("dynamic_sampling/extra_generation_share") if ds == "on" else 0.0,
                "groups_drawn": mean("dynamic_sampling/groups_drawn") if ds == "on" else None}
        for k in (4, 64):
            summ = json.loads((run / f"eval/paragrpo-K{k}/image_url/synthetic.json").read_text())
            cell[f"score_K{k}"], cell[f"lost_K{k}"] = summ["score"], summ["lost"]
        res["runs"][f"seed{s}/{ds}"] = cell
def paired(a, b, key):
    d = [res["runs"][f"seed{s}/{a}"][key] - res["runs"][f"seed{s}/{b}"][key] for s in seeds]
    m = sum(d) / len(d)
    half = T975.get(len(d) - 1, 1.96) * math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1) / len(d)) if len(d) > 1 else float("nan")
    return {"per_seed": d, "mean": m, "ci95": [m - half, m + half]}
for key in ("score_K4", "score_K64", "reward_acc"):
    res["diff"][key] = paired("on", "off", key)
    if replicate:  # the same arm twice: what run-to-run noise alone gives
        res.setdefault("noise", {})[key] = paired("rep", "off", key)
(out / "summary.json").write_text(json.dumps(res, indent=2))
pct = lambda v: f"{100 * v:5.1f}"
lines = ["| seed | dynamic sampling | score K=4 | score K=64 | train reward/acc | zero-spread groups | extra generation |",
         "|---|---|---|---|---|---|---|"]
for name, c in res["runs"].items():
    s, ds = name.split("/")
    lines.append(f"| {s[4:]} | {ds} | {pct(c['score_K4'])} | {pct(c['score_K64'])} | {pct(c['reward_acc'])} | "
                 f"{pct(c['zero_std'])} | {pct(c['extra_generation'])} |")
for title, table in (("on − off", res["diff"]), ("rep − off (noise: the same arm twice)", res.get("noise", {}))):
    if not table:
        continue
    lines += ["", f"| {title} (points) | mean | per seed | 95% t-interval over seeds |", "|---|---|---|---|"]
    for key, d in table.items():
        per = ", ".join(f"{100 * x:+.1f}" for x in d["per_seed"])
        lines.append(f"| {key} | {100 * d['mean']:+.1f} | {per} | [{100 * d['ci95'][0]:+.1f}, {100 * d['ci95'][1]:+.1f}] |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
