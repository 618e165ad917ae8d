#!/usr/bin/env python3
"""CI's time budgets, read from .ci/budgets.tsv (standard library only: it runs before any venv exists).

Each group has two figures, both in seconds on a machine of the file's reference speed (``ref_gflops``, as
``python -m paravt.core.machine_speed`` reads it) with the other track busy:
  expected  what the group took on the last recorded clean-clone run, scaled to the reference speed;
  hard      the group is stopped past it (a hang's only end). On a slower machine it grows in proportion,
            on a faster one it stays as written: a fast machine that slows down mid-run is never cut short.
After the run, each group's time is printed beside its expected time scaled to this machine's measured speed,
and a group past ``grow`` x that is named as grown. Growth is reported, never failed on: machines of one name
differ up to 2.2x from day to day, so only the hard budget (a hang) fails a run.

    python3 .ci/budgets.py hard NAME SPEED               -> the group's hard budget on this machine, in s
    python3 .ci/budgets.py report RESULTS.tsv SPEED      -> the table (RESULTS: name, rc, what, seconds)
    python3 .ci/budgets.py check                         -> exit 1 if the file is malformed (tested)
"""

from __future__ import annotations

import sys
from pathlib import Path

FILE = Path(__file__).with_name("budgets.tsv")


def load(path: Path = FILE) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """(settings, groups): settings ``ref_gflops`` and ``grow``; groups name -> (expected_s, hard_s).
    A malformed line raises ValueError naming the file and line."""
    settings: dict[str, float] = {}
    groups: dict[str, tuple[float, float]] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        try:
            if parts[0] in ("ref_gflops", "grow") and len(parts) == 2:
                settings[parts[0]] = float(parts[1])
            elif len(parts) == 3:
                expected, hard = float(parts[1]), float(parts[2])
                if not 0 < expected <= hard:
                    raise ValueError("needs 0 < expected <= hard")
                groups[parts[0]] = (expected, hard)
            else:
                raise ValueError("expected 'NAME EXPECTED_S HARD_S' or 'ref_gflops|grow VALUE'")
        except ValueError as e:
            raise ValueError(f"{path}:{n}: {raw.strip()!r}: {e}") from None
    for key in ("ref_gflops", "grow"):
        if settings.get(key, 0) <= 0:
            raise ValueError(f"{path}: '{key}' missing or not positive")
    return settings, groups


def scale(speed: float, ref: float) -> float:
    """How much longer a group takes here than on the reference machine (speed <= 0: unknown, 1)."""
    return ref / speed if speed > 0 else 1.0


def hard(name: str, speed: float, path: Path = FILE) -> int:
    settings, groups = load(path)
    if name not in groups:
        raise KeyError(f"{path}: no budget for group '{name}' (add 'NAME EXPECTED_S HARD_S')")
    return int(groups[name][1] * max(1.0, scale(speed, settings["ref_gflops"])))


def report(results: Path, speed: float, path: Path = FILE) -> str:
    settings, groups = load(path)
    ref, grow = settings["ref_gflops"], settings["grow"]
    k = scale(speed, ref)
    rows = [f"[ci] each group against its budget (.ci/budgets.tsv, at {ref:g} GFLOP/s; this machine "
            f"{speed:g} GFLOP/s, so x{k:.2f}):",
            f"[ci]   {'group':<14}{'took':>8}{'expected here':>15}{'ratio':>7}{'hard here':>11}  note"]
    grown = []
    for line in results.read_text().splitlines():
        name, rc, what, secs = (line.split("\t") + ["", "", "", ""])[:4]
        if name not in groups:
            rows.append(f"[ci]   {name:<14}{'':>8}  no budget in .ci/budgets.tsv ({what})")
            continue
        expected, hard_s = groups[name]
        exp_here, hard_here = expected * k, hard_s * max(1.0, k)
        if not secs:
            rows.append(f"[ci]   {name:<14}{'-':>8}{exp_here:>14.0f}s{'':>7}{hard_here:>10.0f}s  {what}")
            continue
        took = float(secs)
        ratio = took / exp_here
        note = what
        if ratio > grow:
            note += f"; GREW: {ratio:.2f}x its expected time on this machine"
            grown.append(name)
        rows.append(f"[ci]   {name:<14}{took:>7.0f}s{exp_here:>14.0f}s{ratio:>7.2f}{hard_here:>10.0f}s  {note}")
    rows.append("[ci] groups that grew past " + f"{grow:g}x: " + (", ".join(grown) if grown else "none"))
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["hard"] and len(argv) == 3:
            print(hard(argv[1], float(argv[2])))
        elif argv[:1] == ["report"] and len(argv) == 3:
            print(report(Path(argv[1]), float(argv[2])))
        elif argv == ["check"]:
            load()
        else:
            print("usage:\n" + "\n".join(ln for ln in __doc__.splitlines() if "python3 .ci/budgets.py" in ln),
                  file=sys.stderr)
            return 2
    except (ValueError, KeyError, OSError) as e:
        print(f"budgets: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
