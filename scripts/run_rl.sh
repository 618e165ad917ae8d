#!/usr/bin/env bash
# PARA-GRPO RL.  bash scripts/run_rl.sh [RECIPE.yaml] [key=value ...]
#   GPU node (8 GPUs): bash scripts/run_rl.sh configs/rl/paragrpo_8b.yaml
#       the recipe's rollout.server.gpus (default [7]) run SGLang; the other GPUs train (FSDP2).
#       rollout.engine=vllm rollout.vllm.gpus=[6,7] rollout.replicas=2 grpo.prompts_per_step=6: two vLLM rollout
#       servers instead (6 trainer GPUs).
#   multi-node: on every node NNODES=2 NODE_RANK=<0|1> MASTER_ADDR=host0 MASTER_PORT=29500 bash scripts/run_rl.sh
#       configs/rl/paragrpo_8b_2node.yaml: its rollout.layout=train:7+rollout:1,rollout:8 places trainers and
#       rollout servers per node (paravt.rl.layout); each node's launcher starts its own servers and writes
#       their URLs under output_dir/.paravt/servers (one that dies is taken off its node's record), where trainer
#       rank 0 finds them before the first rollout: it starts with the live ones once every server answers or is
#       known dead, or SERVERS_GRACE (default RDZV_TIMEOUT) after the first answered, naming the missing in one
#       warning; none within SERVERS_TIMEOUT (default RDZV_TIMEOUT + the servers' start-up bound) is one line,
#       exit 3. A node with no train part only serves and ends with the run; it checks the shared folder first
#       (one line naming it, exit 2, on every node). No layout: trainer ranks on every GPU but node 0's
#       rollout.server.gpus, where node 0's launcher starts the servers (rank 0 finds them as above, on whichever
#       node torch's rendezvous put it: torch orders nodes by address, not NODE_RANK), or rank 0 reaches them by
#       rollout.urls. Weights reach the servers in memory over a process group
#       (rollout.weight_sync=broadcast, NCCL; they connect back to rollout.sync_address, default rank 0's
#       host); rollout.weight_sync=disk instead writes an export per step to output_dir. output_dir must be
#       on a filesystem every node shares (checked at start). torchrun's c10d rendezvous joins the nodes
#       that train: RDZV_TIMEOUT (300 s) bounds a join and how long the others run on once a node is lost
#       (one line naming it, exit 3); FS_CHECK_TIMEOUT (60 s) bounds the shared-folder check (exit 2).
#       torchrun's whole output: output_dir/logs/torchrun_node<N>.log (its own traceback and failure report
#       stay off the terminal).
#       Slurm: sbatch scripts/slurm/rl.sbatch.
#   CPU: bash scripts/run_rl.sh configs/rl/tiny.yaml            (NPROC=2 for two gloo trainer processes)
#        bash scripts/run_rl.sh configs/rl/tiny_vllm.yaml       (a real vLLM rollout server, .venv-vllm)
#   dry run: DRY_RUN=1 bash scripts/run_rl.sh configs/rl/paragrpo_8b.yaml [--gpus N] [--gpu h100|h200|a100]
#        (the 8B step on the CPU with fake tensors: memory per rank, FLOPs, bytes; python -m paravt.dryrun --help)
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
# DRY_RUN=1: the step at the recipe's width on this machine's CPU, no weights, data or GPU (python -m
# paravt.dryrun: memory per rank, FLOPs, collectives, a roofline bound; exit 2 when a rank does not fit).
if [[ "${DRY_RUN:-0}" == 1 ]]; then exec python -m paravt.dryrun "$RECIPE" "$@"; fi
MAX_RESTARTS="${MAX_RESTARTS:-3}"
cluster_check run_rl.sh  # NPROC, NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, timers: one line, exit 2
# GPU numbers in recipes are this job's logical indices; a scheduler's CUDA_VISIBLE_DEVICES maps them to
# physical ones (for the trainers here, for the servers through PARAVT_VISIBLE_DEVICES).
export PARAVT_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-}"
# Preflight, once, before torchrun (which would restart workers on a deterministic error): the config,
# the files it names, this node's share of the run (paravt.rl.layout.plan), the trainer world the step's
# samples split over (RLConfig.check_world_size) and the RL rows; a problem is one line and exit 2.
PRE="$(python - "$RECIPE" "$@" <<'PY'
import sys, torch
from paravt.core.cluster import check_url, node_gpus
from paravt.core.config import parse_cli, require_cuda_if_needed
from paravt.data.schema import DataError, load_rl_rows
from paravt.rl.config import RLConfig
from paravt.rl.layout import plan
cfg = parse_cli(RLConfig, sys.argv[1:], "run_rl.sh")
try:
    for url in cfg.rollout.urls:  # http(s)://host:port, else the first weight push after a checkpoint fails
        check_url(url)
