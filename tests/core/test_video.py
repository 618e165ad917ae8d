import numpy as np
import pytest

from paravt.core.video import (crop_timestamps, overview_timestamps, probe, sample_crop, sample_fps, sample_overview,
                               smart_resize)
from paravt.core.video_reader import VideoError
from paravt.data.synthetic.render import render_frame, write_video
from paravt.data.synthetic.world import WorldConfig, make_spec


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    cfg = WorldConfig(seed=3, n_train_videos=1, n_eval_videos=1, min_duration=40, max_duration=40)
    spec = make_spec(cfg, "t", 0)
    path = tmp_path_factory.mktemp("v") / "v.mp4"
    write_video(spec, path)
    return spec, str(path)


def test_probe(video):
    spec, path = video
    info = probe(path)
    assert info.duration == pytest.approx(40.0) and info.fps == pytest.approx(2.0)
    assert info.num_frames == 80 and (info.width, info.height) == (64, 64)


def test_overview_timestamps_exact_and_content(video):
    spec, path = video
    frames = sample_overview(path, 8)
    assert [f.timestamp for f in frames] == overview_timestamps(80, 2.0, 8) == [2.5, 7.5, 12.5, 17.5, 22.5, 27.5, 32.5, 37.5]
    for f in frames:  # the decoded pixels are the frame rendered at that timestamp
        diff = np.abs(np.asarray(f.image).astype(int) - render_frame(spec, f.timestamp).astype(int)).mean()
        assert diff < 6


def test_event_frames_show_the_event_colour(video):
    spec, path = video
    ev = spec.events[0]
    frames = sample_crop(path, ev.start - 2, ev.end + 2)
    assert [f.timestamp for f in frames] == crop_timestamps(80, 2.0, ev.start - 2, ev.end + 2)
    seen = [f for f in frames if ev.visible_at(f.timestamp)]
    assert seen, "the crop must contain the event"
    from paravt.data.synthetic.world import COLOURS
    target = np.array(COLOURS[ev.colour])
    for f in seen:
        px = np.asarray(f.image).reshape(-1, 3).astype(int)
        assert (np.abs(px - target).sum(1) < 60).sum() > 40  # the shape's pixels are there


def test_crop_fps_and_caps(video):
    _, path = video
    assert len(sample_crop(path, 0, 40)) == 16  # 40 s at 1 fps capped at 16
    assert len(sample_crop(path, 10, 10.4)) == 1  # < 1 s → min 1 frame
    frames = sample_crop(path, 10, 15)
    assert len(frames) == 5 and all(10 <= f.timestamp <= 15 for f in frames)
    assert len(sample_fps(path, fps=1.0, max_frames=64)) == 40
    assert sample_crop(path, 35, 100)[-1].timestamp <= 40  # end clamped to duration
    with pytest.raises(VideoError, match="empty window"):
        sample_crop(path, 50, 60)


@pytest.mark.parametrize("h,w,mn,mx,exp", [
    (64, 64, 784, 50176, (64, 64)),
    (64, 64, 128 * 128, 50176, (128, 128)),
    (1080, 1920, 784, 50176, (160, 288)),
    (30, 30, 784, 50176, (32, 32)),
])
def test_smart_resize(h, w, mn, mx, exp):
    rh, rw = smart_resize(h, w, 32, mn, mx)
    assert (rh, rw) == exp and rh % 32 == 0 and rw % 32 == 0 and mn <= rh * rw <= max(mx, 32 * 32)


def test_smart_resize_errors():
    with pytest.raises(ValueError):
        smart_resize(0, 10)
    with pytest.raises(ValueError, match="aspect"):
        smart_resize(10, 5000)


def test_resized_frames(video):
    _, path = video
    frames = sample_overview(path, 2, min_pixels=128 * 128, max_pixels=128 * 128)
    assert frames[0].image.size == (128, 128)


def test_missing_and_corrupt_files_name_the_file(tmp_path):
    with pytest.raises(VideoError, match="not found: .*nope.mp4"):
        probe(str(tmp_path / "nope.mp4"))
    bad = tmp_path / "corrupt.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 100)
    with pytest.raises(VideoError, match="corrupt.mp4"):
        sample_overview(str(bad), 4)
    with pytest.raises(VideoError, match="corrupt.mp4"):
        sample_overview("file://" + str(bad), 4)


