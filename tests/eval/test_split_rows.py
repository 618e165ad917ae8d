"""Benchmark rows as they ship: every shard of a sharded split, gold letters that are letters, MLVU
rows written either way, archives named like parts, resumed extraction that checks content."""

from __future__ import annotations

import os

import pytest

from paravt.data.schema import DataError
from paravt.data.archives import Archive, extract, find_archives
from paravt.eval.hub import HubConfig
from paravt.eval.splits import load_split
from tests.eval.hub_layouts import parquet_bytes, tar_bytes, write_hub_cache, zip_bytes

VMME = {"video_id": "1", "duration": "short", "domain": "d", "sub_category": "s", "url": "u", "videoID": "v1",
        "task_type": "t", "question": "q?", "options": ["A. x", "B. y", "C. z", "D. w"], "answer": "B"}


def _load(tmp_path, monkeypatch, name):

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    return load_split(name, "/nonexistent", None, HubConfig(source="hub", cache_dir=str(tmp_path / "hub")), [])


def test_every_shard_is_read_in_order(tmp_path, monkeypatch):
    shards = {f"videomme/test-{i:05d}-of-00003.parquet": parquet_bytes(
        [{**VMME, "question_id": f"q{i}_{j}"} for j in range(2)]) for i in range(3)}
    write_hub_cache(tmp_path / "hub", "lmms-lab/Video-MME", shards)
    assert [s.id for s in _load(tmp_path, monkeypatch, "videomme")] == [f"q{i}_{j}" for i in range(3) for j in range(2)]


def test_a_missing_shard_is_an_error_naming_it(tmp_path, monkeypatch):
    shards = {f"videomme/test-{i:05d}-of-00003.parquet": parquet_bytes([{**VMME, "question_id": f"q{i}"}])
              for i in (0, 2)}
    write_hub_cache(tmp_path / "hub", "lmms-lab/Video-MME", shards)
    with pytest.raises(DataError, match=r"1 of 3 shard\(s\) missing \(test-00001-of-00003.parquet\)"):
        _load(tmp_path, monkeypatch, "videomme")


def test_rows_against_the_dataset_card(tmp_path, monkeypatch):
    card = ("---\ndataset_info:\n  features:\n  - name: question_id\n    dtype: string\n  splits:\n  - name: test\n"
            "    num_bytes: 1\n    num_examples: {n}\n---\n# Video-MME\n")
    files = {"videomme/test-00000-of-00001.parquet": parquet_bytes([{**VMME, "question_id": f"q{j}"} for j in range(3)])}
    write_hub_cache(tmp_path / "hub", "lmms-lab/Video-MME", {**files, "README.md": card.format(n=3).encode()})
    assert len(_load(tmp_path, monkeypatch, "videomme")) == 3
    write_hub_cache(tmp_path / "hub2", "lmms-lab/Video-MME", {**files, "README.md": card.format(n=2700).encode()})
    os.replace(tmp_path / "hub2/datasets--lmms-lab--Video-MME", tmp_path / "hub/datasets--lmms-lab--Video-MME.new")
    import shutil
    shutil.rmtree(tmp_path / "hub/datasets--lmms-lab--Video-MME")
    os.replace(tmp_path / "hub/datasets--lmms-lab--Video-MME.new", tmp_path / "hub/datasets--lmms-lab--Video-MME")
    with pytest.raises(DataError, match="3 rows in 1 shard file.*the dataset card says 2700"):
        _load(tmp_path, monkeypatch, "videomme")


@pytest.mark.parametrize("answer", ["", "BC", "b", "E", " "])
def test_a_gold_letter_is_one_letter_among_the_options(answer, tmp_path, monkeypatch):
    rows = [{**VMME, "question_id": "ok"}, {**VMME, "question_id": "bad", "answer": answer}]
    write_hub_cache(tmp_path / "hub", "lmms-lab/Video-MME", {"videomme/test-00000-of-00001.parquet": parquet_bytes(rows)})
    assert [s.id for s in _load(tmp_path, monkeypatch, "videomme")] == ["ok"]


MLVU_ROW = {"video_name": "needle_32.mp4", "duration": 467.2, "question": "What does the hand hold?",
            "candidates": ["a key", "a phone", "a coin", "a leaf"], "answer": "a coin", "task_type": "findNeedle",
            "question_id": "findNeedle_0"}


@pytest.mark.parametrize("question,answer", [
    ("What does the hand hold?", "a coin"),  # stem only, answer as text
    ("What does the hand hold?", "C"),  # answer as a letter
    ("What does the hand hold?", "(C)"),
    ("What does the hand hold?\n(A) a key\n(B) a phone\n(C) a coin\n(D) a leaf", "a coin"),  # options already inline
    ("What does the hand hold?\n(A) a key\n(B) a phone\n(C) a coin\n(D) a leaf", "C"),
])
def test_mlvu_rows_read_either_way(question, answer, tmp_path, monkeypatch):
    write_hub_cache(tmp_path / "hub", "sy1998/MLVU_dev", {"mlvu/test-00000-of-00001.parquet": parquet_bytes(
        [{**MLVU_ROW, "question": question, "answer": answer}])})
    (s,) = _load(tmp_path, monkeypatch, "mlvu")
    assert s.answer == "C" and s.options == ["a key", "a phone", "a coin", "a leaf"]
    assert s.question.count("a coin") == 1 and s.question.startswith("What does the hand hold?\nA. a key\n")


def test_a_tar_gz_is_an_archive_not_a_part(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    import gzip
    (src / "videos.tar.gz").write_bytes(gzip.compress(tar_bytes({"v.mp4": b"x" * 10})))
    (src / "clips.tar.part.aa").write_bytes(b"")
    found = {a.name: a for a in find_archives(src, ["*"])}
    assert found["videos.tar.gz"].parts == [src / "videos.tar.gz"] and "videos.tar" not in found
    assert extract(found["videos.tar.gz"], tmp_path / "d", progress=False)["written"] == 1


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_resume_rewrites_a_file_of_the_right_size_but_other_bytes(kind, tmp_path):
    members = {"videos/a.mp4": b"a" * 1000, "videos/b.mp4": b"b" * 1000}
    arc = tmp_path / f"v.{kind}"
    arc.write_bytes(zip_bytes(members) if kind == "zip" else tar_bytes(members))
    a = Archive(arc.name, [arc], kind)
    dest = tmp_path / "d"
    assert extract(a, dest, progress=False)["written"] == 2
    import shutil
    shutil.rmtree(dest / ".paravt-extracted")  # an interrupted run: no marker
    (dest / "videos/b.mp4").write_bytes(b"X" * 1000)  # same size, other content (e.g. another version)
    assert extract(a, dest, progress=False) == {"written": 1, "skipped": 1, "done": 0}
    assert (dest / "videos/b.mp4").read_bytes() == members["videos/b.mp4"]
    assert not list(dest.rglob("*.paravt-part"))
