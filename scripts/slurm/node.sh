#!/usr/bin/env bash
# One node of a Slurm job (run by srun, one task per node): a stage launcher with NNODES, NODE_RANK,
# MASTER_ADDR, MASTER_PORT and RDZV_ID taken from Slurm's variables (env.sh).
#   bash scripts/slurm/node.sh scripts/run_rl.sh RECIPE [key=value ...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
echo "scripts/slurm: node $NODE_RANK of $NNODES ($(hostname)), rendezvous at $MASTER_ADDR:$MASTER_PORT ($RDZV_ID)" >&2
exec bash "$@"
