#!/usr/bin/env bash
# Cold-start SFT.  bash scripts/run_sft.sh [RECIPE.yaml] [key=value ...]
#   GPU node:  bash scripts/run_sft.sh configs/sft/qwen3vl_8b.yaml           (all GPUs of the node, FSDP2)
#   multi-node: NNODES=2 NODE_RANK=<0|1> MASTER_ADDR=host0 MASTER_PORT=29500 bash scripts/run_sft.sh ... on every
#              node; output_dir on a filesystem they share (checked); torchrun's c10d rendezvous (RDZV_TIMEOUT,
#              FS_CHECK_TIMEOUT, MAX_RESTARTS as in run_rl.sh). Slurm: sbatch scripts/slurm/sft.sbatch.
#   CPU:       bash scripts/run_sft.sh configs/sft/tiny.yaml                  (NPROC=2 for two gloo processes)
#   dry run:   DRY_RUN=1 bash scripts/run_sft.sh configs/sft/qwen3vl_8b.yaml [--gpus N] [--gpu h100|h200|a100]
#              (the 8B step on the CPU with fake tensors: memory per rank, FLOPs, bytes; python -m paravt.dryrun --help)
# Settings: python -m paravt.sft.train --help
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh" sft  # sets PARAVT_ROOT, the venv, .secrets.env
cd "$PARAVT_ROOT"
script_help "${BASH_SOURCE[0]}" paravt.sft.train "$@"
RECIPE="${1:-configs/sft/tiny.yaml}"; shift || true
# DRY_RUN=1: the step at the recipe's width on this machine's CPU, no weights, data or GPU (python -m
# paravt.dryrun: memory per rank, FLOPs, collectives, a roofline bound; exit 2 when a rank does not fit).
if [[ "${DRY_RUN:-0}" == 1 ]]; then exec python -m paravt.dryrun "$RECIPE" "$@"; fi
cluster_check run_sft.sh  # NPROC, NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, timers: one line, exit 2
if [[ -z "${NPROC:-}" ]]; then  # one process per GPU: Slurm's grant (NODE_GPUS) or what CUDA sees
  NPROC=$(python -c 'import sys, torch
from paravt.core.cluster import node_gpus
try:
    print(node_gpus(torch.cuda.device_count()) or 1)
except ValueError as exc:
    print(f"run_sft.sh: {exc}", file=sys.stderr)
    sys.exit(2)') || exit $?
fi
if [[ "$NPROC" == 1 && "${NNODES:-1}" == 1 ]]; then
  # One process, no torchrun: the trainer checks the config and the files it names itself (one line naming
  # run_sft.sh, exit 2) before it loads anything.
  PARAVT_PROG=run_sft.sh exec python -m paravt.sft.train "$RECIPE" "$@"
fi
# Preflight, once, before torchrun: the config, the files it names (model, shards, resume, output dir) and
# the step's global_batch_size over NPROC x NNODES ranks; a problem is one line and exit 2, never a torchrun
# failure report per rank.
PRE="$(python - "$NPROC" "${NNODES:-1}" "$RECIPE" "$@" <<'PY'
import sys
from paravt.core.config import parse_cli, require_cuda_if_needed
from paravt.sft.config import SFTConfig
nproc, nnodes = sys.argv[1:3]
cfg = parse_cli(SFTConfig, sys.argv[3:], "run_sft.sh")
require_cuda_if_needed(cfg, "run_sft.sh", sys.argv[3], "sft")
try:
    cfg.check_inputs()
    if nproc.isdigit() and nnodes.isdigit() and int(nproc) * int(nnodes) > 0:  # else multinode_setup names it
        cfg.step_split(int(nproc) * int(nnodes))
except ValueError as exc:
    print(f"run_sft.sh: {' '.join(str(exc).split())}", file=sys.stderr)
    sys.exit(2)
print(cfg.output_dir)
PY
)" || exit $?
OUTPUT_DIR="${PRE##*$'\n'}"  # the last line (a library may print above it)
# torchrun's stderr whole, with its own traceback and failure report kept from the terminal (run_supervised)
export PARAVT_LAUNCH_LOG="${PARAVT_LAUNCH_LOG:-$OUTPUT_DIR/logs/torchrun_node${NODE_RANK:-0}.log}"
if [[ "${NNODES:-1}" == 1 ]]; then
  torchrun_supervised --standalone --nproc_per_node="$NPROC" --max-restarts="${MAX_RESTARTS:-0}" -m paravt.sft.train "$RECIPE" "$@"
fi
multinode_setup run_sft.sh "$OUTPUT_DIR"
torchrun_supervised "${TORCHRUN_NODES[@]}" --nproc_per_node="$NPROC" --max-restarts="${MAX_RESTARTS:-0}" \
  "${TORCHRUN_ENTRY[@]}" paravt.sft.train "$RECIPE" "$@"
