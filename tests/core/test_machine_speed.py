"""The machine-speed figure that reports print beside wall-clock times: measured, written, shown in the header."""

import json

import pytest

from paravt.core.machine_speed import describe, main, measure
from paravt.analysis.report import main as report_main


def test_measure_counts_real_products_and_reports_the_cpus():
    res = measure(threads=1, seconds=0.05, repeats=3, size=128)
    assert len(res["runs_gflops"]) == 3 and all(r > 0 for r in res["runs_gflops"])
    assert sorted(res["runs_gflops"])[1] == res["machine_speed_gflops"]  # the median of the three
    assert res["threads"] == 1 and res["cpus_available"] >= 1 and "128x128" in res["method"]


def test_cli_writes_json_and_rejects_bad_arguments(tmp_path, capsys):
    out = tmp_path / "speed.json"
    assert main(["--seconds", "0.05", "--repeats", "1", "--threads", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert capsys.readouterr().out.startswith(f"machine_speed_gflops={res['machine_speed_gflops']} ")
    assert main(["--seconds", "0"]) == 2
    assert "must be positive" in capsys.readouterr().err
    with pytest.raises(ValueError):
        measure(threads=0)


def test_report_header_names_the_machine_speed(tmp_path):
    (tmp_path / "machine_speed.json").write_text(json.dumps(
        {"machine_speed_gflops": 168.2, "runs_gflops": [168.2], "cpu": "AMD EPYC", "threads": 2, "cpus_available": 2,
         "method": "fp32 1024x1024 matmul, median of 5 x 2 s", "measured_at": "2026-11-28 16:15:00"}))
    assert report_main([str(tmp_path)]) == 0
    lines = (tmp_path / "report.md").read_text().splitlines()
    assert lines[0].startswith("# Quickstart report") and lines[1] == ""
    assert lines[2].startswith("Machine speed: 168.2 GFLOP/s (fp32 1024x1024 matmul") and "2 CPUs available" in lines[2]
    assert describe(json.loads((tmp_path / "machine_speed.json").read_text())) in lines[2]
