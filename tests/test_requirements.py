"""Every stage's requirement files resolve on Linux x86_64 (CPython 3.11): each pinned wheel's own
METADATA against the files' other pins (scripts/check_requirements.py), without installing. Reads the
live package index (one pip dry run per pin, the wheels' metadata only where the index serves it), whose
answers move as it grows, so these are a maintainer's check (``bash scripts/test.sh -m index``) in no CI
group; what CI gates on is read from the files (tests/test_locks.py). A pin this index does not serve is
named and left out; a conflict fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.index, pytest.mark.timeout(1800)]  # wheels fetched from the index


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/check_requirements.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800)


@pytest.mark.parametrize("files", [["requirements/rl.txt"], ["requirements/sft.txt"],
                                   ["requirements/eval.txt"], ["requirements/sglang.txt"], ["requirements/cpu.txt"]])
def test_stage_files_have_no_conflicts(files):
    r = _check(*files)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 conflict(s)" in r.stdout
    print(r.stdout)


def test_one_install_of_torch_2_9_1_and_cudnn_9_16_is_a_conflict(tmp_path):
    """The RL file as it was (both in one install): named with both sides; as a later step it is an override."""
    f = tmp_path / "rl_one_step.txt"
    f.write_text("torch==2.9.1\nnvidia-cudnn-cu12==9.16.0.29\n")
    r = _check(str(f))
    assert r.returncode == 1 and "CONFLICT: torch==2.9.1 requires nvidia-cudnn-cu12==9.10.2.21" in r.stdout, r.stdout
    post = tmp_path / "post.txt"
    post.write_text("nvidia-cudnn-cu12==9.16.0.29\n")
    first = tmp_path / "first.txt"
    first.write_text("torch==2.9.1\n")
    r = _check(str(first), "--then", str(post))
    assert r.returncode == 0 and "override on purpose: nvidia-cudnn-cu12==9.16.0.29" in r.stdout, r.stdout


def test_a_pin_this_index_lacks_is_named_not_failed(tmp_path):
    f = tmp_path / "missing.txt"
    f.write_text("paravt-no-such-package-anywhere==1.0.0\n")
    r = _check(str(f))
    assert r.returncode == 0 and "paravt-no-such-package-anywhere==1.0.0" in r.stdout and "left out" in r.stdout, r.stdout
