#!/usr/bin/env bash
# Wheels for an offline GPU machine whose Python lacks some of this project's packages:
#   bash scripts/gpu_wheels.sh [--python-version 3.12] [DIR]      (default DIR .whl, git-ignored here)
# Downloads, for CPython 3.12 on manylinux x86_64, the packages a stock torch + transformers GPU image
# was seen to lack (av, hydra-core, omegaconf and its antlr4 runtime, which is an sdist and is built
# into a wheel here, and transformers at the version this project pins), without their dependencies.
# scripts/gpu_check.sh installs every wheel it finds in .whl/ into a private folder before it runs.
# ~50 MB. Run it on a machine that reaches a package index; carry DIR to the GPU machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYV=3.12
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
if [[ "${1:-}" == "--python-version" ]]; then PYV="$2"; shift 2; fi
DIR="${1:-.whl}"
mkdir -p "$DIR"
[[ "$DIR" = /* ]] || grep -qx "/$DIR/" .git/info/exclude 2>/dev/null || echo "/$DIR/" >> .git/info/exclude
TRANSFORMERS="$(grep -hoE '^transformers==[0-9.]+' requirements/cpu.txt | head -1)"
PLAT=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  PLAT+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp "${PLAT[@]}" \
  -d "$DIR" av==18.1.0 hydra-core==1.3.8 omegaconf==2.3.0 "$TRANSFORMERS"
python3 -m pip wheel -q --no-deps -w "$DIR" antlr4-python3-runtime==4.9.3
ls -la "$DIR"
du -sh "$DIR"
