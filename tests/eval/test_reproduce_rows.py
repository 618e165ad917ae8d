"""reproduce_paper.sh / paravt.eval.reproduce: a user's checkpoint is one row of its own beside the
paper's; rows without a model are skipped with their line and never borrow another checkpoint;
model= for every row is refused."""

from __future__ import annotations

import pytest

from paravt.eval import reproduce


def _capture_rows(monkeypatch):
    ran = []

    def fake_run_rows(rows, splits, common, out):
        ran.extend(rows)
        return {}

    monkeypatch.setattr(reproduce, "run_rows", fake_run_rows)
    return ran


def test_your_checkpoint_is_its_own_row(monkeypatch, tmp_path, capsys):
    ran = _capture_rows(monkeypatch)
    assert reproduce.main(["--row", "mine", "--model", "/ckpt/mine", "--out", str(tmp_path)]) == 0
    assert [r["row"] for r in ran] == ["mine"] and ran[0]["model"] == "/ckpt/mine"
    assert ran[0]["prompt_mode"] == "agentic_general" and ran[0]["charades"]["prompt_mode"] == "agentic_minimal"
    table = (tmp_path / "table.md").read_text()
    assert "| mine |" in table and "| paravt-8b |" in table and "[paper 69.4]" in table  # beside the paper's


def test_model_for_every_row_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        reproduce.main(["model=/ckpt/mine", "--out", str(tmp_path)])
    assert e.value.code == 2 and "--row NAME --model PATH" in capsys.readouterr().err


def test_rows_without_a_model_are_skipped_with_their_line(monkeypatch, tmp_path, capsys):
    seen = []
    monkeypatch.setattr(reproduce, "Evaluator", lambda cfg: seen.append(cfg) or (_ for _ in ()).throw(RuntimeError("stop")))
    with pytest.raises(RuntimeError, match="stop"):  # the first row with a model starts; none borrowed one
        reproduce.run_rows([{"row": "videorft", "model": ""}, {"row": "x", "model": "/m"}], ["videomme"], [], str(tmp_path))
    assert "skip videorft: no public checkpoint id" in capsys.readouterr().out
    assert seen and seen[0].model == "/m"


def test_the_smoke_path_takes_your_row_too(monkeypatch, tmp_path):
    ran = _capture_rows(monkeypatch)
    assert reproduce.main(["--smoke", "--row", "mine", "--model", "/ckpt/tiny", "--synthetic", "/w",
                           "--out", str(tmp_path)]) == 0
    assert [(r["row"], r["model"], r["nframes"]) for r in ran] == [("mine", "/ckpt/tiny", 4)]
