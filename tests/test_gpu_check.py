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
    assert res["verdicts"] == {}


@pytest.mark.launcher  # about a minute: every unit of the check as a subprocess, run with the launch group
def test_gpu_check_figures_run_end_to_end_at_tiny_width(tmp_path):
    out = tmp_path / "small"
    r = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--small", "--out", str(out), "--numerics-layers", "1",
                        "--answer-tokens", "24", "--layers", "2", "--ref-layers", "1", "--pack-tokens", "1536",
                        "--steps", "1", "--rl-samples", "2", "--startup-layers", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
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
    units = {f.stem for f in (out / "units").glob("*.json")}
    assert units == {"numerics", "sft_1_layers", "sft_2_layers", "reference", "reference_packed", "rl_step", "vision",
                     "startup"}
    assert num["behav_weight"]["behav_weight_ess"] > 0 and "behav_weight_p50" in num["behav_weight"]
    assert width["vision"]["batched_s"] > 0 and width["vision"]["per_frame_s"] > 0
    assert width["rl_step"]["forwards"] == 1 and width["rl_step"]["tokens_per_s"] > 0  # the two samples packed
    sft = width["sft_2_layers"]
    assert sft["vision_flops_per_step"] < sft["vision_flops_per_step_6np"]  # mergers on a quarter of the patches
    assert width["sft_2_layers"]["vision_flops_per_step"] > 0 and width["sft_vs_reference_flops_per_s_with_vision"] > 0
    packed = width["reference_packed"]
    assert packed["pack_tokens"] == width["sft_2_layers"]["pack_tokens"] and packed["text_layers"] == 2
    assert width["sft_text_vs_reference_packed_flops_per_s"] > 0


def test_a_listed_gpu_without_cuda_fails_every_part(tmp_path):
    """Where nvidia-smi names a GPU, a torch without CUDA is a broken machine, not a CPU one."""
    if torch.cuda.is_available():
        pytest.skip("this is the broken-CUDA behaviour")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    out = tmp_path / "gc"
    r = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--out", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    for part in ("numerics", "width", "startup"):
        assert "torch cannot use CUDA" in json.loads((out / f"{part}.json").read_text())["error"]


def test_card_peaks_and_verdicts():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check as gc

    assert gc.card_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert gc.card_peak_tflops("NVIDIA H100 PCIe") == 756.0 and gc.card_peak_tflops("NVIDIA H100 NVL") == 835.0
    assert gc.card_peak_tflops("NVIDIA H200") == 989.0 and gc.card_peak_tflops("Some GPU") is None
    parts = {"numerics": {"abs_delta_q50_q99": [0.01, 0.2], "ratio_outside_clip_0.2": 0.5,
                          "behav_weight": {"behav_weight_over_cap": 0.002, "behav_weight_ess": 0.95}},
             "width": {"rl_step": {"peak_gb": 76.0}, "sft_8_layers": {"peak_gb": 60.0}},
             "startup": {"peak_gpu_gb": 50.0}}
    v = gc.verdicts(parts, 79.1, 4.0)
    assert v == {"numerics_abs_delta_p99_le_0.1": False, "numerics_behav_weight_over_cap_le_0.1pct": False,
                 "numerics_behav_weight_ess_ge_0.9": True,
                 "width.rl_step_peak_fits_card_with_4_gb": False, "width.sft_8_layers_peak_fits_card_with_4_gb": True,
                 "startup_peak_fits_card_with_4_gb": True}
