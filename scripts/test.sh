#!/usr/bin/env bash
# Set up the CPU environment and run the default test suite (what CI runs).
# Extra arguments go to pytest, e.g. bash scripts/test.sh -m slow
#   bash scripts/test.sh --conformance   the conformance group in .venv-conformance: our SGLang and
#                                        OpenAI request bodies checked with the pinned servers' own code
#   bash scripts/test.sh --real-server   the real-server group: a real vLLM server (CPU build, .venv-vllm)
#                                        serving a tiny SFT checkpoint, the eval driver against it
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export WANDB_MODE=offline TOKENIZERS_PARALLELISM=false DS_ACCELERATOR=cpu
if [[ "${1:-}" == "--conformance" ]]; then
  shift
  bash "$ROOT/scripts/setup_env.sh" conformance
  PARAVT_CONFORMANCE=1 exec .venv-conformance/bin/python -m pytest tests/conformance -m conformance "$@"
fi
bash "$ROOT/scripts/setup_env.sh" cpu
if [[ "${1:-}" == "--real-server" ]]; then
  shift
  bash "$ROOT/scripts/setup_env.sh" vllm
  PARAVT_REAL_SERVER=1 exec .venv-cpu/bin/python -m pytest tests/real_server -m real_server "$@"
fi
exec .venv-cpu/bin/python -m pytest "$@"
