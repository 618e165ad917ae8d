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
export DS_ACCELERATOR="${DS_ACCELERATOR:-$(python -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")' 2>/dev/null || echo cpu)}"

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
