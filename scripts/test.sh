#!/usr/bin/env bash
# Set up the CPU environment and run the default test suite (what CI runs).
# Extra arguments go to pytest, e.g. bash scripts/test.sh -m slow
#   bash scripts/test.sh --conformance   the conformance group in .venv-conformance: our SGLang and
#                                        OpenAI request bodies checked with the pinned servers' own code
#   bash scripts/test.sh --real-server   the real-server group: a real vLLM server (CPU build, .venv-vllm)
#                                        serving a tiny SFT checkpoint, the eval driver against it
#   bash scripts/test.sh --gpu           tests/gpu in the GPU stage environment (.venv-rl, else .venv-sft,
#                                        else the python on PATH); fails, never skips, without CUDA.
#                                        bash scripts/gpu_check.sh runs them and the 8B-width figures.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export WANDB_MODE=offline TOKENIZERS_PARALLELISM=false DS_ACCELERATOR=cpu
if [[ "${1:-}" == "--conformance" ]]; then
  shift
  bash "$ROOT/scripts/setup_env.sh" conformance
  PARAVT_CONFORMANCE=1 exec .venv-conformance/bin/python -m pytest tests/conformance -m conformance "$@"
fi
if [[ "${1:-}" == "--gpu" ]]; then
  shift
  PY="$(command -v python3)"
  for c in .venv-rl/bin/python .venv-sft/bin/python; do [[ -x "$c" ]] && { PY="$c"; break; }; done
  "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || {
    echo "test.sh --gpu: $PY has no CUDA torch or this machine no GPU (torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo missing)): on a GPU node build the environment with bash scripts/setup_env.sh rl" >&2
    exit 1
  }
  PARAVT_REQUIRE_GPU=1 exec "$PY" -m pytest tests/gpu -m gpu "$@"
fi
bash "$ROOT/scripts/setup_env.sh" cpu
if [[ "${1:-}" == "--real-server" ]]; then
  shift
  bash "$ROOT/scripts/setup_env.sh" vllm
  # Per test 1800 s, not the suite's 900: the first test's setup builds the tiny SFT checkpoint and starts
  # a vLLM server, which on a slow or shared machine takes longer than 900 s on its own.
  PARAVT_REAL_SERVER=1 exec .venv-cpu/bin/python -m pytest -o timeout=1800 tests/real_server -m real_server "$@"
fi
# Without a marker expression (-m), the tests run on PARAVT_TEST_WORKERS pytest processes (pytest-xdist; default
# 2 where the machine has 2 CPUs, else 1): most of the default group's time is waiting (localhost servers,
# timeouts, process start-ups), so two workers finish it ~1.35x sooner on 2 cores. Each module's tests stay on
# one worker (--dist loadscope), so a module's fixtures are built once. The marked groups (launcher, slow) run
# torchrun with 2 ranks or whole pipelines and keep one process. PARAVT_TEST_WORKERS=1: one process.
WORKERS="${PARAVT_TEST_WORKERS:-$(( $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) >= 2 ? 2 : 1 ))}"
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || { echo "test.sh: PARAVT_TEST_WORKERS must be a count >= 1, got '$WORKERS'" >&2; exit 2; }
XDIST=()
if (( WORKERS > 1 )) && ! printf '%s\n' "$@" | grep -qE '^(-m|--markers?)'; then
  XDIST=(-n "$WORKERS" --dist loadscope)
  # One OpenMP thread per process (unless set): with a worker per core, a second thread of a worker or of a
  # process it starts waits for a core the other worker holds and spins at every barrier (the suite on 2 cores:
  # 460 CPU-s in 287 s instead of 532 in 315; docs/RESULTS.md). CI sets the same for every group.
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
fi
exec .venv-cpu/bin/python -m pytest "${XDIST[@]}" "$@"
