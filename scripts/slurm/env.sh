# Sourced by node.sh on each node of a Slurm job: the variables the launchers read, from Slurm's own.
#   NNODES       SLURM_NNODES (the job's nodes)
#   NODE_RANK    SLURM_NODEID (this node's index in the job, 0 on the first)
#   MASTER_ADDR  the first host of SLURM_JOB_NODELIST (scontrol show hostnames), unless set
#   MASTER_PORT  20000 + SLURM_JOB_ID mod 10000, unless set (one port per job: jobs sharing a node differ)
#   RDZV_ID      slurm-<job id>-<restart count>: a requeued job rendezvouses afresh
#   NODE_GPUS    the GPUs Slurm grants this node: SLURM_GPUS_ON_NODE, else the job's --gpus-per-node
#                (SLURM_GPUS_PER_NODE, [type:]count), unless set; the launchers run on that many
# A missing Slurm variable is one line naming it, exit 2.
_slurm_need() {
  if [[ -z "${!1:-}" ]]; then
    echo "scripts/slurm: $1 is not set: run this inside a Slurm job step (srun), one task per node" >&2
    exit 2
  fi
}
_slurm_need SLURM_JOB_ID
_slurm_need SLURM_NNODES
_slurm_need SLURM_NODEID
_slurm_need SLURM_JOB_NODELIST
export NNODES="$SLURM_NNODES" NODE_RANK="$SLURM_NODEID"
if [[ -z "${MASTER_ADDR:-}" ]]; then
  _slurm_hosts="$(scontrol show hostnames "$SLURM_JOB_NODELIST")" || _slurm_hosts=""
  MASTER_ADDR="${_slurm_hosts%%$'\n'*}"  # the first line (no pipe into head: pipefail would see scontrol's SIGPIPE)
  if [[ -z "$MASTER_ADDR" ]]; then
    echo "scripts/slurm: scontrol show hostnames '$SLURM_JOB_NODELIST' named no host" >&2
    exit 2
  fi
fi
export MASTER_ADDR
export MASTER_PORT="${MASTER_PORT:-$(( 20000 + SLURM_JOB_ID % 10000 ))}"
export RDZV_ID="${RDZV_ID:-slurm-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}}"
if [[ -z "${NODE_GPUS:-}" ]]; then
  if [[ -n "${SLURM_GPUS_ON_NODE:-}" ]]; then
    NODE_GPUS="$SLURM_GPUS_ON_NODE"
  elif [[ -n "${SLURM_GPUS_PER_NODE:-}" ]]; then
    _slurm_n=0  # h100:4 -> 4; a100:2,v100:2 -> 4
    IFS=, read -ra _slurm_gres <<<"$SLURM_GPUS_PER_NODE"
    for _slurm_g in "${_slurm_gres[@]}"; do
      _slurm_g="${_slurm_g%%(*}"; _slurm_g="${_slurm_g##*:}"
      [[ "$_slurm_g" =~ ^[0-9]+$ ]] && _slurm_n=$(( _slurm_n + 10#$_slurm_g ))
    done
    (( _slurm_n > 0 )) && NODE_GPUS="$_slurm_n"
  fi
fi
[[ -n "${NODE_GPUS:-}" ]] && export NODE_GPUS
true
