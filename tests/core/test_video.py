import numpy as np
import pytest

from paravt.core.video import (VideoError, crop_timestamps, overview_timestamps, probe, sample_crop, sample_fps,
                               sample_overview, smart_resize)
from paravt.data.synthetic import WorldConfig, make_spec, render_frame, write_video


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
    from paravt.data.synthetic import COLOURS
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


def test_pyav_fallback_without_decord(video, monkeypatch):
    """Machines without decord wheels (aarch64, macOS arm64) decode with PyAV: same probe, same
    frames at the same timestamps."""
    import paravt.core.video as V
    spec, path = video
    with_decord = sample_overview(path, 8)
    monkeypatch.setattr(V, "_decord_reader", lambda p: None)
    info = probe(path)
    assert info.duration == pytest.approx(40.0) and info.num_frames == 80 and (info.width, info.height) == (64, 64)
    frames = sample_overview(path, 8)
    assert [f.timestamp for f in frames] == [f.timestamp for f in with_decord]
    for a, b in zip(frames, with_decord):
        assert np.abs(np.asarray(a.image).astype(int) - np.asarray(b.image).astype(int)).mean() < 3
    crop = sample_crop(path, 10.0, 14.0)
    assert len(crop) >= 4
