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
# purpose writes its code and line to $PARAVT_ABORT_FILE (paravt.models.stage_main.report_abort);
# restarted workers see the file and end at once; then this prints the line and exits with the code.
# torchrun dies with this script (PR_SET_PDEATHSIG, kill -9 included) and TERM/INT are passed on to
# it, so the launcher also works as a container's PID 1.
torchrun_supervised() {
  local abort pid rc code line
  abort="$(mktemp -u "${TMPDIR:-/tmp}/paravt-abort.XXXXXXXX")"
  export PARAVT_ABORT_FILE="$abort"
  python -c 'import os, signal, sys
from paravt.core.procs import die_with_parent
die_with_parent(signal.SIGTERM)
os.execvp(sys.argv[1], sys.argv[1:])' torchrun "$@" &
  pid=$!
  trap 'kill -TERM "$pid" 2>/dev/null' TERM INT
  while :; do
    rc=0; wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break  # a trapped signal interrupted the wait: wait again
  done
  trap - TERM INT
  if [[ -s "$abort" ]]; then
    IFS=$'\t' read -r code line <"$abort" || true
    rm -f "$abort"
    echo "$line" >&2
    exit "${code:-1}"
  fi
  rm -f "$abort"
  exit "$rc"
}
