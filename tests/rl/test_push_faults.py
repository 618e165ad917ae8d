"""A push that fails on rank 0 between two gathers must not leave the other trainer ranks waiting
in a gather (FSDP2's ``full_tensor``) that rank 0 never runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.launcher
def test_packing_failing_on_rank_0_keeps_every_rank_in_step(tiny_dir, tmp_path):
    out = tmp_path / "result.json"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(ROOT / "tests/rl/push_fault_script.py"), str(tiny_dir), str(out)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["sent"] == 2 and "out of memory" in res["error"] and res["n_buckets"] > 3
