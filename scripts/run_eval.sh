#!/usr/bin/env bash
# Benchmark eval.  bash scripts/run_eval.sh [RECIPE.yaml] [key=value ...]
#   GPU node: bash scripts/run_eval.sh model=ParaVT/ParaVT-8B row=paravt-8b data_root=/data/bench \
#               "splits=[videomme,videomme_sub,longvideobench,lvbench,mlvu,mmvu]" backend=openai server.launch=sglang server.replicas=8
#   CPU:      bash scripts/run_eval.sh model=runs/quickstart/rl_paragrpo/final "split_paths={synthetic: runs/quickstart/world/local}" overview=paravt
# Results: <out>/<row>/<channel>/<split>.jsonl (resumable; run_config.json guards reuse), summaries beside them.
# Every Table-1 row: bash scripts/reproduce_paper.sh.  Settings: python -m paravt.eval.driver --help
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/_common.sh" eval
cd "$ROOT"
script_help "${BASH_SOURCE[0]}" paravt.eval.driver "$@"
exec python -m paravt.eval.driver "$@"
