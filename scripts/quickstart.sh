#!/usr/bin/env bash
# The main job on the embedded default (CPU): set up the CPU venv, build the tiny Qwen3-VL,
# generate and materialize the synthetic long-video world, and print what was made.
# Finished stages are reused on a rerun (delete the output folder to start over).
#   bash scripts/quickstart.sh [OUT_DIR]      (default: runs/quickstart)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/runs/quickstart}"
bash "$ROOT/scripts/setup_env.sh" cpu
source "$ROOT/scripts/_common.sh" cpu
cd "$ROOT"
mkdir -p "$OUT"
SEED="${SEED:-0}"

step() { echo; echo "== $* =="; }

step "1/3 tiny Qwen3-VL -> $OUT/tiny_model"
if [[ -f "$OUT/tiny_model/paravt_tiny.json" ]]; then echo "reusing"; else
  python -m paravt.models.tiny --out "$OUT/tiny_model" --seed "$SEED"; fi

step "2/3 synthetic world -> $OUT/world"
if [[ -f "$OUT/world/world_stats.json" ]]; then echo "reusing"; else
  python -m paravt.data.synthetic --out "$OUT/world" --seed "$SEED"; fi

step "3/3 materialize -> $OUT/world/local"
if [[ -f "$OUT/world/local/materialize_report.json" ]]; then echo "reusing"; else
  python -m paravt.data.materialize --root "$OUT/world/media" --parquet-dir "$OUT/world/parquet" \
    --output-dir "$OUT/world/local"; fi

step "made"
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
tiny = json.loads((out / "tiny_model/paravt_tiny.json").read_text())
stats = json.loads((out / "world/world_stats.json").read_text())
rep = json.loads((out / "world/local/materialize_report.json").read_text())
print(f"tiny model      {out/'tiny_model'}: {tiny['parameters']:,} parameters, tokenizer {tiny['tokenizer_size']} tokens")
print(f"world           {stats['videos']} videos (mean {stats['mean_duration_s']} s), {stats['media_bytes']/1e6:.1f} MB of mp4")
print(f"parquets        SFT {stats['sft_rows']} rows ({stats['sft_subagent_rows']} sub-agent), RL {stats['rl_rows']}, eval {stats['eval_rows']}")
print(f"materialized    {sum(rep['files'].values())} rows, missing files: {rep['missing_total']}")
print("event visible in a K-frame overview (eval):",
      ", ".join(f"K={k}: {v:.0%}" for k, v in sorted(stats["eval_event_visible_in_overview"].items(), key=lambda x: int(x[0]))))
PY
