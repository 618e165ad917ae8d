"""reproduce_paper.sh / paravt.eval.reproduce: a user's checkpoint is one row of its own beside the
paper's; rows without a model are skipped with their line and never borrow another checkpoint;
model= for every row is refused; the user's overrides win over the protocol (and the table says so);
cells that lost samples are marked and fail the run; a cell whose config does not build stops the run
before any model loads."""

from __future__ import annotations

import pytest

from paravt.eval import reproduce


def _capture_rows(monkeypatch):
    ran = []

    def fake_run_rows(rows, splits, defaults, out, user=()):
        ran.extend(rows)
        return {}, []

    monkeypatch.setattr(reproduce, "run_rows", fake_run_rows)
    return ran


def test_your_checkpoint_is_its_own_row(monkeypatch, tmp_path, capsys):
    ran = _capture_rows(monkeypatch)
    assert reproduce.main(["--row", "mine", "--model", "/ckpt/mine", "--out", str(tmp_path), "backend=openai"]) == 0
    assert [r["row"] for r in ran] == ["mine"] and ran[0]["model"] == "/ckpt/mine"
    assert ran[0]["prompt_mode"] == "agentic_general" and ran[0]["charades"]["prompt_mode"] == "agentic_minimal"
    table = (tmp_path / "table.md").read_text()
    assert "| paravt-8b | videomme_sub | 69.4 | W, V, P | n.a. |" in table  # beside the paper's


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


def test_the_users_overrides_win_over_the_protocol_and_the_row():
    row = {"row": "paravt-8b", "model": "ParaVT/ParaVT-8B", "prompt_mode": "agentic_general", "max_turns": 3,
           "charades": {"prompt_mode": "agentic_minimal"}}
    defaults = ["nframes=64", "max_new_tokens=2048", "max_turns=3"]
    args = reproduce.cell_args(defaults, row, "videomme", ["nframes=32", "max_turns=1", "progress=true"], "/o")
    cfg = reproduce.load_config(reproduce.EvalConfig, None, args)
    assert (cfg.nframes, cfg.max_new_tokens, cfg.max_turns, cfg.progress) == (32, 2048, 1, True)
    assert cfg.prompt_mode == "agentic_general" and cfg.model == "ParaVT/ParaVT-8B"
    cfg = reproduce.load_config(reproduce.EvalConfig, None, reproduce.cell_args(defaults, row, "charades_sta", [], "/o"))
    assert cfg.prompt_mode == "agentic_minimal" and cfg.progress  # progress bars stay on by default


def test_a_protocol_change_is_warned_and_noted_in_the_table(monkeypatch, tmp_path, capsys):
    _capture_rows(monkeypatch)
    assert reproduce.main(["--row", "mine", "--model", "/ckpt/mine", "--out", str(tmp_path), "backend=openai",
                           "nframes=32"]) == 0
    assert "nframes=32 (paper: 64) departs from the paper's protocol" in capsys.readouterr().err
    assert "Not the paper's protocol: nframes=32 (paper: 64)" in (tmp_path / "table.md").read_text()


class _Eval:
    """Evaluator stand-in: each cell's summary as the driver returns it."""
    cells = {}

    def __init__(self, cfg):
        self.cfg = cfg

    def adopt(self, other):
        pass

    def stop_engines(self):
        pass

    def run(self, keep_engines=False):
        split = self.cfg.splits[0]
        if split in self.cells:
            return {split: self.cells[split]}
        raise reproduce.ResumeMismatch(f"{self.cfg.out}/{split}.jsonl was produced with other settings:\n nframes 64 -> 32")


def test_cells_that_lost_samples_are_marked_and_fail_the_run(monkeypatch, tmp_path, capsys):
    _Eval.cells = {s: {"n": 10, "lost": 0, "missing_video": 0, "errors": 0, "accuracy": 0.5}
                   for s in ("videomme", "videomme_sub", "longvideobench", "lvbench", "mlvu", "mmvu")}
    _Eval.cells["mlvu"] = {"n": 10, "lost": 3, "missing_video": 3, "errors": 0, "accuracy": 0.4, "first_error": "x.mp4"}
    _Eval.cells["charades_sta"] = {"n": 10, "lost": 0, "missing_video": 0, "errors": 0, "mIoU": 0.3}
    monkeypatch.setattr(reproduce, "Evaluator", _Eval)
    assert reproduce.main(["--row", "mine", "--model", "/ckpt/mine", "--out", str(tmp_path), "backend=openai"]) == 1
    err = capsys.readouterr().err
    assert "mine / mlvu: 3 of 10 samples lost" in err and "1 cell(s) lost work" in err
    table = (tmp_path / "table.md").read_text()
    assert "40.0 (lost 3/10)" in table and "| mine | 50.0 |" in table
    # the claims about paravt-8b are checked on the user's row too
    assert "(mine) |" in table


def test_a_cell_that_cannot_run_stops_before_any_model_loads(monkeypatch, tmp_path, capsys):
    ran = _capture_rows(monkeypatch)
    assert reproduce.main(["--row", "paravt-8b", "--out", str(tmp_path)]) == 2  # video_url needs a server
    err = capsys.readouterr().err.strip().splitlines()
    assert ran == [] and len(err) == 1
    assert err[0].startswith("error: configs/eval/paper_table1.yaml: row paravt-8b, split charades_sta: channel=video_url")


def test_a_resume_with_other_settings_is_one_line(monkeypatch, tmp_path, capsys):
    _Eval.cells = {}
    monkeypatch.setattr(reproduce, "Evaluator", _Eval)
    assert reproduce.main(["--row", "mine", "--model", "/ckpt/mine", "--out", str(tmp_path), "backend=openai"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "nframes 64 -> 32" in err[0]


def test_the_cells_of_a_row_share_one_engine(monkeypatch, world, tiny_dir, tmp_path):
    """Every split of a row runs on the engines its first cell started (one 8B server load per row, not
    per split); they stop once the row is done."""
    from paravt.eval import driver

    built, stopped = [], []
    real_build = driver.build_engine

    def counting_build(*a, **kw):
        h = real_build(*a, **kw)
        built.append(h)
        real_stop = h.stop
        h.stop = lambda: stopped.append(h) or real_stop()
        return h

    monkeypatch.setattr(driver, "build_engine", counting_build)
    row = {"row": "tiny", "model": str(tiny_dir), "prompt_mode": "agentic_general"}
    defaults = [f"split_paths={{synthetic: {world}/local}}", "max_new_tokens=8", "progress=false", "limit=2",
                "nframes=4", "max_turns=0"]
    results, lost = reproduce.run_rows([row], ["synthetic", "synthetic"], defaults, str(tmp_path))
    assert lost == [] and results["tiny"]["synthetic"]["n"] == 2
    assert len(built) == 1 and stopped == built


def test_engine_key_says_when_cells_may_share_a_server():
    from paravt.eval.driver import engine_key

    def cfg(*o):
        return reproduce.load_config(reproduce.EvalConfig, None, ["model=/m", *o])

    assert engine_key(cfg("prompt_mode=direct")) == engine_key(cfg("prompt_mode=agentic_general"))
    assert engine_key(cfg("backend=openai", "server.launch=vllm", "channel=video_url", "nframes=32")) != \
        engine_key(cfg("backend=openai", "server.launch=vllm", "channel=video_url", "nframes=64"))  # K set at launch
    restart = ["backend=openai", "server.launch=sglang", "server.restart_between_datasets=true"]
    assert engine_key(cfg(*restart)) != engine_key(cfg(*restart))
