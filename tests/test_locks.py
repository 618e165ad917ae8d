"""The lock files (requirements/locks/) against their requirement files, read from the files alone
(``scripts/lock_requirements.py --verify``): what CI gates on, so that a package index publishing a new
release cannot fail a run whose files did not change, while a requirement file changed without its lock
fails, naming both."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from lock_requirements import STAGES, one_nccl, pins, verify  # noqa: E402

# Every index a resolver could ask is out of reach: a dead proxy, pip and uv pointed at a dead index.
NO_INDEX = {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "PIP_NO_INDEX": "1",
            "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "UV_INDEX_URL": "http://127.0.0.1:9/simple", "UV_OFFLINE": "1"}


def _verify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/lock_requirements.py", "--verify", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, **NO_INDEX})


@pytest.fixture
def copies(tmp_path):
    """A copy of requirements/ and its locks, to edit."""
    req = tmp_path / "requirements"
    shutil.copytree(ROOT / "requirements", req)
    return req


def _run_on(req: Path, *stages: str) -> subprocess.CompletedProcess:
    return _verify(*stages, "--requirements", str(req), "--locks", str(req / "locks"))


def test_every_committed_lock_satisfies_its_requirement_file_with_no_index_in_reach():
    r = _verify()
    assert r.returncode == 0, r.stdout + r.stderr
    for stage, (req, _) in STAGES.items():
        assert f"{stage}: requirements/locks/{stage}.txt satisfies requirements/{req} (" in r.stdout, r.stdout
        first, second = (ROOT / "requirements/locks" / f"{stage}.txt").read_text().splitlines()[:2]
        assert f"uv pip compile requirements/{req} " in first and "--exclude-newer " in first, first
        assert second.startswith("# resolved on 20") and "requirements digest" in second, second


def test_a_requirement_file_that_gained_a_package_fails_naming_both_files(copies):
    with open(copies / "rl.txt", "a") as f:
        f.write("einops>=0.8\n")
    r = _run_on(copies, "rl", "sglang")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"rl: {copies}/rl.txt asks for einops>=0.8, which {copies}/locks/rl.txt does not hold" in r.stderr, r.stderr
    assert f"{copies}/rl.txt changed after {copies}/locks/rl.txt was resolved" in r.stderr, r.stderr
    assert "python scripts/lock_requirements.py rl" in r.stderr and "sglang: " in r.stdout, r.stdout + r.stderr


def test_a_moved_pin_and_a_dropped_requirement_fail_with_the_versions(copies):
    sg = copies / "sglang.txt"
    sg.write_text(sg.read_text().replace("sglang[srt]==0.5.23", "sglang[srt]==0.5.24"))
    rl = copies / "rl.txt"
    rl.write_text(rl.read_text().replace("wandb==0.31.0\n", ""))
    r = _run_on(copies, "rl", "sglang")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "asks for sglang[srt]==0.5.24" in r.stderr and "holds sglang==0.5.23" in r.stderr, r.stderr
    assert "holds wandb==0.31.0 as a requirement of" in r.stderr and "which no longer asks for it" in r.stderr, r.stderr


def test_a_range_the_lock_still_meets_fails_as_a_changed_file_and_a_comment_does_not(copies):
    cpu = copies / "cpu.txt"
    text = cpu.read_text()
    cpu.write_text("# a comment of the file's own\n" + text.replace("pyarrow>=18", "pyarrow>=18  # columnar data"))
    assert _run_on(copies, "cpu").returncode == 0
    cpu.write_text(text.replace("pyarrow>=18", "pyarrow>=17"))
    r = _run_on(copies, "cpu")
    assert r.returncode == 1 and "cpu.txt changed after" in r.stderr and "asks for" not in r.stderr, r.stderr


def test_a_requirement_whose_marker_excludes_the_locked_platform_is_not_asked_of_the_lock():
    req = (ROOT / "requirements/cpu.txt").read_text() + "appnope==0.1.4; sys_platform == 'darwin'\n"
    found = verify("cpu", req, (ROOT / "requirements/locks/cpu.txt").read_text(), "cpu.txt", "locks/cpu.txt")
    assert not [line for line in found if "appnope" in line], found
    assert [line for line in found if "changed after" in line], found  # the file itself did change


def test_a_lock_without_its_command_or_dates_fails(copies):
    lock = copies / "locks/eval.txt"
    lock.write_text("\n".join(lock.read_text().splitlines()[2:]) + "\n")
    r = _run_on(copies, "eval")
    assert r.returncode == 1 and "does not start with its command" in r.stderr, r.stderr


def test_the_sft_and_eval_locks_hold_the_cuda_build_of_torch():
    """PyPI's Linux torch 2.9.1 is the CUDA 12 build: its NCCL and cuDNN wheels are in the lock (a lock
    resolved against a CPU-only index would hold torch without them and install a torch that cannot train)."""
    for stage in ("sft", "eval"):
        have = pins((ROOT / "requirements/locks" / f"{stage}.txt").read_text())
        assert have["torch"] == "2.9.1", (stage, have.get("torch"))
        assert have.get("nvidia-nccl-cu12") and have.get("nvidia-cudnn-cu12"), (stage, sorted(have))


def test_the_cpu_side_locks_hold_the_cpu_build_of_torch():
    for stage in ("cpu", "conformance", "vllm"):
        have = pins((ROOT / "requirements/locks" / f"{stage}.txt").read_text())
        assert have["torch"].endswith("+cpu"), (stage, have["torch"])
        assert not [p for p in have if p.startswith("nvidia-")], (stage, [p for p in have if p.startswith("nvidia-")])


def test_the_locks_of_one_weight_group_must_agree_on_torch_and_nccl(copies):
    rl = (ROOT / "requirements/locks/rl.txt").read_text()
    sg = (ROOT / "requirements/locks/sglang.txt").read_text()
    assert one_nccl({"rl": rl, "sglang": sg}) == []
    lock = copies / "locks/rl.txt"
    lock.write_text(rl.replace("nvidia-nccl-cu13==2.30.7", "nvidia-nccl-cu13==2.28.9"))
    r = _run_on(copies, "rl", "sglang")
    assert r.returncode == 1 and "nvidia-nccl-cu13 differs between the environments of one weight group" in r.stderr, \
        r.stderr
