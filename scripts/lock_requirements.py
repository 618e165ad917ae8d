"""Lock files of the GPU stage environments, resolved by a real resolver (``uv pip compile``) for the
machines they run on (Linux x86_64, CPython 3.11, the stage's package indexes), and the check that
they are current.

    python scripts/lock_requirements.py                 # (re)write requirements/locks/<stage>.txt
    python scripts/lock_requirements.py --check         # CI: every lock equals a fresh resolution
    python scripts/lock_requirements.py rl sglang       # some stages only

A lock pins every package of the stage, transitive ones included. Resolution only sees files
published before the lock's date (``--exclude-newer``, kept in the lock's first line), so the same
requirement file resolves to the same lock on any day, and ``--check`` fails only when a
requirement file changed without its lock. ``--date`` moves the date (a deliberate upgrade).
``scripts/setup_env.sh`` installs a stage from its lock when there is one.

The check also proves the rule of the weight push: the RL trainer and the SGLang server join one
NCCL communicator, so their locks must hold the same torch and the same NCCL wheel.

An index that cannot be reached is a failure with one line (exit 2), never "current". Every stage
resolves from PyPI alone (``sft`` and ``eval`` take PyPI's torch 2.9.1, its CUDA 12.8 build).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "requirements" / "locks"
PYPI = "https://pypi.org/simple"

# stage -> (requirement file, platform tag of the machines it runs on). SGLang 0.5.23 publishes
# manylinux_2_34 wheels only; the trainer's wheels run on manylinux_2_28 systems and newer.
STAGES = {
    "rl": ("requirements/rl.txt", "x86_64-manylinux_2_28"),
    "sglang": ("requirements/sglang.txt", "x86_64-manylinux_2_34"),
    "sft": ("requirements/sft.txt", "x86_64-manylinux_2_28"),
    "eval": ("requirements/eval.txt", "x86_64-manylinux_2_28"),
}
WEIGHT_GROUP = ("rl", "sglang")  # environments whose processes share one NCCL communicator
DEFAULT_DATE = "2026-11-27T00:00:00Z"
HEADER = "# uv pip compile {req} --python-version 3.11 --python-platform {platform} --exclude-newer {date}"


class IndexUnreachable(RuntimeError):
    pass


def uv() -> str:
    exe = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(exe).exists():
        raise SystemExit("lock_requirements: uv is not installed in this environment (pip install uv)")
    return exe


def resolve(stage: str, date: str) -> str:
    """The stage's lock text: the header line, then uv's resolution."""
    req, platform = STAGES[stage]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "lock.txt"
        cmd = [uv(), "pip", "compile", str(ROOT / req), "--python-version", "3.11", "--python-platform", platform,
               "--exclude-newer", date, "--index-url", PYPI, "--no-header", "--quiet", "-o", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            err = " ".join(r.stderr.split())
            if re.search(r"dns error|connect|timed out|network|Could not connect|failed to fetch", err, re.I):
                raise IndexUnreachable(f"{stage}: the package index could not be reached ({err[:300]})")
            raise RuntimeError(f"{stage}: {req} does not resolve: {err[:600]}")
        body = out.read_text()
    # uv's "# via -r <absolute path>" comments: written relative, so a lock does not name a machine
    body = body.replace(str(ROOT) + "/", "")
    return HEADER.format(req=req, platform=platform, date=date) + "\n" + body


def pins(text: str) -> dict[str, str]:
    """name -> version of every ``name==version`` line of a lock (comments ignored)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;]+)", line)
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def lock_date(text: str) -> str | None:
    m = re.search(r"--exclude-newer (\S+)", text.splitlines()[0]) if text else None
    return m.group(1) if m else None


def one_nccl(locks: dict[str, str]) -> list[str]:
    """Problems with the weight group's rule: the same torch and NCCL in both environments' locks."""
    have = {s: pins(t) for s, t in locks.items() if s in WEIGHT_GROUP}
    if len(have) < len(WEIGHT_GROUP):
        return []
    bad = []
    for pkg in ("torch", *sorted({p for v in have.values() for p in v if p.startswith("nvidia-nccl")})):
        vers = {s: v.get(pkg) for s, v in have.items()}
        if len(set(vers.values())) > 1:
            bad.append(f"{pkg} differs between the environments of one weight group: {vers}")
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stages", nargs="*", choices=[[], *STAGES], default=[], help="default: every stage")
    p.add_argument("--check", action="store_true", help="fail if a lock differs from a fresh resolution")
    p.add_argument("--locks", type=Path, default=LOCKS, help="the lock files' folder (default requirements/locks)")
    p.add_argument("--date", default=None, help=f"resolve with files published before this (default: the lock's "
                                                f"own, else {DEFAULT_DATE})")
    a = p.parse_args(argv)
    stages = a.stages or list(STAGES)
    failed, unchecked, locks = [], [], {}
    for stage in stages:
        path = a.locks / f"{stage}.txt"
        old = path.read_text() if path.exists() else None
        date = a.date or lock_date(old) or DEFAULT_DATE
        try:
            new = resolve(stage, date)
        except IndexUnreachable as exc:
            if old is None:  # a stage this machine could never lock (its index is out of reach)
                unchecked.append(f"{stage}: no lock ({' '.join(str(exc).split())[:200]})")
                continue
            print(f"lock_requirements: {exc}; the locks were not checked", file=sys.stderr)
            return 2
        except RuntimeError as exc:
            print(f"lock_requirements: {exc}", file=sys.stderr)
            return 2
        locks[stage] = new
        if a.check:
            if old is None:
                failed.append(f"{stage}: {path} is missing (python scripts/lock_requirements.py "
                              f"{stage})")
            elif pins(old) != pins(new):
                o, n = pins(old), pins(new)
                diff = sorted(f"{k} {o.get(k, '-')} -> {n.get(k, '-')}" for k in set(o) | set(n) if o.get(k) != n.get(k))
                failed.append(f"{stage}: the lock is not current ({len(diff)} change(s): {', '.join(diff[:8])}); "
                              f"python scripts/lock_requirements.py {stage}")
            else:
                print(f"{stage}: current ({len(pins(new))} packages, files before {date})")
        else:
            a.locks.mkdir(parents=True, exist_ok=True)
            path.write_text(new)
            print(f"{stage}: wrote {path} ({len(pins(new))} packages, files before {date})")
    failed += one_nccl(locks)
    for line in unchecked:
        print(f"not locked: {line}")
    for line in failed:
        print(f"FAIL {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
