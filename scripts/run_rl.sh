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
#       to output_dir. output_dir must be on a filesystem every node shares (checked at start). torchrun's
#       c10d rendezvous joins the nodes: RDZV_TIMEOUT (300 s) bounds a join and how long the others run
#       on once a node is lost (one line naming it, exit 3); FS_CHECK_TIMEOUT (60 s) bounds the shared-folder
#       check (exit 2). Slurm: sbatch scripts/slurm/rl.sbatch.
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
import os
cfg = parse_cli(RLConfig, sys.argv[1:], "run_rl.sh")
require_cuda_if_needed(cfg, "run_rl.sh", sys.argv[1], "rl")
try:
    cfg.check_inputs()
    if int(os.environ.get("NNODES") or 1) == 1 or os.environ.get("NODE_RANK") == "0":
        load_rl_rows(cfg.train_data)  # once per run: on node 0 of several (the folder is shared)
except (DataError, ValueError) as exc:
    print(f"run_rl.sh: {' '.join(str(exc).split())}", file=sys.stderr)
    sys.exit(2)
r = cfg.rollout
gpus = {"sglang": r.server.gpus, "vllm": r.vllm.gpus}.get(r.engine, []) if r.replicas else []
print(torch.cuda.device_count(), ",".join(map(str, gpus)) or "-", cfg.grpo.prompts_per_step, cfg.output_dir)
PY
)" || exit $?
read -r NGPU ROLLOUT_GPUS PROMPTS OUTPUT_DIR <<<"$PRE"
# The weight group joins trainer rank 0 and every server worker in one NCCL communicator; SGLang and vLLM
# start their workers with NCCL's cuMem allocator off, so the trainer does too (the servers it launches
# inherit this environment), else the group can hang at its first broadcast.
export NCCL_CUMEM_ENABLE="${NCCL_CUMEM_ENABLE:-0}"
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
  multinode_setup run_rl.sh "$OUTPUT_DIR"
  # rank 0 launches the servers on the GPUs set aside on node 0: the check stops a rendezvous that put it elsewhere
  [[ "$NODE_RANK" == 0 && "$ROLLOUT_GPUS" != - ]] && export PARAVT_RANK0_NODE=0
  CUDA_VISIBLE_DEVICES="$TRAIN_GPUS" torchrun_supervised "${TORCHRUN_NODES[@]}" --nproc_per_node="$NPROC" \
    --max-restarts="$MAX_RESTARTS" "${TORCHRUN_ENTRY[@]}" paravt.rl.train "$RECIPE" "$@"
fi
NPROC="${NPROC:-1}"
check_world $(( NPROC * ${NNODES:-1} )) "$NPROC"
if [[ "${NNODES:-1}" == 1 ]]; then
  torchrun_supervised --standalone --max-restarts="$MAX_RESTARTS" --nproc_per_node="$NPROC" -m paravt.rl.train "$RECIPE" "$@"
fi
multinode_setup run_rl.sh "$OUTPUT_DIR"
torchrun_supervised "${TORCHRUN_NODES[@]}" --nproc_per_node="$NPROC" --max-restarts="$MAX_RESTARTS" \
  "${TORCHRUN_ENTRY[@]}" paravt.rl.train "$RECIPE" "$@"
