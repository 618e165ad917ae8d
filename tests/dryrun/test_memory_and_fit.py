"""The dry run's memory: the five categories partition the tracker's peak; extrapolating in depth gives
the figures of the full trace; a recipe that does not fit exits 2 with one line naming the rank, its
peak and what to lower."""

from __future__ import annotations

import pytest

from tests.dryrun.conftest import dry_run

RL = ("configs/rl/paragrpo_8b.yaml", "grpo.prompts_per_step=2", "grpo.n_samples=2",
      "hierarchical_agent.max_new_tokens=64", "paravt.gating.choices=[4]", "hierarchical_agent.crop.max_pixels=12544")
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporaries")


@pytest.mark.slow  # a minute of tracing on 2 cores: CI's slow-rest group
def test_split_sums_to_the_peak_on_every_rank(small_config, tmp_path):
    proc, res = dry_run(*RL, "rollout.server.gpus=[2]", "--model-config", str(small_config), "--gpus", "3",
                        json_out=tmp_path / "rl.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert res["world"] == 2  # 3 GPUs, one of them the rollout server's
    for r in res["ranks"]:
        m = r["memory"]
        assert m["peak"] > 0 and all(m[c] >= 0 for c in CATEGORIES)
        assert abs(sum(m[c] for c in CATEGORIES) - m["peak"]) < 1.0
        assert r["peak_where"] and r["fits"]
    assert res["weight_push"]["bytes"] == 2 * res["model"]["params"]


@pytest.mark.slow  # three traces, ~1 min: CI's slow-rest group
def test_depth_extrapolation_equals_the_full_trace(small_config, tmp_path):
    args = ("configs/sft/qwen3vl_8b.yaml", "--model-config", str(small_config), "--gpus", "2", "global_batch_size=2",
            "max_length=1024", "video.max_frames=2")
    p_all, full = dry_run(*args, json_out=tmp_path / "all.json")
    p_ext, ext = dry_run(*args, "--layers", "2,3", json_out=tmp_path / "ext.json")
    assert p_all.returncode == 0 and p_ext.returncode == 0, p_ext.stderr[-3000:]
    assert ext["extrapolated"] and ext["linear_check"]["verdict"].startswith("equal")
    for k, v in full["figures"].items():
        assert abs(ext["figures"][k] - v) <= 1e-6 * max(1.0, abs(v)), k


def test_a_recipe_that_does_not_fit_exits_2_with_one_line(small_config):
    proc, _ = dry_run("configs/sft/qwen3vl_8b.yaml", "--model-config", str(small_config), "--gpus", "2",
                      "global_batch_size=2", "max_length=1024", "video.max_frames=2", "--gpu-memory", "0.05")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "rank 0" in lines[0] and "GiB" in lines[0] and "max_length (1024)" in lines[0] and "more GPUs" in lines[0]


def test_too_shallow_an_extrapolation_is_refused(small_config):
    proc, _ = dry_run("configs/sft/qwen3vl_8b.yaml", "--model-config", str(small_config), "--layers", "1,2")
    assert proc.returncode == 2 and "deepstack" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
