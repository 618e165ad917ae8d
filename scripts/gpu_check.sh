#!/usr/bin/env bash
# The 8B path on one GPU, offline, in one command (<= 9 min on one H100/H200, inside one 600 s device call):
#   bash scripts/gpu_check.sh [OUT_DIR]            (default runs/gpu_check)
# 1. benchmarks/gpu_check.py: bf16 numerics (engine vs trainer logprobs at the recipe's lengths, 8B width),
#    the SFT and RL steps at Qwen3-VL-8B's width against a plain transformers reference (vision FLOPs per
#    layer on the tokens each sees), the vision tower alone with per-frame and batched attention, start-up
#    and the weight push at 8B size; each measurement in its own process with its own timeout, written as it ends;
# 2. tests/gpu: SFT (bf16, FSDP2 mixed precision, gradient checkpointing), RL through run_rl.sh (2 steps,
#    in-process engine on CUDA), eval with sub-agents, SGLang when .venv-sglang exists.
# The figures come first: they are what a rarely lent GPU is for, and a slow test cannot take their time.
# Writes OUT_DIR/gpu_check.json (every figure, the card named, the verdicts), OUT_DIR/gpu_check.log, one
# JSON per part and OUT_DIR/units/ (one per measurement).
# Without CUDA every part says why it was skipped and the script exits 0 (CI runs it so); where
# `nvidia-smi -L` lists a GPU, CUDA is required and every part fails without it.
# Offline machines: packages this project needs that the machine lacks travel as wheels in .whl/
# (bash scripts/gpu_wheels.sh builds them on a machine with a package index); they are installed into
# a private folder first. Knobs: GPU_CHECK_ARGS (extra arguments to gpu_check.py, e.g. "--layers 12").
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
OUT="${1:-runs/gpu_check}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: > "$LOG"
say() { echo "[gpu_check] $*" | tee -a "$LOG"; }
# The interpreter: the RL stage's venv, else the CPU one, else the machine's own python3. The launchers
# (run_rl.sh) call `python`: a wrapper script on PATH gives them the same one (a wrapper, not a symlink:
# a symlinked interpreter loses the machine's site-packages).
PY=""
for c in .venv-rl/bin/python .venv-cpu/bin/python; do [[ -x "$c" ]] && { PY="$ROOT/$c"; break; }; done
[[ -n "$PY" ]] || PY="$(command -v python3)"
SHIM="$(mktemp -d)"
printf '#!/bin/sh\nexec %s "$@"\n' "$PY" > "$SHIM/python"
chmod +x "$SHIM/python"
export PATH="$SHIM:$PATH"
if [[ -d .whl ]] && ls .whl/*.whl >/dev/null 2>&1; then
  say "installing $(ls .whl/*.whl | wc -l) carried wheels into /tmp/paravt-site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/paravt-site .whl/*.whl \
    >>"$LOG" 2>&1 || say "wheel install failed (see the log)"
  export PYTHONPATH="/tmp/paravt-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
say "python $PY; $("$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | tail -1)"
rc=0
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then export PARAVT_REQUIRE_GPU=1; fi
say "1/2 benchmarks/gpu_check.py"
# shellcheck disable=SC2086
timeout "${GPU_FIGURES_TIMEOUT_S:-450}" "$PY" benchmarks/gpu_check.py --out "$OUT" ${GPU_CHECK_ARGS:-} 2>&1 | tee -a "$LOG" \
  | grep --line-buffered "^\[gpu_check\]"
[[ "${PIPESTATUS[0]}" == 0 ]] || { say "gpu_check.py failed, timed out or missed a threshold"; rc=1; }
say "2/2 tests/gpu"
timeout "${GPU_TESTS_TIMEOUT_S:-115}" "$PY" -m pytest tests/gpu -m gpu -v -rs -p no:cacheprovider --junitxml "$OUT/tests_gpu.xml" \
  2>&1 | tee -a "$LOG" | grep --line-buffered -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed"
[[ "${PIPESTATUS[0]}" == 0 ]] || { say "tests/gpu failed or timed out"; rc=1; }
"$PY" - "$OUT" <<'PY' | tee -a "$LOG"
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path
out = Path(sys.argv[1])
res = {"parts": {}}
for p in ("numerics", "width", "startup"):
    f = out / f"{p}.json"
    res["parts"][p] = json.loads(f.read_text()) if f.exists() else {"error": "not written (timed out?)"}
v = out / "verdicts.json"
res["verdicts"] = json.loads(v.read_text()) if v.exists() else {}
x = out / "tests_gpu.xml"
if x.exists():
    s = ET.parse(x).getroot()
    s = s if s.tag == "testsuite" else s.find("testsuite")
    res["tests_gpu"] = {k: int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
(out / "gpu_check.json").write_text(json.dumps(res, indent=2))
print(f"[gpu_check] wrote {out / 'gpu_check.json'}: tests {res.get('tests_gpu')}; parts " +
      ", ".join(f"{k}: {'skipped' if 'skipped' in v else 'error' if 'error' in v else 'ok'}" for k, v in res["parts"].items()))
PY
exit "$rc"
