"""python -m paravt.data.fetch: the release's training data by Hub id (ParaVT/ParaVT-Parquet, the
annotations; ParaVT/ParaVT-Source, zip archives per bucket whose members carry the sentinel paths),
from copies in the Hub cache's own format served offline by huggingface_hub's real
snapshot_download: sizes printed first, archives extracted into one media root, then materialized;
a missing media file is named and fails the run; a dataset the cache lacks is one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from tests.eval.hub_layouts import parquet_bytes, write_hub_cache, zip_bytes

ROOT = Path(__file__).resolve().parents[2]


def _messages(video: str) -> str:
    return json.dumps([{"role": "user", "content": [{"type": "video_url", "video_url": {"url": video}},
                                                     {"type": "text", "text": "What happens?"}]},
                       {"role": "assistant", "content": [{"type": "text", "text": "<answer>x</answer>"}]}])


def _release(home: Path, missing: bool = False) -> None:
    cache = home / "hub"
    rows_sft = [{"messages": _messages("museg/charades/ABC12.mp4"), "videos": [{"video": "museg/charades/ABC12.mp4"}]},
                {"messages": _messages("selfqa/q1.mp4"), "videos": [{"video": "selfqa/q1.mp4"}]}]
    rows_rl = [{"prompt": _messages("longvt_source/videor1_a/x/y.mp4"),
                "videos": [{"video": "longvt_source/videor1_a/x/y.mp4"}]}]
    if missing:
        rows_rl.append({"prompt": _messages("selfqa/gone.mp4"), "videos": [{"video": "selfqa/gone.mp4"}]})
    write_hub_cache(cache, "ParaVT/ParaVT-Parquet", {
        "README.md": b"---\nlicense: apache-2.0\n---\n",
        "paravt_sft.parquet": parquet_bytes(rows_sft), "paravt_rl.parquet": parquet_bytes(rows_rl)})
    write_hub_cache(cache, "ParaVT/ParaVT-Source", {
        "README.md": b"---\nlicense: apache-2.0\n---\n",
        "museg/charades/part_000.zip": zip_bytes({"museg/charades/ABC12.mp4": b"video-a"}),
        "selfqa/part_000.zip": zip_bytes({"selfqa/q1.mp4": b"video-b"}),
        "longvt_source/videor1_a.zip": zip_bytes({"longvt_source/videor1_a/x/y.mp4": b"video-c"})})


def _fetch(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-m", "paravt.data.fetch", "--no-progress", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_fetch_extracts_and_materializes_in_one_command(tmp_path):
    home = tmp_path / "hf"
    _release(home)
    out = tmp_path / "local"
    r = _fetch(home, "--materialize", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "ParaVT/ParaVT-Parquet: 2 file(s)" in r.stdout and "ParaVT/ParaVT-Source: 3 file(s)" in r.stdout
    assert "3 archive(s) extracted" in r.stdout
    assert "[materialize] 1/2 " in r.stdout and "[materialize] 2/2 " in r.stdout  # progress per parquet
    media = home / "paravt_source"
    assert (media / "museg/charades/ABC12.mp4").read_bytes() == b"video-a"
    for name in ("paravt_sft.parquet", "paravt_rl.parquet"):
        for row in pq.read_table(out / name).to_pylist():
            path = row["videos"][0]["video"]
            assert path.startswith("file://") and Path(path.removeprefix("file://")).is_file(), path
    again = _fetch(home, "--materialize", str(out))  # resumable: the extracted files are checked, not rewritten
    assert again.returncode == 0 and "skipped" in again.stdout


def test_a_missing_media_file_is_named_and_fails(tmp_path):
    home = tmp_path / "hf"
    _release(home, missing=True)
    r = _fetch(home, "--materialize", str(tmp_path / "local"))
    assert r.returncode == 1 and "selfqa/gone.mp4" in r.stderr, r.stderr[-2000:]


def test_dry_run_prints_sizes_and_downloads_nothing(tmp_path):
    home = tmp_path / "hf"
    _release(home)
    r = _fetch(home, "--dry-run", "--source-include", "museg/*")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ParaVT/ParaVT-Source: 1 file(s)" in r.stdout and "museg/charades/part_000.zip" in r.stdout
    assert not (home / "paravt_source").exists()  # a dry run creates nothing
    assert "needed on the filesystem of" in r.stdout and "free" in r.stdout


def test_a_folder_include_extracts_the_nested_archives_it_downloaded(tmp_path):
    """The release keeps a bucket's archives in subfolders (museg/charades/part_000.zip): 'museg/*'
    lists, downloads and extracts them by one rule."""
    home = tmp_path / "hf"
    _release(home)
    r = _fetch(home, "--source-include", "museg/*")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1 archive(s) extracted" in r.stdout
    assert (home / "paravt_source/museg/charades/ABC12.mp4").read_bytes() == b"video-a"


def test_an_unwritable_media_root_is_one_line(tmp_path):
    home = tmp_path / "hf"
    _release(home)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    r = _fetch(home, "--media-root", str(blocker / "media"))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "not writable" in lines[0] and "a_file" in lines[0], r.stderr


def test_the_space_check_counts_cache_and_extraction_on_one_filesystem(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from paravt.data import fetch

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(100 << 30, 0, 10 << 30))
    ok = fetch.space_shortfall(tmp_path / "media", tmp_path / "cache", 4 << 30, 4 << 30)
    assert not ok["short"] and ok["summary"].count("needed") == 1  # one filesystem: 8 GB of 10 free
    short = fetch.space_shortfall(tmp_path / "media", tmp_path / "cache", 6 << 30, 6 << 30)
    assert short["short"] and "12.9 GB needed" in short["summary"] and "10.7 GB free" in short["summary"], short


def test_a_dataset_the_cache_lacks_is_one_line_and_exit_2(tmp_path):
    r = _fetch(tmp_path / "empty", "--parquets-only")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "ParaVT/ParaVT-Parquet" in lines[0], r.stderr
