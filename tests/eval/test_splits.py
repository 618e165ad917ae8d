"""Each split's loader on small fixtures written in the publisher's schema (not real data)."""

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paravt.eval.splits import load_split, read_srt


@pytest.fixture()
def root(tmp_path, world):
    vid = next((world / "media/selfqa").glob("*.mp4"))
    r = tmp_path / "bench"

    def video(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(vid, path)

    # Video-MME (lmms-lab/Video-MME): videomme/test-*.parquet, data/<videoID>.mp4, subtitle/<videoID>.srt
    d = r / "Video-MME"
    (d / "videomme").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([
        {"video_id": "001", "duration": "short", "domain": "Knowledge", "sub_category": "Humanity", "url": "u",
         "videoID": "fFjv93ACGo8", "question_id": "001-1", "task_type": "Counting Problem",
         "question": "How many people?", "options": ["A. 1.", "B. 2.", "C. 3.", "D. 4."], "answer": "C"},
        {"video_id": "002", "duration": "long", "domain": "Sports", "sub_category": "Basketball", "url": "u",
         "videoID": "missingVid", "question_id": "002-1", "task_type": "Action Recognition",
         "question": "What happens?", "options": ["A. x", "B. y", "C. z", "D. w"], "answer": "A"}]),
        d / "videomme/test-00000-of-00001.parquet")
    video(d / "data/fFjv93ACGo8.mp4")
    (d / "subtitle").mkdir()
    (d / "subtitle/fFjv93ACGo8.srt").write_text("1\n00:00:01,000 --> 00:00:02,000\n<i>Hello</i> there\n\n2\n00:00:03,000 --> 00:00:04,000\nworld\n")
    # LongVideoBench: lvb_val.json, videos/<video_path>
    d = r / "LongVideoBench"
    d.mkdir()
    (d / "lvb_val.json").write_text(json.dumps([{"video_id": "86CxyhFV9MI", "question": "Which object?", "id": "86Cx_0",
        "candidates": ["cup", "pen", "book"], "correct_choice": 2, "duration_group": 600, "question_category": "S2O",
        "video_path": "86CxyhFV9MI.mp4", "subtitle_path": "86CxyhFV9MI_en.json", "duration": 500.0}]))
    video(d / "videos/86CxyhFV9MI.mp4")
    # LVBench: video_info.meta.jsonl, videos/<key>.mp4
    d = r / "LVBench"
    d.mkdir()
    (d / "video_info.meta.jsonl").write_text(json.dumps({"key": "9p0hQX", "type": "cartoon", "video_info": {"duration_minutes": 65.0},
        "qa": [{"uid": "1", "question": "What colour is the car?\n(A) red\n(B) blue\n(C) green\n(D) white", "answer": "B",
                "question_type": ["entity recognition"], "time_reference": "00:15-00:19"}]}) + "\n")
    video(d / "videos/9p0hQX.mp4")
    # MLVU dev: MLVU/json/<n>_<task>.json, MLVU/video/<n>_<task>/<video>
    d = r / "MLVU"
    (d / "MLVU/json").mkdir(parents=True)
    (d / "MLVU/json/1_plotQA.json").write_text(json.dumps([{"video": "movie101_66.mp4", "duration": 246.0,
        "question": "What color is the main male character?", "candidates": ["Yellow", "Red", "Green", "Blue"],
        "answer": "Yellow", "question_type": "plotQA"}]))
    # a generation task of MLVU dev: no candidates (the loader used to raise KeyError)
    (d / "MLVU/json/8_sub_scene.json").write_text(json.dumps([{"video": "subPlot_1.mp4", "duration": 300.0,
        "question": "Describe the scene.", "answer": "A man walks in.", "question_type": "subPlot"}] * 2))
    video(d / "MLVU/video/1_plotQA/movie101_66.mp4")
    # MMVU: validation.json, videos/<subject>/<n>.mp4
    d = r / "MMVU"
    d.mkdir()
    (d / "validation.json").write_text(json.dumps([
        {"id": "v1", "question": "Which law?", "choices": {"A": "Ohm", "B": "Hooke", "C": "Snell", "D": "Boyle", "E": "Pascal"},
         "answer": "B", "question_type": "multiple-choice",
         "video": "https://huggingface.co/datasets/yale-nlp/MMVU/resolve/main/videos/Physics/12.mp4",
         "metadata": {"subject": "Physics"}},
        {"id": "v2", "question": "What is shown?", "choices": {}, "answer": "a spring", "question_type": "open-ended",
         "video": "https://huggingface.co/datasets/yale-nlp/MMVU/resolve/main/videos/Physics/13.mp4",
         "metadata": {"subject": "Physics"}}]))
    video(d / "videos/Physics/12.mp4")
    video(d / "videos/Physics/13.mp4")
    # Charades-STA test: charades_sta_test.txt, Charades_v1_480/<vid>.mp4
    d = r / "Charades-STA"
    d.mkdir()
    (d / "charades_sta_test.txt").write_text("3MSZA 24.3 30.4##person turn a light on.\nbad line\n")
    video(d / "Charades_v1_480/3MSZA.mp4")
    return r


