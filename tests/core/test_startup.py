"""`python -m paravt.…` processes that load torch and the model code do so with the cyclic garbage collector paused,
and each turns it back on (collect, freeze, enable) once its set-up is done (paravt.core.startup)."""

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


def _python(args):
    env = {k: v for k, v in os.environ.items() if k != "PARAVT_STARTUP_GC"}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# Reports at exit whether the collector is on: `--help` exits before an entry point reaches ready().
SITECUSTOMIZE = 'import atexit, gc, sys\natexit.register(lambda: print("collecting", gc.isenabled()))\n'


@pytest.mark.parametrize("args,env,paused", [
    (["-m", "paravt.analysis.probe", "--help"], None, True),  # loads the model code: paused
    (["-u", "-m", "paravt.analysis.probe", "--help"], None, True),  # interpreter options before -m (torchrun's -u)
    (["-m", "paravt.analysis.probe", "--help"], {"PARAVT_STARTUP_GC": "on"}, False),  # the opt-out
    (["-m", "paravt.viz", "--help"], None, False),  # a light tool: nothing heavy to load, left alone
])
def test_a_heavy_entry_point_loads_paused_unless_told(tmp_path, args, env, paused):
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    e = {k: v for k, v in os.environ.items() if k != "PARAVT_STARTUP_GC"}
    e.update({"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", **(env or {})})
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=e, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == f"collecting {not paused}"


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


# Where each heavy entry point's set-up ends: the trainers' after they are built (run_trainer), the eval driver's
# when its engine is built (build_engine), the dry run's first model, the server before it serves.
SET_UP_ENDS = {
    "paravt.sft.train": ("paravt/models/stage_main.py", "run_trainer"),
    "paravt.rl.train": ("paravt/models/stage_main.py", "run_trainer"),
    "paravt.eval.driver": ("paravt/engines/factory.py", "build_engine"),
    "paravt.dryrun": ("paravt/dryrun/workload.py", "build_model"),
    "paravt.models.tiny": ("paravt/models/tiny.py", "build_tiny"),
    "paravt.engines.hf_server": ("paravt/engines/hf_server.py", "main"),
    "paravt.analysis.probe": ("paravt/analysis/probe.py", "main"),
}


def test_every_heavy_entry_point_turns_the_collector_back_on():
    from paravt.core.startup import HEAVY_ENTRY_POINTS

    assert set(SET_UP_ENDS) == set(HEAVY_ENTRY_POINTS)
    missing = [m for m, (path, fn) in SET_UP_ENDS.items() if not _calls_ready(ROOT / path, fn)]
    assert not missing, f"entry points paused at start-up that never call paravt.core.startup.ready(): {missing}"
