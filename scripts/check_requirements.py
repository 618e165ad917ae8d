"""Check a stage's requirement files for conflicts on Linux x86_64, without installing anything.

    python scripts/check_requirements.py requirements/rl.txt [--then LATER_FILE ...] [--python-version 3.11]

For every ``name==version`` pin of the files (taken together: the stage's install steps), the metadata
of the pinned wheel for CPython on manylinux x86_64 is read (pip's dry-run report: the metadata file alone
where the index serves it, as PyPI does);
each of its ``Requires-Dist`` entries that applies on Linux x86_64 is checked against the files' pin of
that package. A pin that breaks a pinned wheel's requirement is a **conflict** (exit 1), named with both
sides. A file listed after ``--then`` is a later install step (``pip install --no-deps`` after the rest):
its pins may override earlier requirements on purpose and are reported, not failed. A pin this package
index does not serve is **not on this registry**: named and left out (the index reachable from CPU
machines lacks some CUDA packages), never mistaken for a conflict. ``--extra-index-url`` lines are
ignored (the wheels compared come from the index pip is configured with).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# pip matches each platform tag exactly: every glibc level a Linux x86_64 GPU node may have
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + ["manylinux2014_x86_64", "manylinux1_x86_64",
                                                                       "linux_x86_64"]


def read_pins(path: Path) -> dict[str, str]:
    """``{normalised name: version}`` of the ``name==version`` lines (extras and comments dropped)."""
    from packaging.requirements import Requirement

    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        spec = list(req.specifier)
        if len(spec) == 1 and spec[0].operator == "==" and "*" not in spec[0].version:
            pins[canon(req.name)] = spec[0].version
    return pins


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sdist_only(name: str, version: str, dest: Path) -> bool:
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", "--no-build-isolation",
                        "-d", str(dest / "sdist"), "--quiet", "--retries", "1", f"{name}=={version}"],
                       capture_output=True, text=True)
    return r.returncode == 0 or "metadata" in r.stderr.lower()


def fetch_metadata(name: str, version: str, python_version: str, dest: Path) -> list[str] | None:
    """The pinned wheel's ``Requires-Dist`` entries, or None when this index has no such wheel.

    pip resolves the one wheel for Linux x86_64 in a dry run and writes its metadata to a report: where
    the index serves a wheel's metadata on its own (PEP 658, as PyPI does) only that file is fetched,
    not the wheel (torch 2.9.1: a few kB instead of ~0.9 GB); elsewhere pip reads it from the wheel."""
    report = dest / f"{canon(name)}-report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
           "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
           "--target", str(dest / "never-written"), "--report", str(report), "--quiet", "--retries", "1",
           f"{name}=={version}"]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode or not report.exists():
        return None
    for item in json.loads(report.read_text()).get("install", []):
        if canon(item["metadata"]["name"]) == canon(name):
            return list(item["metadata"].get("requires_dist") or [])
    return None


def requirements_of(requires_dist: list[str], python_version: str) -> list:
    from packaging.requirements import Requirement

    env = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "python_version": python_version, "python_full_version": python_version + ".0",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    out = []
    for line in requires_dist:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            out.append(req)
    return out


def check(steps: list[dict[str, str]], python_version: str, log=print) -> tuple[list[str], list[str], list[str]]:
    """(conflicts, overrides, not on this registry) for install steps in order (each a pins dict)."""
    first = steps[0]
    later = {k: v for s in steps[1:] for k, v in s.items()}
    conflicts, overrides, missing = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name, version in sorted(first.items()):
            meta = fetch_metadata(name, version, python_version, Path(tmp))
            if meta is None:
                why = "an sdist only (its requirements come at build time)" if sdist_only(name, version, Path(tmp)) \
                    else "not on this registry"
                missing.append(f"{name}=={version}")
                log(f"  {name}=={version}: {why} (left out)")
                continue
            for req in requirements_of(meta, python_version):
                dep = canon(req.name)
                if dep in first and not req.specifier.contains(first[dep], prereleases=True):
                    conflicts.append(f"{name}=={version} requires {req.name}{req.specifier}, the file pins "
                                     f"{dep}=={first[dep]}")
                if dep in later and not req.specifier.contains(later[dep], prereleases=True):
                    overrides.append(f"{dep}=={later[dep]} (a later step) overrides {name}=={version}'s "
                                     f"{req.name}{req.specifier}")
    return conflicts, overrides, missing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/check_requirements.py", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="the stage's first install step's files; --then FILE for later steps")
    p.add_argument("--then", action="append", default=[], help="a later install step (installed --no-deps after)")
    p.add_argument("--python-version", default="3.11")
    a = p.parse_args(argv)
    first: dict[str, str] = {}
    for f in a.files:
        first.update(read_pins(Path(f)))
    steps = [first] + [read_pins(Path(f)) for f in a.then]
    print(f"checking {', '.join(a.files)}" + (f" then {', '.join(a.then)}" if a.then else "") +
          f" (CPython {a.python_version}, Linux x86_64): {len(first)} pins")
    conflicts, overrides, missing = check(steps, a.python_version)
    for o in overrides:
        print(f"  override on purpose: {o}")
    for c in conflicts:
        print(f"  CONFLICT: {c}")
    print(f"{len(conflicts)} conflict(s); {len(missing)} pin(s) left out (no wheel here): {', '.join(missing) or '-'}")
    return 1 if conflicts else 0


if __name__ == "__main__":
    sys.exit(main())
