"""The release's 4-GPU PARA-GRPO run as a recipe: 1 rollout GPU + 3 trainers, 3 prompts x 2 rollouts a step,
a checkpoint every step; everything else is the 8B recipe's."""

from __future__ import annotations

from dataclasses import asdict

from paravt.core.config import load_config
from paravt.rl.config import RLConfig
from paravt.rl.launch import trainer_gpus, world_size


def test_the_4gpu_recipe_changes_what_the_release_changes():
    four = load_config(RLConfig, "configs/rl/paragrpo_4gpu.yaml")
    eight = load_config(RLConfig, "configs/rl/paragrpo_8b.yaml")
    assert (four.grpo.prompts_per_step, four.grpo.n_samples, four.save_every) == (3, 2, 1)
    assert four.rollout.server.gpus == [3]
    rollout = four.rollout.server.gpus
    assert trainer_gpus(4, rollout, [], 0) == ["0", "1", "2"] and world_size(4, rollout, 1, None) == 3
    four.check_world_size(world_size(4, rollout, 1, None))  # 3 prompts over 3 trainer ranks
    a, b = asdict(four), asdict(eight)
    changed = {k for k in a if a[k] != b[k]}
    assert changed == {"output_dir", "save_every", "grpo", "rollout"}
    assert {k for k in a["grpo"] if a["grpo"][k] != b["grpo"][k]} == {"n_samples", "prompts_per_step"}
    assert {k for k in a["rollout"]["server"] if a["rollout"]["server"][k] != b["rollout"]["server"][k]} == {"gpus"}
    assert four.rollout.server.vlm_cache_size_mb == 0  # the vision cache stays off while the vision tower trains
