"""``DRY_RUN=1`` through the stage launchers: they exec the dry run instead of torchrun (no GPU, no data,
no model weights), overrides and options passed on."""

from __future__ import annotations

import subprocess

from tests.dryrun.conftest import ROOT, env


def launch(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", f"scripts/{script}", *args], check=False, cwd=ROOT, env={**env(), "DRY_RUN": "1"},
                          capture_output=True, text=True, timeout=900)


def test_run_rl_dry_run_on_a_small_override(small_config, tmp_path):
    out = tmp_path / "rl.json"
    proc = launch("run_rl.sh", "configs/rl/paragrpo_8b.yaml", "--model-config", str(small_config),
                  "grpo.prompts_per_step=4", "grpo.n_samples=2", "hierarchical_agent.max_new_tokens=32",
                  "paravt.gating.choices=[4]", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "paravt dry run: configs/rl/paragrpo_8b.yaml (RL) on 7 trainer rank(s)" in proc.stdout
    assert "weight push per step: 0.2 GB" in proc.stdout
    # 8 samples over 7 ranks by tokens: rank 3 trains two, the others one each (each kind of rank traced)
    assert "\n  ranks 0-2,4-6 " in proc.stdout and "\n  rank 3 " in proc.stdout
    assert out.exists()


def test_run_sft_dry_run(small_config):
    proc = launch("run_sft.sh", "configs/sft/qwen3vl_8b.yaml", "--model-config", str(small_config), "--gpus", "2",
                  "global_batch_size=2", "max_length=1024", "video.max_frames=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(SFT) on 2 trainer rank(s)" in proc.stdout and "memory per rank" in proc.stdout
