"""CI's budgets as data: every group .ci/run starts has a line in .ci/budgets.tsv, the hard budgets grow on a
slower machine and never shrink on a faster one, and the summary names a group that grew past its expected
time scaled to the machine's speed (reported, not failed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".ci"))
import budgets  # noqa: E402


def test_every_group_of_the_run_has_a_budget_and_the_file_is_well_formed():
    run = (ROOT / ".ci/run").read_text()
    started = set(re.findall(r"^\s*(?:queued_[a-z_]+\(\) \{ )?group (?:--optional )?([a-z][a-z-]*) ", run, re.M))
    settings, groups = budgets.load()
    assert started and started == set(groups), (sorted(started), sorted(groups))
    assert settings["ref_gflops"] > 0 and settings["grow"] > 1
    for name, (expected, hard) in groups.items():
        assert hard >= 1.5 * expected, f"{name}: a hard budget under 1.5x the expected time stops a slow day's run"


def test_hard_budgets_scale_up_on_slow_machines_only(tmp_path):
    f = tmp_path / "b.tsv"
    f.write_text("ref_gflops 120\ngrow 1.5\nalpha 100 400  # a comment\n")
    assert budgets.hard("alpha", 120, f) == 400
    assert budgets.hard("alpha", 60, f) == 800     # half the speed: twice the time
    assert budgets.hard("alpha", 480, f) == 400    # faster: never less than written
    assert budgets.hard("alpha", 0, f) == 400      # speed unknown
    with pytest.raises(KeyError, match="no budget for group 'beta'"):
        budgets.hard("beta", 120, f)


@pytest.mark.parametrize("text,fragment", [
    ("ref_gflops 120\ngrow 1.5\nalpha 100\n", ":3: 'alpha 100'"),
    ("ref_gflops 120\ngrow 1.5\nalpha 500 400\n", "needs 0 < expected <= hard"),
    ("grow 1.5\nalpha 100 400\n", "'ref_gflops' missing"),
    ("ref_gflops fast\ngrow 1.5\n", ":1: 'ref_gflops fast'"),
])
def test_a_malformed_line_is_named(tmp_path, text, fragment):
    f = tmp_path / "b.tsv"
    f.write_text(text)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        budgets.load(f)


def test_the_report_sets_each_group_beside_its_scaled_budget_and_names_growth(tmp_path):
    f = tmp_path / "b.tsv"
    f.write_text("ref_gflops 120\ngrow 1.5\nfast 100 400\nslow 100 400\nskipped 100 400\n")
    res = tmp_path / "results.tsv"
    # on a machine twice the reference speed each group is expected in 50 s
    res.write_text("fast\t0\texit 0, 60s\t60\nslow\t0\texit 0, 90s\t90\nskipped\t-\tNOT RUN (10s left)\n"
                   "other\t0\texit 0, 5s\t5\n")
    out = budgets.report(res, 240, f)
    fast = next(ln for ln in out.splitlines() if " fast " in ln)
    slow = next(ln for ln in out.splitlines() if " slow " in ln)
    assert "50s" in fast and "1.20" in fast and "GREW" not in fast
    assert "1.80" in slow and "GREW: 1.80x" in slow
    assert "NOT RUN" in next(ln for ln in out.splitlines() if " skipped " in ln)
    assert "no budget" in next(ln for ln in out.splitlines() if " other " in ln)
    assert out.splitlines()[-1].endswith("grew past 1.5x: slow")


def test_the_command_line_checks_the_file_and_refuses_unknown_use():
    ok = subprocess.run([sys.executable, str(ROOT / ".ci/budgets.py"), "check"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([sys.executable, str(ROOT / ".ci/budgets.py"), "frobnicate"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage:" in bad.stderr
