import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paravt.data.materialize import main, materialize
from paravt.data.schema import load_sft_rows


def _messages(url_video, url_image):
    return [
        {"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": url_video}, "text": None},
            {"type": "image_url", "image_url": {"url": url_image}, "text": None},
            {"type": "text", "text": "What happens?", "video_url": None, "image_url": None},
        ]},
        {"role": "assistant", "content": [{"type": "text", "text": "<answer>x</answer>"}]},
    ]


@pytest.fixture()
def release(tmp_path):
    root = tmp_path / "media"
    for rel in ["longvt_source/src1/a/b.mp4", "museg/charades/XYZ.mp4", "selfqa/q1.mp4", "selfqa/img.jpg"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")
    pdir = tmp_path / "parquet"
    pdir.mkdir()
    rows_json = [{"messages": json.dumps(_messages("longvt_source/src1/a/b.mp4", "selfqa/img.jpg")),
                  "videos": [{"video": "longvt_source/src1/a/b.mp4"}]},
                 {"messages": json.dumps(_messages("museg/et_instruct_164k/missing.mp4", "selfqa/img.jpg")),
                  "videos": [{"video": "museg/et_instruct_164k/missing.mp4"}]}]
    pq.write_table(pa.Table.from_pylist(rows_json), pdir / "paravt_sft_json.parquet")
    rows_nested = [{"messages": _messages("museg/charades/XYZ.mp4", "/abs/elsewhere.jpg"),
                    "videos": [{"video": "selfqa/q1.mp4"}], "other": 7}]
    pq.write_table(pa.Table.from_pylist(rows_nested), pdir / "paravt_sft_nested.parquet")
    pq.write_table(pa.Table.from_pylist([{"x": 1}]), pdir / "unrelated.parquet")
    return root, pdir, tmp_path / "out"


def test_round_trip_json_and_nested(release):
    root, pdir, out = release
    report = materialize(root, pdir, out).to_dict()
    assert sorted(report["files"]) == ["paravt_sft_json.parquet", "paravt_sft_nested.parquet"]
    assert report["missing_per_bucket"] == {"museg/et_instruct_164k": 2}
    assert report["rewritten_per_bucket"] == {"longvt_source": 2, "selfqa": 3, "museg/et_instruct_164k": 2,
                                              "museg/charades": 1}
    assert report["passthrough"] == 1  # the absolute path
    assert json.loads((out / "materialize_report.json").read_text())["missing_total"] == 2

    t = pq.read_table(out / "paravt_sft_json.parquet").to_pylist()
    m = json.loads(t[0]["messages"])
    assert m[0]["content"][0]["video_url"]["url"] == f"file://{root.resolve()}/longvt_source/src1/a/b.mp4"
    assert m[0]["content"][1]["image_url"]["url"] == f"file://{root.resolve()}/selfqa/img.jpg"
    assert m[0]["content"][2]["text"] == "What happens?"
    assert t[0]["videos"] == [{"video": f"file://{root.resolve()}/longvt_source/src1/a/b.mp4"}]

    n = pq.read_table(out / "paravt_sft_nested.parquet").to_pylist()
    assert n[0]["other"] == 7
    assert n[0]["messages"][0]["content"][0]["video_url"]["url"].endswith("/museg/charades/XYZ.mp4")
    assert n[0]["messages"][0]["content"][1]["image_url"]["url"] == "/abs/elsewhere.jpg"

    # The loader reads both shapes and skips the row whose video is missing, with a count.
    rows, rep = load_sft_rows(sorted(out.glob("paravt_*.parquet")), check_media=True)
    assert rep.total == 3 and rep.kept == 1 and rep.skipped == {"missing video": 2}
    assert "paravt_sft_json.parquet:row 1" in " ".join(rep.examples)
    rows, rep = load_sft_rows(sorted(out.glob("paravt_*.parquet")), check_media=False)
    assert rep.kept == 3 and rows[2].messages[0]["content"][2] == {"type": "text", "text": "What happens?"}


def test_idempotent(release):
    root, pdir, out = release
    materialize(root, pdir, out)
    out2 = out.parent / "out2"
    materialize(root, out, out2)
    assert pq.read_table(out / "paravt_sft_json.parquet").equals(pq.read_table(out2 / "paravt_sft_json.parquet"))


def test_exit_codes(release, tmp_path, capsys):
    root, pdir, out = release
    assert main(["--root", str(tmp_path / "nope"), "--parquet-dir", str(pdir), "--output-dir", str(out)]) == 2
    assert "--root" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--root", str(root), "--parquet-dir", str(empty), "--output-dir", str(out)]) == 1
    # the fixture names one missing file: listed, exit 1 unless accepted
    assert main(["--root", str(root), "--parquet-dir", str(pdir), "--output-dir", str(out)]) == 1
    assert "museg/et_instruct_164k/missing.mp4" in capsys.readouterr().err
    assert main(["--root", str(root), "--parquet-dir", str(pdir), "--output-dir", str(out), "--allow-missing"]) == 0
    r = subprocess.run([sys.executable, "-m", "paravt.data.materialize", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--parquet-dir" in r.stdout
