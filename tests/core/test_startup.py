"""`python -m paravt.…` processes load their modules with the cyclic garbage collector paused, and every entry
point turns it back on (collect, freeze, enable) once its set-up is done (paravt.core.startup)."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, json, os, sys
import paravt
from paravt.core import startup
startup.pause()
before = [gc.isenabled(), startup.paused()]
frozen0 = gc.get_freeze_count()
startup.ready()
after = [gc.isenabled(), startup.paused(), gc.get_freeze_count() > frozen0]
startup.ready()  # a second call changes nothing
again = [gc.isenabled(), startup.paused()]
# a child forked while paused turns the collector back on at once
gc.disable(); startup._paused = True
pid = os.fork()
if pid == 0:
    os._exit(0 if gc.isenabled() and not startup.paused() else 1)
_, status = os.waitpid(pid, 0)
child = os.waitstatus_to_exitcode(status) == 0
startup.ready()
print(json.dumps({"before": before, "after": after, "again": again, "child": child}))
"""


def _python(args, env_extra=None, path=()):
    env = {k: v for k, v in os.environ.items() if k != "PARAVT_STARTUP_GC"}
    env.update({"PYTHONPATH": os.pathsep.join([*map(str, path), str(ROOT)]), **(env_extra or {})})
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


ENTRY = """
import gc, json
from paravt.core import startup
was = [gc.isenabled(), startup.paused()]
frozen0 = gc.get_freeze_count()
startup.ready()
print(json.dumps({"was": was, "now": [gc.isenabled(), startup.paused()], "froze": gc.get_freeze_count() > frozen0}))
"""


@pytest.mark.parametrize("env,paused", [(None, True), ({"PARAVT_STARTUP_GC": "on"}, False)])
def test_a_dash_m_process_loads_paravt_paused_unless_told_and_collects_after_ready(tmp_path, env, paused):
    # `python -m pkg.mod` imports its package first, with sys.argv[0] == "-m", as `python -m paravt.sft.train` does
    (tmp_path / "entry").mkdir()
    (tmp_path / "entry/__init__.py").write_text("import paravt\n")
    (tmp_path / "entry/main.py").write_text(ENTRY)
    out = _python(["-m", "entry.main"], env, path=[tmp_path])
    assert out["was"] == [not paused, paused]
    assert out["now"] == [True, False]
    assert out["froze"] is paused  # the set-up's survivors left out of later collections


def test_pause_ready_and_a_forked_child():
    out = _python(["-c", PROBE])  # a program that imports paravt is not paused by the import; pause() by hand here
    assert out["before"] == [False, True]
    assert out["after"] == [True, False, True]
    assert out["again"] == [True, False]
    assert out["child"] is True


def test_importing_paravt_from_another_program_leaves_the_collector_alone():
    out = _python(["-c", "import gc, json, paravt; from paravt.core import startup; "
                         "print(json.dumps([gc.isenabled(), startup.paused()]))"])
    assert out == [True, False]


def _calls_ready(path: Path, function: str | None = None) -> bool:
    tree = ast.parse(path.read_text())
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function] if function else [tree]
    return any(isinstance(c, ast.Call) and getattr(c.func, "id", None) == "ready" for n in nodes for c in ast.walk(n))


# Entry points whose set-up ends in a shared function: the trainers' (run_trainer: after the trainer is built),
# the eval driver's (build_engine: its engine is the last thing it sets up), the dry run's (its first model).
DELEGATES = {
    "paravt/sft/train.py": ("paravt/models/stage_main.py", "run_trainer"),
    "paravt/rl/train.py": ("paravt/models/stage_main.py", "run_trainer"),
    "paravt/eval/driver.py": ("paravt/engines/factory.py", "build_engine"),
    "paravt/dryrun/__main__.py": ("paravt/dryrun/workload.py", "build_model"),
    "paravt/models/tiny.py": ("paravt/models/tiny.py", "build_tiny"),
}


def test_every_entry_point_of_the_package_turns_the_collector_back_on():
    entries = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "paravt").rglob("*.py")
                     if p.name == "__main__.py" or '__name__ == "__main__"' in p.read_text())
    assert len(entries) >= 20, entries
    missing = []
    for rel in entries:
        if rel in DELEGATES:
            target, fn = DELEGATES[rel]
            ok = _calls_ready(ROOT / target, fn)
        else:
            ok = _calls_ready(ROOT / rel, "main")
        if not ok:
            missing.append(rel)
    assert not missing, f"entry points that never call paravt.core.startup.ready(): {missing}"
