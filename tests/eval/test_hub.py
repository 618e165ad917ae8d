"""The seven benchmark splits by Hugging Face id: local copies of each Hub dataset in the Hub
cache's own format (tests/eval/hub_layouts.py), resolved offline by huggingface_hub's real
snapshot_download, archives extracted the way they ship, every loaded row checked."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from paravt.data.archives import Archive, extract, find_archives
from paravt.eval.hub import HubConfig, HubUnavailable, snapshot
from paravt.eval.splits import SPLITS, LoadReport, load_split, read_srt
from tests.eval.hub_layouts import build_hub_copies, tar_bytes, write_hub_cache, zip_bytes, parquet_bytes

ROOT = Path(__file__).resolve().parents[2]
ALL = ["videomme", "videomme_sub", "longvideobench", "lvbench", "mlvu", "mmvu", "charades_sta"]


@pytest.fixture(scope="module")
def video(world) -> bytes:
    return next((world / "media/selfqa").glob("*.mp4")).read_bytes()


@pytest.fixture(scope="module")
def fetched(tmp_path_factory, video):
    """HF_HOME with the six Hub datasets in its cache, fetched (extracted) offline by the CLI."""
    home = tmp_path_factory.mktemp("hf_home")
    build_hub_copies(home / "hub", video)
    from huggingface_hub import scan_cache_dir
    info = scan_cache_dir(home / "hub")  # huggingface_hub itself accepts the copies as cached repos
    assert not info.warnings and sorted(r.repo_id for r in info.repos) == sorted(
        {s.hub.repo_id for s in SPLITS.values() if s.hub})
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    # split names and Hub ids mixed, as a user would type them
    p = subprocess.run([sys.executable, "-m", "paravt.eval.fetch", "--no-progress", "videomme", "videomme_sub",
                        "longvideobench/LongVideoBench", "lmms-lab/LVBench", "sy1998/MLVU_dev", "mmvu", "lmms-lab/charades_sta"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return home, p.stdout


def _load(home: Path, name: str, **kw) -> tuple[list, LoadReport]:
    rep: list[LoadReport] = []
    opts = HubConfig(source="hub", cache_dir=str(home / "hub"), **kw)
    before = os.environ.get("HF_HOME")
    os.environ["HF_HOME"] = str(home)  # media roots: $HF_HOME/<media dir>
    try:
        return load_split(name, "/nonexistent", None, opts, rep), rep[0]
    finally:  # the caller's HF_HOME back as it was (unset stays unset)
        if before is None:
            os.environ.pop("HF_HOME", None)
        else:
            os.environ["HF_HOME"] = before


def test_fetch_prints_where_each_split_landed(fetched):
    home, out = fetched
    for name in ALL:
        assert f"{name}: " in out and f"{name}: loaded" in out, out
    assert f"videos {home / 'lvbench'}" in out and f"videos {home / 'datasets/longvideobench'}" in out
    assert "videos.tar: 2 written" in out  # the three tar parts streamed as one tar
    assert "mmvu: yale-nlp/MMVU" in out and "videos in the snapshot" in out
    assert "2 of 2 have their video" in out and "videomme: loaded 4 samples" in out


def test_every_hub_dataset_loads_with_the_right_rows(fetched):
    home, _ = fetched
    s, rep = _load(home, "videomme")
    assert [x.id for x in s] == ["001-1", "001-2", "601-1", "602-1"] and [x.answer for x in s] == ["C", "A", "B", "D"]
    assert s[0].options == ["1.", "2.", "3.", "4."] and "A. 1.\nB. 2.\nC. 3.\nD. 4." in s[0].question
    assert "A. A." not in s[1].question and s[1].options[0] == "A cup."  # lettered once
    assert all(x.video_exists for x in s) and s[2].video.endswith(".MP4") and s[3].video.endswith(".mkv")
    assert rep.layout == "hub" and rep.where.startswith("lmms-lab/Video-MME at ") and "/snapshots/" in rep.where
    sub, rep = _load(home, "videomme_sub")
    assert read_srt(sub[0].subtitle) == "Hello there\nworld" and rep.missing_subtitle == 1
    assert [Path(x.subtitle).is_file() for x in sub] == [True, True, True, False]

    s, _ = _load(home, "longvideobench")
    assert [x.answer for x in s] == ["C", "A"] and "C. book" in s[0].question and len(s[1].options) == 5
    assert s[0].task == "S2O" and all(x.video_exists for x in s) and s[0].video.endswith("videos/86CxyhFV9MI.mp4")

    s, rep = _load(home, "lvbench")
    assert rep.layout == "hub" and [x.id for x in s] == ["101", "102"] and [x.answer for x in s] == ["B", "A"]
    assert s[0].options == ["red", "blue", "green", "white"] and "(B) blue" in s[0].question
    assert s[0].duration == 3900 and s[0].duration_bucket == "long" and s[1].task == "reasoning,event understanding"
    assert all(x.video_exists for x in s)

    s, rep = _load(home, "mlvu")
    assert rep.layout == "hub" and [x.id for x in s] == ["plotQA_0", "findNeedle_0", "count_0"]
    assert [x.answer for x in s] == ["A", "C", "C"] and [x.duration_bucket for x in s] == ["medium", "medium", "long"]
    assert "C. a coin" in s[1].question and all(x.video_exists for x in s)

    s, _ = _load(home, "mmvu")
    assert s[0].answer == "B" and "E. Pascal" in s[0].question and s[0].task == "Physics" and s[1].question_type == "oe"
    assert all(x.video_exists for x in s) and "/snapshots/" in s[0].video

    s, rep = _load(home, "charades_sta")
    assert rep.layout == "hub" and [x.answer for x in s] == [[24.3, 30.4], [0.0, 6.9]]  # float16 rounded back
    assert [x.id for x in s] == ["3MSZA_0", "KX8Q1_1"] and "turn a light on" in s[0].question
    assert all(x.video_exists and x.question_type == "tvg" for x in s)


def test_the_hub_layout_in_data_root_loads_the_same_rows(fetched, tmp_path):
    """A `huggingface-cli download --local-dir` copy with its archives extracted in place."""
    home, _ = fetched
    for name in ALL:
        from_cache, _ = _load(home, name)
        c = SPLITS[name]
        d = tmp_path / c.dir
        snap = snapshot(c, cache_dir=str(home / "hub"))
        shutil.copytree(snap, d, dirs_exist_ok=True, symlinks=False)
        for a in find_archives(d, c.hub.media):
            extract(a, d, progress=False)
        local = load_split(name, tmp_path)
        key = lambda xs: [(x.id, x.answer, x.options, x.subtitle is not None, x.video_exists) for x in xs]  # noqa: E731
        assert key(local) == key(from_cache), name
        assert all(str(x.video).startswith(str(d)) for x in local)


def test_a_split_missing_everywhere_names_every_place_and_the_command(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        load_split("lvbench", tmp_path, None, HubConfig(cache_dir=str(tmp_path / "empty_cache")))
    msg = str(e.value)
    assert "LVBench/{data/train-*.parquet, video_info.meta.jsonl}" in msg and "lmms-lab/LVBench" in msg
    assert "python -m paravt.eval.fetch lvbench" in msg and "split_paths.lvbench" in msg
    with pytest.raises(FileNotFoundError, match="LVBench/"):  # local only: the cache is not consulted
        load_split("lvbench", tmp_path, None, HubConfig(source="local", cache_dir=str(tmp_path)))
    env = {**os.environ, "HF_HOME": str(tmp_path / "h"), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-m", "paravt.eval.fetch", "--offline", "mmvu", "nope/Nothing"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "unknown split 'nope/Nothing'" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, "-m", "paravt.eval.fetch", "--offline", "mmvu"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "fetch: mmvu: yale-nlp/MMVU:" in p.stderr and "Traceback" not in p.stderr


def test_a_bad_source_is_one_line_naming_the_options():
    with pytest.raises(ValueError) as e:
        HubConfig(source="cache")
    assert str(e.value) == "hub.source must be one of auto | local | hub, got 'cache'"


def test_an_incomplete_snapshot_is_reported(tmp_path, video):
    """A download that stopped before the annotation arrived: huggingface_hub's own tree listing says so."""
    snap = write_hub_cache(tmp_path / "hub", "lmms-lab/charades_sta", {
        "data/test-00000-of-00001.parquet": parquet_bytes([{"video": "a.mp4", "caption": "x", "timestamp": [1.0, 2.0]}]),
        "Charades_v1_480_part_1.zip": zip_bytes({"Charades_v1_480/a.mp4": video})})
    (snap / "data/test-00000-of-00001.parquet").unlink()
    with pytest.raises(HubUnavailable, match="incomplete"):
        snapshot(SPLITS["charades_sta"], cache_dir=str(tmp_path / "hub"))


