"""Seeds of one reproduction must differ in their seed alone: the stages' recorded settings are compared,
and a report across seeds run with other settings stops with the differing keys."""

from __future__ import annotations

import json
import os

from paravt.analysis.run_settings import differences, main as settings_main
from paravt.analysis.seeds import main as seeds_main


def _stage(run, name, config):
    """A training stage as the trainers leave it: final -> checkpoints/step_N/hf, trainer_state.json beside hf/."""
    step = run / name / "checkpoints" / "step_000004"
    (step / "hf").mkdir(parents=True)
    (step / "trainer_state.json").write_text(json.dumps({"config": config, "step": 4}))
    os.symlink(step / "hf", run / name / "final")


def _run(tmp_path, seed, rl_steps=4, limit=8, lr=0.002, fragility=False):
    run = tmp_path / f"seed_{seed}"
    run.mkdir()
    (run / "tiny_model").mkdir()
    (run / "tiny_model" / "paravt_tiny.json").write_text(json.dumps(
        {"seed": seed, "build_seconds": 10.0 + seed, "shape": {"hidden_size": 128}, "copy_warmup": {"cfg_lr": 0.002, "steps": 100, "seconds": 8.8 + seed}}))
    _stage(run, "sft", {"seed": seed, "max_steps": 10, "optim": {"lr": lr}, "model_path": f"{run}/perception/final",
                        "output_dir": f"{run}/sft", "resume": "auto", "logging": {"wandb_project": f"p{seed}"},
                        "data": [{"name": "synthetic_sft", "path": f"{run}/world/local/paravt_sft_synth.parquet"}]})
    _stage(run, "rl_paragrpo", {"seed": seed, "max_steps": rl_steps, "model_path": f"{run}/sft/final",
                                "train_data": [f"{run}/world/local/paravt_rl_synth.parquet"]})
    if fragility:
        _stage(run, "fragility/rl_vanilla", {"seed": seed, "max_steps": 4})
    cell = run / "eval" / "sft-tool-K4" / "image_url"
    cell.mkdir(parents=True)
    (cell / "synthetic.run_config.json").write_text(json.dumps(
        {"date": f"2026-11-29T1{seed}:00:00", "git_commit": "abc", "limit": limit,
         "identity": {"model": f"{run}/sft/checkpoints/step_000004/hf", "weights": f"hash{seed}", "nframes": 4,
                      "sample_seed": seed}}))
    (cell / "synthetic.jsonl").write_text(json.dumps({"id": "q0", "score": 1.0, "well_formed": True, "tool_calls": 1}) + "\n")
    return run


def test_seeds_that_differ_only_in_their_seed_and_paths_are_the_same(tmp_path):
    runs = [_run(tmp_path, 0, fragility=True), _run(tmp_path, 1)]
    differ, partial = differences(runs)
    assert differ == []
    assert partial == ["fragility/rl_vanilla: in seed_0 only"]  # run in one seed: named, not a settings difference
    assert seeds_main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "settings are the same in every seed" in md and "fragility/rl_vanilla: in seed_0 only" in md


def test_another_rl_length_or_eval_limit_stops_the_report_naming_the_key_and_seeds(tmp_path, capsys):
    _run(tmp_path, 0)
    _run(tmp_path, 1, rl_steps=2, limit=120)
    _run(tmp_path, 2)
    differ, _ = differences(sorted(tmp_path.glob("seed_*")))
    assert differ == ['eval/sft-tool-K4/image_url/synthetic limit: seed_0 8, seed_1 120, seed_2 8',
                      'rl_paragrpo max_steps: seed_0 4, seed_1 2, seed_2 4']
    assert seeds_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not run with the same settings" in err and "rl_paragrpo max_steps: seed_0 4, seed_1 2, seed_2 4" in err
    assert not (tmp_path / "report.md").exists()
    assert seeds_main([str(tmp_path), "--allow-differing-settings"]) == 0  # written, the differences under the title
    assert "**The seeds differ in settings**" in (tmp_path / "report.md").read_text()
    assert settings_main([str(p) for p in sorted(tmp_path.glob("seed_*"))]) == 1


def test_a_stage_shared_by_link_compares_equal(tmp_path):
    """rl_effects_pilot.sh's SHARE_FROM: seed 1's stages link to seed 0's, whose paths name seed 0's folder."""
    a = _run(tmp_path, 0)
    b = _run(tmp_path, 1, lr=0.001)
    assert differences([a, b])[0] == ["sft optim.lr: seed_0 0.002, seed_1 0.001"]
    import shutil
    shutil.rmtree(b / "sft")
    (b / "sft").symlink_to(a / "sft")
    assert differences([a, b]) == ([], [])
