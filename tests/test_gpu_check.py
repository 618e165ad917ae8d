"""The GPU check on a machine without CUDA: the script runs as far as it can, says why it skipped
each GPU part, and exits 0; its figures' code runs end to end at the tiny width (``--small``), so a
GPU session spends its minutes measuring, not debugging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this is the no-CUDA behaviour")
def test_gpu_check_without_cuda_skips_with_a_reason_and_exits_0(tmp_path):
    out = tmp_path / "gc"
    r = subprocess.run(["bash", "scripts/gpu_check.sh", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "GPU_CHECK_ARGS": ""})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((out / "gpu_check.json").read_text())
    assert set(res["parts"]) == {"numerics", "width", "startup"}
    for part in res["parts"].values():
        assert "needs CUDA" in part["skipped"] and part["device"] == "cpu"
    t = res["tests_gpu"]
    assert t["tests"] >= 5 and t["skipped"] == t["tests"] and t["failures"] == t["errors"] == 0
    assert (out / "gpu_check.log").read_text().count("[gpu_check]") >= 4


def test_gpu_check_figures_run_end_to_end_at_tiny_width(tmp_path):
    out = tmp_path / "small"
    r = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--small", "--out", str(out), "--numerics-layers", "1",
                        "--answer-tokens", "24", "--layers", "2", "--ref-layers", "1", "--pack-tokens", "1536",
                        "--steps", "1", "--rl-samples", "2", "--startup-layers", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    num = json.loads((out / "numerics.json").read_text())
    assert num["answer_tokens"] == 24 and num["prompt_tokens"] > 64  # 64 overview frames
    assert 0 <= num["abs_delta_mean"] <= num["abs_delta_max"] < 1.0 and len(num["ratio_q001_q01_q50_q99_q999"]) == 5
    width = json.loads((out / "width.json").read_text())
    assert width["sft_2_layers"]["tokens_per_s"] > 0 and width["sft_2_layers"]["examples"] >= 1
    assert width["reference"]["seq"] == 1536 and width["rl_step"]["samples"] == 2
    assert width["sft_vs_reference_tokens_per_s_at_equal_flops"] > 0
    start = json.loads((out / "startup.json").read_text())
    assert start["push_buckets"] >= 1 and start["export_bytes"] > 0 and start["host_peak_rss_gb"] > 0
