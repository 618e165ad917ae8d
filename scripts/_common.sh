# Sourced by the launch scripts: activate a stage venv if present, load .secrets.env if present.
# usage: source scripts/_common.sh <stage>
PARAVT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_stage="${1:-cpu}"
if [[ -z "${VIRTUAL_ENV:-}" ]]; then
  if [[ -f "$PARAVT_ROOT/.venv-$_stage/bin/activate" ]]; then
    # shellcheck disable=SC1090
    source "$PARAVT_ROOT/.venv-$_stage/bin/activate"
  elif [[ -f "$PARAVT_ROOT/.venv-cpu/bin/activate" ]]; then
    # shellcheck disable=SC1090
    source "$PARAVT_ROOT/.venv-cpu/bin/activate"
  fi
fi
if [[ -f "$PARAVT_ROOT/.secrets.env" ]]; then
  set -a
  # shellcheck disable=SC1091
  source "$PARAVT_ROOT/.secrets.env"
  set +a
fi
# wandb: the recipe's logging.wandb_mode (offline by default; online to sync) unless WANDB_MODE is set.
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"

# --help / -h anywhere: the calling script's header comment (its usage), then, for a stage
# launcher, every setting of the stage (python -m <module> [RECIPE] --help). Exits 0.
script_help() {  # script_help <script path> [python module] [args...]
  local script="$1" module="${2:-}"; shift 2 || shift $#
  local a
  for a in "$@"; do
    if [[ "$a" == "-h" || "$a" == "--help" ]]; then
      sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$script" | sed '1s/^/usage: /'
      if [[ -n "$module" ]]; then
        echo
        local recipe=()
        [[ "${1:-}" == *.yaml ]] && recipe=("$1")
        python -m "$module" "${recipe[@]}" --help
      fi
      exit 0
    fi
  done
}

