#!/usr/bin/env bash
# Reproduce Table 1 (the thirteen rows of configs/eval/paper_table1.yaml on the seven splits) and print it
# beside the paper's published cells, cell by cell, with the paper's claims as the authors state them.
#   GPU:  bash scripts/reproduce_paper.sh --data_root /data/bench backend=openai server.launch=sglang
#         --row videorft (one row) · --row mine --model CKPT (your checkpoint as its own row)
#         --vanilla_metrics RUN/metrics.jsonl --paragrpo_metrics RUN/metrics.jsonl (the f_tau claim)
#   CPU:  bash scripts/reproduce_paper.sh --smoke     (tiny SFT model on the synthetic eval set, the published
#         table beside it with every measured cell n.a., and the thirteen rows checked; runs the
#         quickstart's world + SFT first if they are missing)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/_common.sh" eval
cd "$ROOT"
script_help "${BASH_SOURCE[0]}" "" "$@"
if [[ "${1:-}" == "--smoke" ]]; then
  shift
  QS="${QS:-runs/quickstart}"
  if [[ ! -e "$QS/sft/final/config.json" ]]; then
    QUICKSTART_STOP_AFTER=sft bash scripts/quickstart.sh "$QS"
  fi
  exec python -m paravt.eval.reproduce --smoke --model "$QS/sft/final" --synthetic "$QS/world/local" \
    --out "${OUT:-runs/table1_smoke}" --limit "${LIMIT:-40}" "$@"
fi
exec python -m paravt.eval.reproduce "$@"
