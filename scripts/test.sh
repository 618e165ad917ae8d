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
exec .venv-cpu/bin/python -m pytest "$@"
