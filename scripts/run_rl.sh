#!/usr/bin/env bash
# PARA-GRPO RL.  bash scripts/run_rl.sh [RECIPE.yaml] [key=value ...]
#   GPU node (8 GPUs): bash scripts/run_rl.sh configs/rl/paragrpo_8b.yaml
#       the recipe's rollout.server.gpus (default [7]) run SGLang; the other GPUs train (FSDP2).
#       rollout.engine=vllm rollout.vllm.gpus=[6,7] rollout.replicas=2 grpo.prompts_per_step=6: two vLLM rollout
#       servers instead (6 trainer GPUs: the prompts of a step must divide among them).
#   multi-node: on every node NNODES=2 NODE_RANK=<0|1> MASTER_ADDR=host0 MASTER_PORT=29500 bash scripts/run_rl.sh
#       RECIPE rollout.urls=[http://rollhost:30000] rollout.replicas=0 ...: trainer ranks on all nodes, rank 0
#       drives the rollout servers (launched on its node, or running elsewhere and reached by URL). Weights
#       reach them in memory over a process group (rollout.weight_sync=broadcast, NCCL; they connect back to
#       rollout.sync_address, default this host); rollout.weight_sync=disk instead writes an export per step
#       to output_dir, which must then be on a filesystem they share.
#   CPU: bash scripts/run_rl.sh configs/rl/tiny.yaml            (NPROC=2 for two gloo trainer processes)
#        bash scripts/run_rl.sh configs/rl/tiny_vllm.yaml       (a real vLLM rollout server, .venv-vllm)
# torchrun restarts crashed workers (MAX_RESTARTS, default 3); resume=auto continues from the
# newest complete checkpoint, so only the step in flight is lost. A run that stops itself is never
# restarted: lost work (every rollout of max_bad_steps steps failed, a failed weight push) exits 3. Bad input (config, files, rows) is
# caught by a preflight before torchrun: one line, exit 2, never retried. Workers die with torchrun
# (kill -9 of the launcher included) and a second run on the same output_dir refuses.  Settings: python -m paravt.rl.train --help
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh" rl  # sets PARAVT_ROOT, the venv, .secrets.env
cd "$PARAVT_ROOT"
script_help "${BASH_SOURCE[0]}" paravt.rl.train "$@"
RECIPE="${1:-configs/rl/tiny.yaml}"; shift || true
MAX_RESTARTS="${MAX_RESTARTS:-3}"
# Preflight, once, before torchrun (which would restart workers on a deterministic error): the config,
# the files it names and the RL rows; a problem is one line and exit 2.
PRE="$(python - "$RECIPE" "$@" <<'PY'
import sys, torch
from paravt.core.config import parse_cli, require_cuda_if_needed
from paravt.data.schema import DataError, load_rl_rows
from paravt.rl.config import RLConfig
cfg = parse_cli(RLConfig, sys.argv[1:], "run_rl.sh")
require_cuda_if_needed(cfg, "run_rl.sh", sys.argv[1], "rl")
try:
    cfg.check_inputs()
    load_rl_rows(cfg.train_data)
except (DataError, ValueError) as exc:
    print(f"run_rl.sh: {' '.join(str(exc).split())}", file=sys.stderr)
    sys.exit(2)
r = cfg.rollout
gpus = {"sglang": r.server.gpus, "vllm": r.vllm.gpus}.get(r.engine, []) if r.replicas else []
print(torch.cuda.device_count(), ",".join(map(str, gpus)) or "-", cfg.grpo.prompts_per_step)
PY
)" || exit $?
read -r NGPU ROLLOUT_GPUS PROMPTS <<<"$PRE"
# The trainer world must divide the step's prompts (each rank trains on its share): say so before torchrun.
check_world() {  # check_world <trainer ranks of the run> <ranks on this node>
  if (( PROMPTS % $1 )); then
    local up=$(( (PROMPTS + $1 - 1) / $1 * $1 ))
    echo "run_rl.sh: grpo.prompts_per_step=$PROMPTS must be a multiple of the trainer world size $1 ($2 rank(s) on this node, ${NNODES:-1} node(s)): set grpo.prompts_per_step=$up, or NPROC to a divisor of $PROMPTS per node" >&2
    exit 2
  fi
}
# GPU numbers in recipes are this job's logical indices; a scheduler's CUDA_VISIBLE_DEVICES maps them to
# physical ones (the servers' launcher maps them through PARAVT_VISIBLE_DEVICES too). The rollout GPUs
# are taken from the trainers on node 0 only, where rank 0 launches the servers (paravt.rl.launch).
export PARAVT_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-}"
if [[ "$NGPU" -gt 0 ]]; then
  read -r TRAIN_GPUS NPROC WORLD <<<"$(python -m paravt.rl.launch "$NGPU" "$ROLLOUT_GPUS")"
  check_world "$WORLD" "$NPROC"
  # the SGLang server is launched by rank 0 with its own CUDA_VISIBLE_DEVICES (rollout.server.gpus)
  if [[ "${NNODES:-1}" == 1 ]]; then
    CUDA_VISIBLE_DEVICES="$TRAIN_GPUS" torchrun_supervised --standalone --max-restarts="$MAX_RESTARTS" \
      --nproc_per_node="$NPROC" -m paravt.rl.train "$RECIPE" "$@"
  fi
  CUDA_VISIBLE_DEVICES="$TRAIN_GPUS" torchrun_supervised --nnodes="$NNODES" --node_rank="${NODE_RANK:?set NODE_RANK}" \
    --nproc_per_node="$NPROC" --master_addr="${MASTER_ADDR:?set MASTER_ADDR}" --master_port="${MASTER_PORT:-29500}" \
    --max-restarts="$MAX_RESTARTS" -m paravt.rl.train "$RECIPE" "$@"
fi
NPROC="${NPROC:-1}"
check_world $(( NPROC * ${NNODES:-1} )) "$NPROC"
if [[ "${NNODES:-1}" == 1 ]]; then
  torchrun_supervised --standalone --max-restarts="$MAX_RESTARTS" --nproc_per_node="$NPROC" -m paravt.rl.train "$RECIPE" "$@"
fi
torchrun_supervised --nnodes="$NNODES" --node_rank="${NODE_RANK:?set NODE_RANK}" --nproc_per_node="$NPROC" \
  --master_addr="${MASTER_ADDR:?set MASTER_ADDR}" --master_port="${MASTER_PORT:-29500}" \
  --max-restarts="$MAX_RESTARTS" -m paravt.rl.train "$RECIPE" "$@"