def test_decord_backend_gives_the_same_frames(video):
    """The default PyAV reader and the design's decord: same probe, same timestamps, same pixels."""
    pytest.importorskip("decord", reason="decord has no wheel for this platform (aarch64)")
    spec, path = video
    assert probe(path, "decord") == probe(path)
    for k in (1, 8, 80):
        a, b = sample_overview(path, k), sample_overview(path, k, backend="decord")
        assert [f.timestamp for f in a] == [f.timestamp for f in b]
        assert all((np.asarray(x.image) == np.asarray(y.image)).all() for x, y in zip(a, b))
    a, b = sample_crop(path, 10.0, 14.0), sample_crop(path, 10.0, 14.0, backend="decord")
    assert [f.timestamp for f in a] == [f.timestamp for f in b] and len(a) == 4
    assert all((np.asarray(x.image) == np.asarray(y.image)).all() for x, y in zip(a, b))


# ----------------------------------------------------------------------------- the PyAV reader
@pytest.fixture(scope="module")
def numbered(tmp_path_factory):
    """Frame-numbered H.264 files like the benchmarks' (B-frames, keyframes every GOP)."""
    from paravt.data.synthetic.render import write_numbered_video
    d = tmp_path_factory.mktemp("numbered")
    return {
        "gop12_b3": write_numbered_video(d / "a.mp4", 20, fps=25, width=320, height=180, gop=12, bframes=3),
        "gop250_b3": write_numbered_video(d / "b.mp4", 24, fps=24, width=320, height=180, gop=250, bframes=3),
        "gop48_b0": write_numbered_video(d / "c.mp4", 60, fps=24, width=256, height=144, gop=48, bframes=0),
    }


@pytest.fixture(scope="module")
def decord_frames(numbered):
    """decord's pixels of every frame of each numbered file, decoded once front to back and shared by the
    reader's tests (decord's own random access on a 250-frame GOP costs ~15x the sequential pass; frame i's
    pixels are the same either way)."""
    decord = pytest.importorskip("decord", reason="decord has no wheel for this platform (aarch64)")
    cache = {}

    def frames(name: str):
        if name not in cache:
            vr = decord.VideoReader(str(numbered[name]))
            cache[name] = (vr.get_batch(list(range(len(vr)))).asnumpy(), vr.get_avg_fps())
        return cache[name]

    return frames


