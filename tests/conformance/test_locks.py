"""The GPU stages' lock files (requirements/locks/, ``uv pip compile`` for Linux x86_64, CPython 3.11):
current with their requirement files, resolved again from the package index, and holding one torch and
one NCCL for the trainer and the SGLang server that share a weight group. Needs the package index."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.conformance


def _lock(*args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/lock_requirements.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, **env})


def _pins(stage: str) -> dict[str, str]:
    """name -> version of a committed lock, read by the lock script's own parser."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from lock_requirements import pins

    return pins((ROOT / "requirements/locks" / f"{stage}.txt").read_text())


def test_every_stage_lock_is_current_and_rl_and_sglang_share_torch_and_nccl():
    r = _lock("--check")
    assert r.returncode == 0, r.stdout + r.stderr
    for stage in ("rl", "sglang", "sft", "eval"):
        assert f"{stage}: current" in r.stdout, r.stdout
    assert "not locked" not in r.stdout, r.stdout


def test_the_sft_and_eval_locks_hold_the_cuda_build_of_torch():
    """PyPI's Linux torch 2.9.1 is the CUDA 12 build: its NCCL and cuDNN wheels are in the lock (a lock
    resolved against a CPU-only index would hold torch without them and install a torch that cannot train)."""
    for stage in ("sft", "eval"):
        have = _pins(stage)
        assert have["torch"] == "2.9.1", (stage, have.get("torch"))
        assert have.get("nvidia-nccl-cu12") and have.get("nvidia-cudnn-cu12"), (stage, sorted(have))


def test_a_stale_lock_fails_naming_the_package_and_the_weight_group_rule(tmp_path):
    """The RL lock as if rl.txt had moved to torch 2.14.0 without relocking the server's side."""
    for f in ("rl.txt", "sglang.txt"):
        shutil.copy(ROOT / "requirements/locks" / f, tmp_path / f)
    rl = tmp_path / "rl.txt"
    rl.write_text(rl.read_text().replace("torch==2.14.1", "torch==2.14.0"))
    r = _lock("--check", "rl", "sglang", "--locks", str(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "rl: the lock is not current" in r.stderr and "torch 2.14.0 -> 2.14.1" in r.stderr, r.stderr
    assert "sglang: current" in r.stdout, r.stdout


def test_the_locks_of_one_weight_group_must_agree_on_nccl():
    sys.path.insert(0, str(ROOT / "scripts"))
    from lock_requirements import one_nccl

    rl = (ROOT / "requirements/locks/rl.txt").read_text()
    sg = (ROOT / "requirements/locks/sglang.txt").read_text()
    assert one_nccl({"rl": rl, "sglang": sg}) == []
    other = rl.replace("nvidia-nccl-cu13==2.30.7", "nvidia-nccl-cu13==2.28.9")
    assert other != rl
    assert "nvidia-nccl-cu13 differs" in " ".join(one_nccl({"rl": other, "sglang": sg}))


def test_an_index_out_of_reach_is_a_failure_not_current():
    r = _lock("--check", "rl", HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9",
              UV_NO_CACHE="1")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "could not be reached" in r.stderr and "not checked" in r.stderr and "current" not in r.stdout, r.stderr
