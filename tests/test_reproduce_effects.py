"""`EFFECTS=1 bash scripts/reproduce_tiny.sh`, as the README gives it, at toy sizes: one seed of the RL-effects
design (the cold start of the README's effects table, both RL arms through run_rl.sh, sampled eval at K = 4 and
64), then the effects judged. One seed for CI's time budget: a second seed only links the first one's base
(`SHARE_FROM`). Slow: run with -m slow (CI does)."""

import json
import os
import subprocess

import pytest

TOY = {"QUICKSTART_SMALL": "1", "SEEDS": "0", "RL_STEPS": "2", "N_SAMPLES": "2", "PROMPTS": "1", "EVAL_Q": "2",
       "DRAWS": "2", "RL_VIDEOS": "4", "LR": "2e-4"}


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_effects_design_as_the_readme_runs_it(tmp_path):
    out = tmp_path / "effects"
    env = {k: v for k, v in os.environ.items() if k != "WORLD_FLAGS"}
    r = subprocess.run(["bash", "scripts/reproduce_tiny.sh", str(out)], capture_output=True, text=True, timeout=3000,
                       env={**env, **TOY, "EFFECTS": "1"})
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    # the cold start of the README's table: a K-independent coin, the decision as its own sentence, and the
    # reading episodes' call turns unsupervised
    world = json.loads((out / "seed_0/world/world.json").read_text())["config"]
    assert world["sft_tool_rate"] == 0.5 and world["habit_sentence"] is True
    assert world["reading_episode_calls"] is False and world["n_rl_videos"] == 4
    run = out / "seed_0"
    for arm in ("vanilla", "paragrpo"):
        metrics = (run / f"rl_{arm}/metrics.jsonl").read_text().splitlines()
        assert len(metrics) == 2, (arm, len(metrics))
        state = json.loads((run / f"rl_{arm}/checkpoints/step_000002/trainer_state.json").read_text())
        assert state["config"]["optim"]["lr"] == 2e-4 and state["config"]["seed"] == 0
    summary = json.loads((run / "pilot_summary.json").read_text())
    for cell in ("sft-K4", "sft-K64", "vanilla-K4", "vanilla-K64", "paragrpo-K4", "paragrpo-K64"):
        c = summary["cells"][cell]
        assert c["episodes"] == 4 and c["lost"] == 0, (cell, c)  # 2 questions x 2 draws, none lost
    md = (out / "effects.md").read_text()
    assert "Sampled eval, 1 seed(s)" in md and "this is not an acceptance run" in md
    assert "- E1 (PARA − vanilla and PARA − SFT ≥ +5 at K = 4" in md and "- E2 (PARA's gap ≥ +25" in md
    assert json.loads((out / "effects.json").read_text())["lost"] == []  # cells that lost draws: none
