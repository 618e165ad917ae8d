#!/usr/bin/env bash
# Set up the CPU environment and run the default test suite (what CI runs).
# Extra arguments go to pytest, e.g. bash scripts/test.sh -m slow
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh" cpu
cd "$ROOT"
export WANDB_MODE=offline TOKENIZERS_PARALLELISM=false DS_ACCELERATOR=cpu
exec .venv-cpu/bin/python -m pytest "$@"
