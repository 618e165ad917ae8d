#!/usr/bin/env bash
# Run a command as if on a slower machine: in a CPU cgroup whose quota scales this machine's measured speed
# (python -m paravt.core.machine_speed, fp32 matmul GFLOP/s on 2 threads) down to TARGET GFLOP/s. The loops'
# budgets (CI <= 45 min, the default suite <= 8 min, the quickstart <= 20 min) are stated at ~120 GFLOP/s, and
# machines here read up to 2.2x that: this measures them at the stated speed on a faster machine.
#   bash benchmarks/at_speed.sh TARGET_GFLOPS COMMAND [ARGS...]
#   e.g. CI=true bash benchmarks/at_speed.sh 120 bash .ci/run
#        bash benchmarks/at_speed.sh 120 bash ../shared/tools/machine_speed.sh   (reads ~TARGET)
# Needs a writable cgroup CPU controller (v2: /sys/fs/cgroup/cpu.max, v1: /sys/fs/cgroup/cpu/cpu.cfs_quota_us)
# and a machine faster than TARGET; the quota is a share of CPU time, so memory bandwidth and latency are this
# machine's (a throttled run is a model of a slower machine, not one). Exits with the command's code.
#   AT_SPEED_MACHINE_GFLOPS: this machine's speed measured idle beforehand (machine_speed.sh), instead of a
#   measurement now (which reads low while other work shares the machine and would set too large a share).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -lt 2 || "$1" == -h || "$1" == --help ]]; then sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0" | sed '1s/^/usage: /'; exit 2; fi
TARGET="$1"; shift
[[ "$TARGET" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "at_speed.sh: TARGET_GFLOPS='$TARGET' must be a number" >&2; exit 2; }
PY="$ROOT/.venv-cpu/bin/python"; [[ -x "$PY" ]] || PY=python3
SPEED="${AT_SPEED_MACHINE_GFLOPS:-}"
[[ -z "$SPEED" || "$SPEED" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "at_speed.sh: AT_SPEED_MACHINE_GFLOPS='$SPEED' must be a number" >&2; exit 2; }
[[ -n "$SPEED" ]] || SPEED="$("$PY" -m paravt.core.machine_speed --seconds 2 | sed -n 's/^machine_speed_gflops=\([0-9.]*\).*/\1/p' | head -1)"
[[ -n "$SPEED" ]] || { echo "at_speed.sh: could not measure this machine's speed" >&2; exit 2; }
CPUS="$(env -u OMP_NUM_THREADS nproc)"
SHARE="$(python3 -c "import sys; t, s = map(float, sys.argv[1:3]); print(f'{t / s:.4f}')" "$TARGET" "$SPEED")"
if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 1 else 1)" "$SHARE"; then :; else
  echo "at_speed.sh: this machine reads $SPEED GFLOP/s, not faster than $TARGET: running as is" >&2; exec "$@"; fi
PERIOD=100000; QUOTA="$(python3 -c "import sys; print(int(float(sys.argv[1]) * int(sys.argv[2]) * int(sys.argv[3])))" "$SHARE" "$CPUS" "$PERIOD")"
NAME="paravt_at_speed_$$"
if [[ -w /sys/fs/cgroup/cgroup.subtree_control || -f /sys/fs/cgroup/cpu.max ]]; then
  CG="/sys/fs/cgroup/$NAME"; mkdir "$CG"; echo "$QUOTA $PERIOD" > "$CG/cpu.max"
else
  CG="/sys/fs/cgroup/cpu/$NAME"; mkdir "$CG"; echo "$PERIOD" > "$CG/cpu.cfs_period_us"; echo "$QUOTA" > "$CG/cpu.cfs_quota_us"
fi
trap 'rmdir "$CG" 2>/dev/null || true' EXIT
echo "at_speed.sh: this machine reads $SPEED GFLOP/s; running at $SHARE of its $CPUS CPUs' time (~$TARGET GFLOP/s): cgroup $CG, quota $QUOTA us per $PERIOD us" >&2
# the command runs only once it is in the cgroup (read back from /proc/self/cgroup): an unthrottled run would be
# reported as one at TARGET. A refused move is tried again (5 tries, 0.2 s apart), then named with the kernel's
# error and the process's scheduling policy: a v1 controller with RT group scheduling was seen to refuse such moves
# (EINVAL) for a while on a busy machine.
rc=0; bash -c 'for try in 1 2 3 4 5; do
    err=$( { echo $$ > "$1/cgroup.procs"; } 2>&1 ) && grep -q "/$2\$" /proc/self/cgroup && break
    if [[ $try == 5 ]]; then
      pol=$(awk "/^policy|^prio/ {printf \"%s=%s \", \$1, \$3}" /proc/$$/sched 2>/dev/null)
      echo "at_speed.sh: could not move the command into $1 (5 tries; ${err##*: }; ${pol:-policy unknown})" >&2; exit 2
    fi
    sleep 0.2
  done; shift 2; exec "$@"' _ "$CG" "$NAME" "$@" || rc=$?
for p in $(cat "$CG/cgroup.procs" 2>/dev/null); do kill "$p" 2>/dev/null || true; done  # nothing left behind in it
exit "$rc"
