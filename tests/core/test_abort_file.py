"""The launcher's record of a run that stopped itself: rank 0's line wins whichever rank writes first, and
one function in paravt/core writes it for the stages and for the node checks alike."""

import ast
from pathlib import Path

from paravt.core.shared_fs import report_abort, stopped_on_purpose


def test_rank_0s_line_wins_in_either_order(tmp_path, monkeypatch):
    for order in ((1, 0), (0, 1)):
        f = tmp_path / f"abort{order[0]}"
        monkeypatch.setenv("PARAVT_ABORT_FILE", str(f))
        assert not stopped_on_purpose()
        for rank in order:
            monkeypatch.setenv("RANK", str(rank))
            report_abort(3, "the cause" if rank == 0 else "rank 0 failed engine_start")
        assert f.read_text() == "3\tthe cause\n" and stopped_on_purpose()


def test_without_a_launcher_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("PARAVT_ABORT_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    report_abort(2, "bad input")
    assert not stopped_on_purpose() and list(tmp_path.iterdir()) == []


def test_rank_0_stopped_by_another_ranks_failure_keeps_that_ranks_line(tmp_path, monkeypatch):
    f = tmp_path / "abort"
    monkeypatch.setenv("PARAVT_ABORT_FILE", str(f))
    monkeypatch.setenv("RANK", "1")
    report_abort(3, "rank 1: out of memory gathering bucket 3/3")
    monkeypatch.setenv("RANK", "0")
    report_abort(3, "rank 0: connection closed by peer", cause=False)
    assert f.read_text() == "3\trank 1: out of memory gathering bucket 3/3\n"


def test_one_writer_of_the_abort_file():
    """The stages (paravt.models.stage_main) and the node checks (paravt.core.shared_fs) call the same
    report_abort: a second definition would let the two drift apart in who wins the file."""
    root = Path(__file__).resolve().parents[2] / "paravt"
    defs = [str(p.relative_to(root.parent)) for p in sorted(root.rglob("*.py"))
            for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.FunctionDef) and node.name in ("report_abort", "stopped_on_purpose")]
    assert defs == ["paravt/core/shared_fs.py"] * 2
