"""Small local copies of the six benchmark datasets on the Hugging Face Hub, in the Hub cache's
own on-disk format, so the eval driver resolves them through huggingface_hub's real
``snapshot_download`` (offline) exactly as it would after a download.

Each copy has the real repository's file names, columns and archive structure (from the dataset
cards, the file listings on the Hub and the loaders of lmms-eval and the authors' release); the
rows are invented and the videos are the project's own tiny mp4s.

The cache format (huggingface_hub's documented layout): ``datasets--<owner>--<name>/`` with
``blobs/<etag>``, ``snapshots/<commit>/<path>`` as relative symlinks to the blobs, ``refs/main``
holding the commit, and the tree listing huggingface_hub itself writes after a download
(``trees/<commit>.json``, written with its own writer). ``scan_cache_dir`` must accept it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def parquet_bytes(rows: list[dict], schema: pa.Schema | None = None) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), buf)
    return buf.getvalue()


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def tar_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def split_bytes(data: bytes, parts: int) -> list[bytes]:
    step = -(-len(data) // parts)
    return [data[i:i + step] for i in range(0, len(data), step)]


def write_hub_cache(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """One dataset repository in the Hub cache format; returns its snapshot folder."""
    from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache

    storage = cache / ("datasets--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snap = storage / "snapshots" / commit
    entries = {}
    for rel, data in files.items():
        etag = hashlib.sha256(data).hexdigest()
        blob = storage / "blobs" / etag
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(os.path.relpath(blob, link.parent), link)
        entries[rel] = TreeCacheEntry(size=len(data), blob_id=hashlib.sha1(data).hexdigest(),
                                      lfs_sha256=etag, lfs_size=len(data))
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    write_tree_cache(str(storage), commit, entries)
    return snap


def build_hub_copies(cache: Path, video: bytes) -> dict[str, Path]:
    """All six Hub datasets of the paper's splits; returns repo id -> snapshot folder."""
    srt = b"1\n00:00:01,000 --> 00:00:02,000\n<i>Hello</i> there\n\n2\n00:00:03,000 --> 00:00:04,000\nworld\n"
    out = {}
    # lmms-lab/Video-MME: config "videomme" parquet; videos_chunked_NN.zip -> data/<videoID>.mp4
    # (a few are .MP4 / .mkv); subtitle.zip -> subtitle/<videoID>.srt. Options come lettered.
    vmme = [
        {"video_id": "001", "duration": "short", "domain": "Knowledge", "sub_category": "Humanity", "url": "https://www.youtube.com/watch?v=fFjv93ACGo8",
         "videoID": "fFjv93ACGo8", "question_id": "001-1", "task_type": "Counting Problem",
         "question": "How many people are on the stage?", "options": ["A. 1.", "B. 2.", "C. 3.", "D. 4."], "answer": "C"},
        {"video_id": "001", "duration": "short", "domain": "Knowledge", "sub_category": "Humanity", "url": "https://www.youtube.com/watch?v=fFjv93ACGo8",
         "videoID": "fFjv93ACGo8", "question_id": "001-2", "task_type": "Object Recognition",
         "question": "What is on the table?", "options": ["A. A cup.", "B. A book.", "C. A lamp.", "D. Nothing."], "answer": "A"},
        {"video_id": "601", "duration": "long", "domain": "Sports", "sub_category": "Basketball", "url": "https://www.youtube.com/watch?v=Zx81kM0pQ2w",
         "videoID": "Zx81kM0pQ2w", "question_id": "601-1", "task_type": "Action Recognition",
         "question": "What does the player do last?", "options": ["A. Dunks.", "B. Passes.", "C. Falls.", "D. Waves."], "answer": "B"},
        {"video_id": "602", "duration": "medium", "domain": "Film & Television", "sub_category": "Movie", "url": "https://www.youtube.com/watch?v=q9LmN0aBcDe",
         "videoID": "q9LmN0aBcDe", "question_id": "602-1", "task_type": "Temporal Reasoning",
         "question": "Which scene comes first?", "options": ["A. Rain.", "B. Snow.", "C. Sun.", "D. Fog."], "answer": "D"},
    ]
    out["lmms-lab/Video-MME"] = write_hub_cache(cache, "lmms-lab/Video-MME", {
        "README.md": b"---\nconfigs:\n- config_name: videomme\n  data_files:\n  - split: test\n    path: videomme/test-*\n---\n",
        "videomme/test-00000-of-00001.parquet": parquet_bytes(vmme),
        "videos_chunked_01.zip": zip_bytes({"data/fFjv93ACGo8.mp4": video, "data/Zx81kM0pQ2w.MP4": video}),
        "videos_chunked_02.zip": zip_bytes({"data/q9LmN0aBcDe.mkv": video}),
        "subtitle.zip": zip_bytes({"subtitle/fFjv93ACGo8.srt": srt, "subtitle/Zx81kM0pQ2w.srt": srt}),
    })
    # longvideobench/LongVideoBench: lvb_val.json (+ the same rows as validation parquet with
    # option0..4, "N/A" for unused), videos.tar.part.aa/.ab (one tar split in pieces) -> videos/<video_path>
    lvb = [
        {"video_id": "86CxyhFV9MI", "question": "Which object does the man pick up?", "id": "86CxyhFV9MI_0",
         "candidates": ["cup", "pen", "book"], "correct_choice": 2, "duration_group": 600, "question_category": "S2O",
         "video_path": "86CxyhFV9MI.mp4", "subtitle_path": "86CxyhFV9MI_en.json", "duration": 500.0,
         "starting_timestamp_for_subtitles": 0.0, "view_count": 100, "level": "L2-Relation", "topic_category": "KH-Health"},
        {"video_id": "Q3xWvT8b2Lk", "question": "What colour is the kite?", "id": "Q3xWvT8b2Lk_1",
         "candidates": ["red", "green", "blue", "yellow", "white"], "correct_choice": 0, "duration_group": 3600,
         "question_category": "E2O", "video_path": "Q3xWvT8b2Lk.mp4", "subtitle_path": "Q3xWvT8b2Lk_en.json",
         "duration": 2400.0, "starting_timestamp_for_subtitles": 0.0, "view_count": 7, "level": "L1-Perception",
         "topic_category": "LT-Travel"},
    ]
    lvb_pq = [{**{k: v for k, v in r.items() if k != "candidates"},
               **{f"option{i}": (r["candidates"][i] if i < len(r["candidates"]) else "N/A") for i in range(5)}} for r in lvb]
    parts = split_bytes(tar_bytes({"videos/86CxyhFV9MI.mp4": video, "videos/Q3xWvT8b2Lk.mp4": video}), 3)
    out["longvideobench/LongVideoBench"] = write_hub_cache(cache, "longvideobench/LongVideoBench", {
        "lvb_val.json": json.dumps(lvb).encode(), "validation-00000-of-00001.parquet": parquet_bytes(lvb_pq),
        **{f"videos.tar.part.a{c}": p for c, p in zip("abc", parts)},
        "subtitles.tar": tar_bytes({"subtitles/86CxyhFV9MI_en.json": b"[]"}),
    })
    # lmms-lab/LVBench: data/train-*.parquet (one question per row, options inline "(A) ..."),
    # video_chunks/videos_chunk_NNN.zip -> <video_path>
    info = pa.struct([("duration_minutes", pa.float64()), ("fps", pa.float64()), ("resolution", pa.struct([("width", pa.int64()), ("height", pa.int64())]))])
    lvbench_schema = pa.schema([("uid", pa.string()), ("question", pa.string()), ("answer", pa.string()),
                                ("question_type", pa.list_(pa.string())), ("time_reference", pa.string()),
                                ("video_path", pa.string()), ("video_info", info), ("type", pa.string()), ("key", pa.string())])
    lvbench = [
        {"uid": "101", "question": "What colour is the car?\n(A) red\n(B) blue\n(C) green\n(D) white", "answer": "B",
         "question_type": ["entity recognition"], "time_reference": "00:15-00:19", "video_path": "videos/9p0hQXkR2.mp4",
         "video_info": {"duration_minutes": 65.0, "fps": 30.0, "resolution": {"width": 1280, "height": 720}}, "type": "cartoon", "key": "9p0hQXkR2"},
        {"uid": "102", "question": "Why does the crowd cheer?\n(A) a goal\n(B) a fight\n(C) the rain stops\n(D) music",
         "answer": "A", "question_type": ["reasoning", "event understanding"], "time_reference": "41:02-41:30",
         "video_path": "videos/T7u2MnbX0.mp4",
         "video_info": {"duration_minutes": 95.5, "fps": 25.0, "resolution": {"width": 1920, "height": 1080}}, "type": "sport", "key": "T7u2MnbX0"},
    ]
    out["lmms-lab/LVBench"] = write_hub_cache(cache, "lmms-lab/LVBench", {
        "data/train-00000-of-00001.parquet": parquet_bytes(lvbench, lvbench_schema),
        "video_chunks/videos_chunk_001.zip": zip_bytes({"videos/9p0hQXkR2.mp4": video}),
        "video_chunks/videos_chunk_002.zip": zip_bytes({"videos/T7u2MnbX0.mp4": video}),
    })
    # sy1998/MLVU_dev: mlvu/test-*.parquet (answer is the option text), video_part_N.zip and
    # action_count.zip -> <video_name>
    mlvu = [
        {"video_name": "movie101_66.mp4", "duration": 246.0, "question": "What color is the main male character in the video?",
         "candidates": ["Yellow", "Red", "Green", "Blue"], "answer": "Yellow", "task_type": "plotQA", "question_id": "plotQA_0"},
        {"video_name": "needle_32.mp4", "duration": 467.2, "question": "What does the hand hold?",
         "candidates": ["a key", "a phone", "a coin", "a leaf"], "answer": "a coin", "task_type": "findNeedle", "question_id": "findNeedle_0"},
        {"video_name": "count_7.mp4", "duration": 912.0, "question": "How many times does the man jump?",
         "candidates": ["1", "2", "3", "5"], "answer": "3", "task_type": "count", "question_id": "count_0"},
    ]
    out["sy1998/MLVU_dev"] = write_hub_cache(cache, "sy1998/MLVU_dev", {
        "mlvu/test-00000-of-00001.parquet": parquet_bytes(mlvu),
        "video_part_1.zip": zip_bytes({"movie101_66.mp4": video}), "video_part_2.zip": zip_bytes({"needle_32.mp4": video}),
        "action_count.zip": zip_bytes({"count_7.mp4": video}),
    })
    # yale-nlp/MMVU: validation.json, videos/<subject>/<n>.mp4 as plain files (no archive)
    mmvu = [
        {"id": "val_1", "question": "Which law does the demonstration show?",
         "choices": {"A": "Ohm", "B": "Hooke", "C": "Snell", "D": "Boyle", "E": "Pascal"}, "answer": "B",
         "question_type": "multiple-choice", "video": "https://huggingface.co/datasets/yale-nlp/MMVU/resolve/main/videos/Physics/12.mp4",
         "youtube_url": "https://www.youtube.com/watch?v=x", "metadata": {"subject": "Physics", "textbook": "t", "rationale": "r", "knowledge_concept": "k"}},
        {"id": "val_2", "question": "What is stretched in the video?", "choices": {}, "answer": "a spring",
         "question_type": "open-ended", "video": "https://huggingface.co/datasets/yale-nlp/MMVU/resolve/main/videos/Physics/13.mp4",
         "youtube_url": "", "metadata": {"subject": "Physics"}},
    ]
    out["yale-nlp/MMVU"] = write_hub_cache(cache, "yale-nlp/MMVU", {
        "validation.json": json.dumps(mmvu).encode(), "videos/Physics/12.mp4": video, "videos/Physics/13.mp4": video,
    })
    # lmms-lab/charades_sta: data/test-*.parquet (video "<vid>.mp4", caption, timestamp float16 x2),
    # Charades_v1_480_part_N.zip -> Charades_v1_480/<video>
    ch_schema = pa.schema([("video", pa.string()), ("caption", pa.string()), ("timestamp", pa.list_(pa.float16()))])
    ch = [{"video": "3MSZA.mp4", "caption": "person turn a light on", "timestamp": np.array([24.3, 30.4], dtype=np.float16)},
          {"video": "KX8Q1.mp4", "caption": "a person opens the door", "timestamp": np.array([0.0, 6.9], dtype=np.float16)}]
    out["lmms-lab/charades_sta"] = write_hub_cache(cache, "lmms-lab/charades_sta", {
        "data/test-00000-of-00001.parquet": parquet_bytes(ch, ch_schema),
        "Charades_v1_480_part_1.zip": zip_bytes({"Charades_v1_480/3MSZA.mp4": video}),
        "Charades_v1_480_part_2.zip": zip_bytes({"Charades_v1_480/KX8Q1.mp4": video}),
    })
    return out