def test_extraction_is_resumable_and_streams_tar_parts(tmp_path):
    members = {f"videos/v{i}.mp4": bytes([i]) * (1000 + i) for i in range(3)}
    z = tmp_path / "src/videos_chunked_01.zip"
    z.parent.mkdir()
    z.write_bytes(zip_bytes(members))
    tar = tar_bytes(members)
    for i, c in enumerate("abc"):
        (tmp_path / f"src/videos.tar.part.a{c}").write_bytes(tar[i * len(tar) // 3:(i + 1) * len(tar) // 3])
    found = {a.name: a for a in find_archives(tmp_path / "src", ["*.zip", "videos.tar.part.*"])}
    assert sorted(found) == ["videos.tar", "videos_chunked_01.zip"]
    assert [p.name for p in found["videos.tar"].parts] == ["videos.tar.part.aa", "videos.tar.part.ab", "videos.tar.part.ac"]
    for name, a in found.items():
        dest = tmp_path / name
        assert extract(a, dest, progress=False) == {"written": 3, "skipped": 0, "done": 0}
        assert {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*.mp4")} == members
        assert extract(a, dest, progress=False)["done"] == 1  # the marker: nothing read again
        # a kill mid-way: marker never written, one file cut short, a temporary left behind
        shutil.rmtree(dest / ".paravt-extracted")
        (dest / "videos/v1.mp4").write_bytes(b"cut")
        (dest / "videos/v2.mp4.paravt-part").write_bytes(b"junk")
        assert extract(a, dest, progress=False) == {"written": 1, "skipped": 2, "done": 0}
        assert (dest / "videos/v1.mp4").read_bytes() == members["videos/v1.mp4"]


def test_an_archive_member_outside_the_folder_is_refused(tmp_path):
    z = tmp_path / "evil.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("../outside.mp4", b"x")
    with pytest.raises(ValueError, match=r"evil.zip: member '../outside.mp4' would be written outside"):
        extract(Archive("evil.zip", [z], "zip"), tmp_path / "dest", progress=False)
    assert not (tmp_path / "outside.mp4").exists()


def test_wrong_rows_are_dropped_and_counted(tmp_path, video):
    """Gold letter outside the options, letters written twice or shuffled, a reversed span."""
    good = {"video_id": "1", "duration": "short", "domain": "d", "sub_category": "s", "url": "u", "videoID": "v1",
            "task_type": "t", "question": "q?", "options": ["A. x", "B. y", "C. z", "D. w"], "answer": "B"}
    rows = [{**good, "question_id": "ok"}, {**good, "question_id": "gold_e", "answer": "E"},
            {**good, "question_id": "doubled", "options": ["A. A. x", "B. B. y", "C. C. z", "D. D. w"]},
            {**good, "question_id": "shuffled", "options": ["B. y", "A. x", "C. z", "D. w"]},
            {**good, "question_id": "blank", "options": ["A. x", "B. ", "C. z", "D. w"]}]
    write_hub_cache(tmp_path / "hub", "lmms-lab/Video-MME", {"videomme/test-00000-of-00001.parquet": parquet_bytes(rows),
                                                            "videos_chunked_01.zip": zip_bytes({"data/v1.mp4": video})})
    s, rep = _load(tmp_path, "videomme")
    assert [x.id for x in s] == ["ok"] and rep.missing_video == 1  # kept, reported: the archive is not extracted
    assert rep.dropped == {"gold letter not among the options": 1, "an empty option": 1,
                           "an option carries another letter (doubled or shuffled letters)": 2}
    line = rep.line(len(s))
    assert "first gold_e" in line and "first doubled" in line and "1 without their video" in line
    ch = [{"video": "a.mp4", "caption": "x", "timestamp": [5.0, 2.0]}, {"video": "b.mp4", "caption": "y", "timestamp": [1.0, 2.0]}]
    write_hub_cache(tmp_path / "hub", "lmms-lab/charades_sta", {"data/test-00000-of-00001.parquet": parquet_bytes(ch)})
    s, rep = _load(tmp_path, "charades_sta")
    assert [x.answer for x in s] == [[1.0, 2.0]] and rep.dropped == {"span is not 0 <= start < end": 1}


def test_the_driver_fetches_on_first_use_and_evaluates(fetched, tiny_dir, tmp_path, video):
    """splits named by Hub id, no data_root, hub.download=true on a fresh HF_HOME whose cache is
    filled but nothing extracted: the driver extracts and runs (HF_HUB_OFFLINE=1: no network)."""
    home = tmp_path / "home"
    build_hub_copies(home / "hub", video)
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    env.pop("HF_HUB_CACHE", None)
    p = subprocess.run([sys.executable, "-m", "paravt.eval.driver", f"model={tiny_dir}", f"out={tmp_path}/o",
                        "splits=[lmms-lab/charades_sta,sy1998/MLVU_dev]", f"data_root={tmp_path}/none", "hub.download=true",
                        "hub.progress=false", "progress=false", "prompt_mode=direct", "nframes=4", "max_new_tokens=8"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "charades_sta: loaded 2 samples (hub layout, lmms-lab/charades_sta at" in p.stdout
    assert (home / "charades_sta/Charades_v1_480/3MSZA.mp4").is_file() and (home / "mlvu/count_7.mp4").is_file()
    for split, n in (("charades_sta", 2), ("mlvu", 3)):
        summary = json.loads((tmp_path / f"o/model/image_url/{split}.json").read_text())
        assert summary["n"] == n and summary.get("missing_video", 0) == 0 and summary.get("errors", 0) == 0, summary


def test_a_folder_pattern_extracts_the_archives_it_listed(tmp_path):
    """`fetch --source-include 'museg/*'` lists and downloads by fnmatch on the repository path (`*`
    crosses `/`); extraction must find the same files, nested folders included."""
    from paravt.data.archives import path_matches  # the listing's own rule (paravt.data.fetch)

    src = tmp_path / "snap"
    for rel in ("museg/videos_01.zip", "museg/part2/videos_02.zip", "other/videos_03.zip", "top.zip"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(zip_bytes({"v.mp4": b"x"}))
    listed = {str(p.relative_to(src)) for p in src.rglob("*.zip") if path_matches(str(p.relative_to(src)), ["museg/*"])}
    found = find_archives(src, ["museg/*"])
    assert sorted(a.name for a in found) == ["videos_01.zip", "videos_02.zip"]
    assert {str(a.parts[0].relative_to(src)) for a in found} == listed
