"""wandb as users expect: the recipe's logging.wandb_mode is used unless WANDB_MODE is set (the
launchers set neither), and a resumed run continues the same wandb run (its id kept in the run
directory)."""

from __future__ import annotations

import subprocess

from paravt.core.metrics import MetricsLogger


def test_the_config_mode_wins_without_wandb_mode_and_a_resume_keeps_the_run(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    a = MetricsLogger(tmp_path / "metrics.jsonl", wandb_project="p", wandb_mode="offline")
    a.log({"x": 1.0}, 1)
    first, mode_a = a._wandb.id, a._wandb.settings.mode
    a.close()
    b = MetricsLogger(tmp_path / "metrics.jsonl", wandb_project="p", wandb_mode="disabled", resume_step=2)
    second, mode_b = b._wandb.id, b._wandb.settings.mode
    b.close()
    assert (mode_a, mode_b) == ("offline", "disabled")
    assert first == second == (tmp_path / "wandb_run_id").read_text().strip()


def test_an_explicit_wandb_mode_wins_over_the_config(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_SILENT", "true")
    m = MetricsLogger(tmp_path / "metrics.jsonl", wandb_project="p", wandb_mode="offline")
    assert m._wandb.settings.mode == "disabled"
    m.close()


def test_the_launchers_do_not_override_the_config():
    r = subprocess.run(["bash", "-c", "unset WANDB_MODE; source scripts/_common.sh cpu; echo \"[${WANDB_MODE:-unset}]\""],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().endswith("[unset]"), r.stdout