@pytest.mark.parametrize("name", ["gop12_b3", "gop250_b3", "gop48_b0"])
@pytest.mark.parametrize("workers", [1, 2])
def test_reader_is_frame_exact(numbered, decord_frames, name, workers):
    """Every returned frame is the one at its index: the number it draws, and decord's pixels."""
    import random

    from paravt.core.video_reader import VideoReader
    from paravt.data.synthetic.render import read_frame_number
    ref, fps = decord_frames(name)
    r = VideoReader(str(numbered[name]), workers=workers)
    n = len(ref)
    assert r.info.num_frames == n and r.info.fps == pytest.approx(fps)
    rng = random.Random(7)
    sets = [[0], [n - 1], list(range(n - 5, n)), [n - 1, 0, n // 2, 0]]
    sets += [[rng.randrange(n) for _ in range(rng.randrange(1, 48))] for _ in range(12)]
    for idx in sets:
        a = r.frames(idx)
        assert [read_frame_number(x) for x in a] == idx
        assert (a == ref[idx]).all()
    assert r.stats["retries"] == 0


def test_reader_cost_does_not_grow_with_position(numbered):
    """A crop at the end decodes about as many frames as one at the start: never from frame 0."""
    from paravt.core.video_reader import VideoReader
    path = str(numbered["gop48_b0"])  # 60 s, 1440 frames, a keyframe every 48
    costs = {}
    for where, (s, e) in {"start": (1, 31), "end": (28, 58)}.items():
        r = VideoReader(path, workers=1)
        idx = [int(round(t * 24)) for t in np.linspace(s, e, 16)]
        r.frames(idx)
        costs[where] = r.stats["decoded"]
    assert costs["end"] <= costs["start"] + 48 and costs["end"] < 28 * 24  # not decoded from the start
    r = VideoReader(path, workers=1)
    r.frames([1400])  # one frame near the end: from the keyframe before it, at most one GOP
    assert r.stats["decoded"] <= 48 and r.stats["seeks"] == 1


def test_one_reader_per_video_shared_by_probe_overview_and_crops(numbered):
    import paravt.core.video as V
    path = str(numbered["gop12_b3"])
    V.READERS.clear()
    before = V.READERS.opened
    info = probe(path)
    ov = sample_overview(path, 8)
    crops = [sample_crop(path, s, s + 6) for s in (2.0, 8.0, 2.0)]
    assert V.READERS.opened == before + 1  # opened once for all of them
    r = V.open_reader(path)
    decoded = r.stats["decoded"]
    again = sample_crop(path, 2.0, 8.0)  # a group's other rollout asks the same window: from the cache
    assert r.stats["decoded"] == decoded and [f.timestamp for f in again] == [f.timestamp for f in crops[0]]
    assert again[0].image is crops[0][0].image and info.num_frames == 500 and len(ov) == 8


def test_decoding_runs_in_the_decode_pool(numbered):
    import asyncio
    import threading

    import paravt.core.video as V

    async def main():
        names = []

        def crop():
            names.append(threading.current_thread().name)
            return sample_crop(str(numbered["gop12_b3"]), 1, 5)
        frames = await V.run_decode(crop)
        return names, frames
    names, frames = asyncio.run(main())
    assert names[0].startswith("paravt-decode") and len(frames) == 4


def test_a_forked_child_opens_its_own_readers(numbered):
    """DataLoader workers fork: the child must not share the parent's open files."""
    import multiprocessing as mp

    import paravt.core.video as V
    path = str(numbered["gop12_b3"])
    parent = sample_overview(path, 4)
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        child = pool.apply(_child_overview, (path,))
    assert child == ([f.timestamp for f in parent], True)
    assert [f.timestamp for f in sample_overview(path, 4)] == child[0]  # the parent's reader still works
    assert V.open_reader(path).stats["retries"] == 0


def _child_overview(path):
    import paravt.core.video as V
    fresh = len(V.READERS._items) == 0
    return [f.timestamp for f in sample_overview(path, 4)], fresh


def test_a_truncated_file_is_a_video_error_naming_it(numbered, tmp_path):
    data = numbered["gop12_b3"].read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) * 2 // 3])
    from paravt.core.video_reader import VideoReader
    try:
        r = VideoReader(str(cut))
    except VideoError as exc:
        assert "cut.mp4" in str(exc)
        return
    with pytest.raises(VideoError, match="cut.mp4"):
        r.frames([r.info.num_frames - 1])


def test_split_runs_balances_decoding_not_counts():
    from paravt.core.video_reader import split_runs

    # a 30 s crop at 24 fps in 250-frame GOPs: the first target lies 222 frames after its keyframe
    crop = [7222, 7268, 7312, 7358, 7402, 7448, 7492, 7538, 7582, 7628, 7672, 7718, 7762, 7808, 7852, 7898]
    runs = split_runs(crop, 2, 250)
    assert [t for r in runs for t in r] == crop and all(runs)
    cost = [r[-1] - r[0] // 250 * 250 for r in runs]
    halves = [crop[:8], crop[8:]]
    assert max(cost) < max(h[-1] - h[0] // 250 * 250 for h in halves)  # 492 vs 538 frames
    # a keyframe seen at 7200 (a scene cut just before the window): the first run starts cheaply
    # and takes more targets
    cut = split_runs(crop, 2, 250, keys={0, 7200})
    assert [t for r in cut for t in r] == crop and len(cut[0]) > len(runs[0])
    # evenly spread overview targets (one per GOP): equal halves
    ov = list(range(112, 14400, 225))
    assert [len(r) for r in split_runs(ov, 2, 250)] in ([32, 32], [31, 33], [33, 31])
    assert split_runs(ov, 1, 250) == [ov] and split_runs([], 2, 250) == [] and split_runs([5], 4, 250) == [[5]]
    assert all(split_runs(ov, 4, 250)) and len(split_runs(ov, 4, 250)) == 4
