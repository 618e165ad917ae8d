"""The trainer's broadcast push across two trainer ranks (FSDP2 over gloo, under torchrun): what
arrives, and what a failure on either rank leaves behind. No rank may wait in a gather (FSDP2's
``full_tensor``) that another rank never runs."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _torchrun(tiny_dir, tmp_path, mode, **env):
    out = tmp_path / "result.json"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        "--max-restarts=0", str(ROOT / "tests/rl/push_fault_script.py"), str(tiny_dir), str(out), mode],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    return r, (json.loads(out.read_text()) if out.exists() else None), time.monotonic() - t0


@pytest.mark.launcher
def test_packing_failing_on_rank_0_keeps_every_rank_in_step(tiny_dir, tmp_path):
    r, res, _ = _torchrun(tiny_dir, tmp_path, "pack_rank0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert res["sent"] == 2 and "out of memory" in res["error"] and res["n_buckets"] > 3


@pytest.mark.launcher
def test_a_push_delivers_every_parameter_in_bf16_to_every_receiver_paused_together(tiny_dir, tmp_path):
    """fp32 shards cast before the gather and packed into two reused buffers while the previous bucket
    is sent: each receiver gets exactly the full weights cast to bf16 (a buffer reused too early would
    corrupt a bucket). Both receivers' pauses overlap (each takes 0.3 s; one after the other they
    cannot)."""
    r, res, _ = _torchrun(tiny_dir, tmp_path, "push")
    assert r.returncode == 0, r.stderr[-3000:]
    assert res["exact"] == [True, True] and res["dtypes"] == ["torch.bfloat16"] and res["n_tensors"] > 20
    (s0, e0), (s1, e1) = res["paused"]
    assert max(s0, s1) < min(e0, e1), res["paused"]


@pytest.mark.launcher
def test_a_gather_failing_on_rank_1_ends_the_run_with_its_line_and_exit_3(tiny_dir, tmp_path):
    """Rank 1 leaves the gathers at bucket 3 (an out-of-memory): rank 0 waits in that gather, so nothing
    collective can follow. Rank 1 writes its line to the abort file and exits 3 at once; torchrun ends
    rank 0 — long before any collective timeout (the group's is 30 minutes)."""
    abort = tmp_path / "abort"
    r, res, took = _torchrun(tiny_dir, tmp_path, "gather_rank1", PARAVT_ABORT_FILE=str(abort))
    assert r.returncode != 0 and res is None, (r.returncode, res)
    code, line = abort.read_text().rstrip("\n").split("\t")
    assert code == "3", line
    assert "rank 1" in line and "gathering bucket 3/" in line and "out of memory" in line, line
    assert "out of step" in line and "resume" in line, line
    assert took < 300, took  # bounded by torchrun noticing the exit, not by the 1800 s collective timeout