except ValueError as exc:
    print(f"run_rl.sh: {exc}", file=sys.stderr)
    sys.exit(2)
require_cuda_if_needed(cfg, "run_rl.sh", sys.argv[1], "rl")
try:
    cfg.check_inputs()
    ngpu = node_gpus(torch.cuda.device_count())  # Slurm's grant (NODE_GPUS) or what CUDA sees
    share = plan(cfg, ngpu)
    cfg.check_world_size(share.world)
    if share.node_rank == 0:
        load_rl_rows(cfg.train_data)  # once per run: on node 0 of several (the folder is shared)
except (DataError, ValueError) as exc:
    print(f"run_rl.sh: {' '.join(str(exc).split())}", file=sys.stderr)
    sys.exit(2)
print(ngpu, share.shell(), cfg.output_dir)
PY
)" || exit $?
read -r NGPU TRAIN_GPUS NPROC _ TRAIN_NODES SERVERS MODE EXPECT SERVERS_TIMEOUT ROLLOUT_GPUS SERVE_ONLY OUTPUT_DIR <<<"$PRE"
# The weight group joins trainer rank 0 and every server worker in one NCCL communicator; SGLang and vLLM
# start their workers with NCCL's cuMem allocator off, so the trainer does too (the servers it or this
# launcher starts inherit this environment), else the group can hang at its first broadcast.
export NCCL_CUMEM_ENABLE="${NCCL_CUMEM_ENABLE:-0}"
NNODES=$((10#${NNODES:-1}))  # 02 -> 2
# torchrun's stderr whole, with its own traceback and failure report kept from the terminal (run_supervised)
export PARAVT_LAUNCH_LOG="${PARAVT_LAUNCH_LOG:-$OUTPUT_DIR/logs/torchrun_node${NODE_RANK:-0}.log}"
# the nodes that only serve check the shared folder on their own; a training node's watcher ends its run with
# the line one of them left in node 0's rendezvous store (paravt.core.shared_fs check_serving)
if [[ "$SERVE_ONLY" != - ]]; then export PARAVT_SERVING_NODES="$SERVE_ONLY"; fi
if (( NNODES > 1 )); then multinode_setup run_rl.sh "$OUTPUT_DIR" "$TRAIN_NODES"; fi
if [[ "$MODE" == layout ]]; then
  # rollout.layout: this node's servers start here (paravt.rl.node_servers); trainer rank 0 waits for
  # every node's under output_dir (paravt.rl.layout.discovered_servers) and launches none itself.
  if [[ "$EXPECT" == - ]]; then EXPECT=""; fi  # no node serves (servers by rollout.urls only)
  export PARAVT_SERVERS_DIR="$OUTPUT_DIR/.paravt/servers/${PARAVT_RUN_ID:-local}" PARAVT_SERVERS_NODES="$EXPECT" \
         PARAVT_SERVERS_TIMEOUT="$SERVERS_TIMEOUT" PARAVT_SERVERS_GRACE="${SERVERS_GRACE:-${RDZV_TIMEOUT:-300}}" \
         PARAVT_SERVERS_SINCE="$(( $(date +%s) - ${RDZV_TIMEOUT:-300} ))"  # older records: an earlier run's (nodes start within RDZV_TIMEOUT)
  serve=(python -m paravt.rl.node_servers --ngpu "$NGPU")
  if (( NPROC == 0 )); then  # only serves: beats like the other nodes and ends when a training node does
    run_supervised "${serve[@]}" --nodes-dir "$PARAVT_NODES_DIR" "$RECIPE" "$@"
  fi
  if (( SERVERS > 0 )); then "${serve[@]}" "$RECIPE" "$@" & fi  # beside the trainers: ends with this launcher
fi
if [[ "$TRAIN_GPUS" != - ]]; then export CUDA_VISIBLE_DEVICES="$TRAIN_GPUS"; fi
if (( NNODES == 1 )); then
  torchrun_supervised --standalone --max-restarts="$MAX_RESTARTS" --nproc_per_node="$NPROC" -m paravt.rl.train "$RECIPE" "$@"
fi
# Several nodes: the rendezvous and its workers count the nodes that train.
NNODES="$TRAIN_NODES" torchrun_supervised "${TORCHRUN_NODES[@]}" --nproc_per_node="$NPROC" \
  --max-restarts="$MAX_RESTARTS" "${TORCHRUN_ENTRY[@]}" paravt.rl.train "$RECIPE" "$@"