# torchrun_supervised <torchrun arguments...>: torchrun as this script's child, and this script's exit
# code the run's own. torchrun restarts (--max-restarts) a group whose worker failed: right for a
# crash (resume=auto continues from the newest checkpoint), wrong for a run that stopped itself (bad
# input: 2; lost work: 3), which a restart would resume and report as done. A rank that stops on
# purpose writes its code and line to $PARAVT_ABORT_FILE (paravt.core.shared_fs.report_abort);
# restarted workers see the file and end at once; then this prints the line and exits with the code.
# torchrun dies with this script (PR_SET_PDEATHSIG, kill -9 included) and TERM/INT are passed on to
# it, so the launcher also works as a container's PID 1.
# On several nodes (multinode_setup ran) a watcher beside torchrun ends this node's run when another
# node stops (paravt.core.shared_fs watch), and a torchrun that failed on its own names the nodes that left.
# run_supervised <command...> does the same for another command (a node that only serves rollouts).
# With PARAVT_LAUNCH_LOG=FILE (the stage launchers: output_dir/logs/torchrun_node<N>.log) the command's stderr
# is kept whole in FILE and reaches the terminal without torchrun's own traceback and failure report
# (paravt.core.launch_log); a run that fails names FILE above its one line.
torchrun_supervised() { run_supervised torchrun "$@"; }
run_supervised() {
  local abort pid rc code line watcher="" filt="" fifo="" log="${PARAVT_LAUNCH_LOG:-}"
  abort="$(mktemp -u "${TMPDIR:-/tmp}/paravt-abort.XXXXXXXX")"
  export PARAVT_ABORT_FILE="$abort"
  local start=(python -c 'import os, signal, sys
from paravt.core.procs import die_with_parent
die_with_parent(signal.SIGTERM)
os.execvp(sys.argv[1], sys.argv[1:])' "$@")
  if [[ -n "$log" ]] && mkdir -p "$(dirname "$log")" 2>/dev/null; then
    fifo="$(mktemp -u "${TMPDIR:-/tmp}/paravt-log.XXXXXXXX")"
    mkfifo "$fifo"
    python -m paravt.core.launch_log "$log" <"$fifo" >&2 &
    filt=$!
    "${start[@]}" 2>"$fifo" &
  else
    log=""
    "${start[@]}" &
  fi
  pid=$!
  if [[ -n "${PARAVT_NODES_DIR:-}" ]]; then
    python -m paravt.core.shared_fs watch --dir "$PARAVT_NODES_DIR" --node "$NODE_RANK" --nnodes "$PARAVT_NODES_N" \
      --prog "$PARAVT_NODES_PROG" --interval "$HEARTBEAT_S" --timeout "$RDZV_TIMEOUT" --pid "$pid" \
      --store "$MASTER_ADDR:${MASTER_PORT:-29500}" --run-id "$PARAVT_RUN_ID" --serving "${PARAVT_SERVING_NODES:-}" &
    watcher=$!
  fi
  trap 'kill -TERM "$pid" 2>/dev/null' TERM INT
  while :; do
    rc=0; wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break  # a trapped signal interrupted the wait: wait again
  done
  trap - TERM INT
  if [[ -n "$watcher" ]]; then
    kill "$watcher" 2>/dev/null || true
    wait "$watcher" 2>/dev/null || true
  fi
  if [[ -n "$filt" ]]; then  # the filter ends when the last writer does (bounded: an orphan may hold the pipe)
    for _ in {1..50}; do kill -0 "$filt" 2>/dev/null || break; sleep 0.1; done
    rm -f "$fifo"
  fi
  if [[ -n "$log" && ( -s "$abort" || "$rc" != 0 ) ]]; then
    echo "(torchrun's whole output, with its traceback and failure report: $log)" >&2
  fi
  if [[ -s "$abort" ]]; then
    IFS=$'\t' read -r code line <"$abort" || true
    rm -f "$abort"
    echo "$line" >&2
    exit "${code:-1}"
  fi
  rm -f "$abort"
  if [[ "$rc" != 0 && -n "${PARAVT_NODES_DIR:-}" ]]; then
    python -m paravt.core.shared_fs gone --dir "$PARAVT_NODES_DIR" --node "$NODE_RANK" --nnodes "$PARAVT_NODES_N" \
      --prog "$PARAVT_NODES_PROG" --interval "$HEARTBEAT_S" --since "$PARAVT_NODES_SINCE" || exit $?
  fi
  exit "$rc"
}

# cluster_check <prog>: NPROC, NNODES, NODE_RANK, MASTER_ADDR (resolved, bounded), MASTER_PORT, the timers and
# NODE_GPUS, before anything starts (paravt.core.cluster); a bad one is one line naming it, exit 2.
cluster_check() { python -m paravt.core.cluster "$1" || exit $?; }

# nodes_check <prog>: NNODES, NODE_RANK (read as decimal) and MASTER_ADDR of a run on several nodes,
# exported; a bad one is one line and exit 2.
nodes_check() {
  local prog="$1"
  if ! [[ "${NNODES:-}" =~ ^[1-9][0-9]*$ ]]; then
    echo "$prog: NNODES=${NNODES:-} must be a positive number of nodes" >&2; exit 2
  fi
  if ! [[ "${NODE_RANK:-}" =~ ^[0-9]+$ ]] || (( 10#$NODE_RANK >= 10#$NNODES )); then
    echo "$prog: NODE_RANK=${NODE_RANK:-} must be one of 0..$((NNODES - 1)) (NNODES=$NNODES), a different one on each node" >&2; exit 2
  fi
  NNODES=$((10#$NNODES)) NODE_RANK=$((10#$NODE_RANK))  # 08 -> 8
  if [[ -z "${MASTER_ADDR:-}" ]]; then
    echo "$prog: set MASTER_ADDR to node 0's address, the same on every node (NNODES=$NNODES)" >&2; exit 2
  fi
  export NNODES NODE_RANK
}

# multinode_setup <prog> <output_dir> [torchrun nodes]: the torchrun arguments of one node of NNODES (> 1),
# in the array TORCHRUN_NODES, and the module every worker starts with, in TORCHRUN_ENTRY (then the
# stage's). The rendezvous waits for [torchrun nodes] (default NNODES: fewer when some nodes only serve
# rollouts); every node of NNODES beats and is watched, under PARAVT_NODES_DIR (run id PARAVT_RUN_ID).
# * torchrun's c10d rendezvous at MASTER_ADDR:MASTER_PORT (node 0 hosts its store), run id RDZV_ID
#   (default SLURM_JOB_ID, else one per MASTER_PORT): every node's agent joins within RDZV_TIMEOUT
#   seconds (default 300) or the run ends; MAX_RESTARTS restarts all nodes' workers together and
#   resume=auto continues from the newest complete checkpoint, as on one node. torch numbers the nodes
#   by their addresses (LOCAL_ADDR sets this node's; NODE_RANK names it in messages).
# * the run folder must be shared: every node's first worker must see the token global rank 0 writes
#   under output_dir within FS_CHECK_TIMEOUT seconds (default 60), else one line naming the node, exit 2.
# * a node that stops (its launcher killed, its host gone) ends the others within RDZV_TIMEOUT with one
#   line naming it, exit 3 (heartbeats every HEARTBEAT_S seconds under output_dir/.paravt/nodes).
multinode_setup() {
  local prog="$1" out="$2" id
  nodes_check "$prog"
  RDZV_TIMEOUT="${RDZV_TIMEOUT:-300}" HEARTBEAT_S="${HEARTBEAT_S:-2}"
  id="${RDZV_ID:-${SLURM_JOB_ID:-paravt-${MASTER_PORT:-29500}}}"
  export PARAVT_RUN_ID="$id"; PARAVT_NODES_N="$NNODES"
  TORCHRUN_NODES=(--nnodes="${3:-$NNODES}" --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:${MASTER_PORT:-29500}"
                  --rdzv-id="$id" --rdzv-conf="join_timeout=$RDZV_TIMEOUT,is_host=$([[ "$NODE_RANK" == 0 ]] && echo 1 || echo 0)")
  [[ -n "${LOCAL_ADDR:-}" ]] && TORCHRUN_NODES+=(--local-addr="$LOCAL_ADDR")
  TORCHRUN_ENTRY=(-m paravt.core.shared_fs check --output-dir "$out" --prog "$prog" --timeout "${FS_CHECK_TIMEOUT:-60}")
  PARAVT_NODES_DIR="$out/.paravt/nodes/$id" PARAVT_NODES_PROG="$prog" PARAVT_NODES_SINCE="$(date +%s)"
  mkdir -p "$PARAVT_NODES_DIR" 2>/dev/null || true
  # this node's exit, for the others' report (a node killed with -9 leaves none: its heartbeat stops)
  trap 'echo "$?" >"$PARAVT_NODES_DIR/node$NODE_RANK.exit" 2>/dev/null || true' EXIT
}