def test_videomme(root):
    s = load_split("videomme", root)
    assert [x.id for x in s] == ["001-1", "002-1"] and s[0].answer == "C" and s[0].duration_bucket == "short"
    assert "A. 1.\nB. 2." in s[0].question and s[0].video_exists and not s[1].video_exists and s[0].subtitle is None
    sub = load_split("videomme_sub", root)
    assert sub[0].subtitle.endswith("subtitle/fFjv93ACGo8.srt") and read_srt(sub[0].subtitle) == "Hello there\nworld"


def test_longvideobench_lvbench_mlvu(root):
    s = load_split("longvideobench", root)[0]
    assert s.answer == "C" and "C. book" in s.question and s.task == "S2O" and s.video_exists
    s = load_split("lvbench", root)[0]
    assert s.answer == "B" and s.duration_bucket == "long" and "(B) blue" in s.question and s.video_exists
    mlvu = load_split("mlvu", root)
    assert len(mlvu) == 1  # the two generation rows are skipped (and logged with their count)
    s = mlvu[0]
    assert s.answer == "A" and s.task == "plotQA" and s.duration_bucket == "medium" and s.video_exists


def test_full_subtitles_and_expected_counts(tmp_path):
    """Video-MME with subtitles gets the whole SRT (the release passes it uncut)."""
    from paravt.eval.splits import count_check
    cues = "\n\n".join(f"{i}\n00:00:{i % 60:02d},000 --> 00:00:{i % 60:02d},500\nline number {i} of the talk"
                        for i in range(1, 600))
    (tmp_path / "long.srt").write_text(cues)
    text = read_srt(tmp_path / "long.srt")
    assert len(text) > 6000 and text.splitlines()[-1] == "line number 599 of the talk"
    assert len(read_srt(tmp_path / "long.srt", max_chars=100)) == 100
    assert count_check("videomme", 2700) is None and "expected 2700" in count_check("videomme", 2699)
    assert count_check("mlvu", 2174) is None and "~2200" in count_check("mlvu", 900)
    assert count_check("synthetic", 3) is None


def test_mmvu_and_charades(root):
    s = load_split("mmvu", root)
    assert s[0].answer == "B" and "E. Pascal" in s[0].question and s[0].task == "Physics" and s[0].video_exists
    assert s[1].question_type == "oe" and s[1].answer == "a spring"
    c = load_split("charades_sta", root)
    assert len(c) == 1 and c[0].answer == [24.3, 30.4] and c[0].question_type == "tvg" and "turn a light on" in c[0].question


def test_missing_annotation_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="lvb_val.json"):
        load_split("longvideobench", tmp_path)
    with pytest.raises(ValueError, match="unknown split"):
        load_split("nope", tmp_path)
