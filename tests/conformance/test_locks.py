"""The maintainer's side of the lock files (``scripts/lock_requirements.py`` with ``uv pip compile``, here in
.venv-conformance, which has uv): a fresh resolution that differs from a lock is drift, reported as
information with each package's versions (exit 0; ``--fail-on-drift`` 3), rewriting the lock takes the new
release, and an index out of reach is exit 2, never "current". A local folder of wheels stands in for the
package index, so nothing here depends on what the live index publishes. (The check CI gates on reads the
files alone: tests/test_locks.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.conformance


def _lock(*args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/lock_requirements.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, **env})


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A pure-Python wheel holding only its metadata: all a resolver reads."""
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    files = {f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: paravt-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{k},,\n" for k in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


def test_a_new_upstream_release_is_drift_reported_as_information_never_a_failed_verify(tmp_path):
    index, req = tmp_path / "index", tmp_path / "requirements"
    index.mkdir()
    req.mkdir()
    _wheel(index, "demo-app", "1.0", ("demo-lib>=1",))
    _wheel(index, "demo-lib", "1.0")
    (req / "sglang.txt").write_text("demo-app==1.0\n")
    where = ["sglang", "--requirements", str(req), "--locks", str(req / "locks"), "--find-links", str(index)]
    r = _lock(*where)
    assert r.returncode == 0 and "sglang: wrote" in r.stdout, r.stdout + r.stderr
    assert "demo-lib==1.0" in (req / "locks/sglang.txt").read_text()
    _wheel(index, "demo-lib", "1.1")  # the index publishes a new release of a transitive package
    assert _lock("--verify", *where[:-2]).returncode == 0
    r = _lock("--check", *where)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sglang: drift (information, not a failure)" in r.stdout and "demo-lib 1.0 -> 1.1" in r.stdout, r.stdout
    assert _lock("--check", "--fail-on-drift", *where).returncode == 3
    r = _lock(*where)  # the maintainer's refresh takes it
    assert r.returncode == 0 and "changed: demo-lib 1.0 -> 1.1" in r.stdout, r.stdout + r.stderr
    r = _lock("--check", *where)
    assert r.returncode == 0 and "sglang: current" in r.stdout, r.stdout + r.stderr


def test_an_index_out_of_reach_is_a_failure_not_current():
    r = _lock("--check", "rl", HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9",
              UV_NO_CACHE="1")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "could not be reached" in r.stderr and "drift was not checked" in r.stderr, r.stderr
    assert "current (" not in r.stdout, r.stdout
