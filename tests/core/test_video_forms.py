"""Real-world video files: the forms benchmark and user files come in (constant and variable frame
rate, dropped frames, jittered timestamps, a start offset, audio first, mkv/webm/mp4 with H.264,
HEVC, VP9 and AV1, interlaced H.264, a file cut mid-GOP). Every frame draws its own ordinal, so each
sampled frame is read back and its true time compared with the time asked for and the time shown."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from paravt.core import video as V
from paravt.data.synthetic.render import read_frame_number, write_timed_video

N = 150


def _dropped():
    return [i / 30 for i in range(int(N * 1.25)) if i % 5 != 4]  # a 30 fps timeline, every 5th frame missing


def _jitter():
    return list(np.cumsum(np.random.default_rng(1).uniform(0.025, 0.045, N)) - 0.03)  # 25-45 ms apart


CFR = [i / 24 for i in range(N)]
FORMS = {  # name: (file name, frame times, writer options, variable frame rate)
    "cfr24": ("cfr24.mp4", CFR, {}, False),
    "ntsc_mkv": ("ntsc.mkv", [i * 1001 / 30000 for i in range(N)], {}, None),
    "offset_2s": ("offset.mp4", [2 + t for t in CFR], {}, False),
    "audio_first": ("audio_first.mp4", CFR, {"audio_first": True}, False),
    "vp9_webm": ("vp9.webm", CFR, {"codec": "libvpx-vp9", "time_base": "1/1000"}, False),
    "hevc": ("hevc.mp4", CFR, {"codec": "libx265", "options": {"x265-params": "log-level=error"}}, False),
    "av1": ("av1.mp4", CFR, {"codec": "libsvtav1", "options": {"svtav1-params": "log-level=0"}}, False),
    "interlaced_h264": ("interlaced.mp4", CFR, {"options": {"flags": "+ilme+ildct", "x264-params": "interlaced=1:tff=1"}},
                        False),
    "dropped_frames": ("dropped.mp4", _dropped(), {}, True),
    "jitter": ("jitter.mp4", _jitter(), {"options": {"bf": "0"}}, True),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("forms")
    out = {}
    for name, (fname, times, kw, _) in FORMS.items():
        out[name] = (str(write_timed_video(d / fname, times, **kw)), times)
    return out


def _check(frames, times, asked):
    """Each frame: its true time (from the ordinal it draws), within one local frame interval of the
    time asked for; the time shown is that true time (to the millisecond the prompt prints)."""
    t0 = times[0]
    for f, want in zip(frames, asked):
        i = read_frame_number(np.asarray(f.image))
        true = times[i] - t0
        local = max(times[min(i + 1, len(times) - 1)] - times[i], times[i] - times[max(i - 1, 0)])
        assert abs(true - want) <= local + 1e-6, (i, true, want, local)
        assert abs(f.timestamp - true) <= 6e-4, (i, f.timestamp, true)


@pytest.mark.parametrize("name", list(FORMS))
def test_every_form_reads_with_the_time_bound(files, name):
    path, times = files[name]
    V.READERS.clear()
    info = V.probe(path)
    assert info.num_frames == len(times)
    assert info.duration == pytest.approx(times[-1] - times[0] + np.median(np.diff(times)), abs=0.05)
    variable = FORMS[name][3]
    if variable is not None:
        assert V.open_reader(path).timeline.variable is variable
    ov = V.sample_overview(path, 16, min_pixels=64 * 64, max_pixels=200 * 200)
    assert len(ov) == 16
    _check(ov, times, V.uniform_times(0.0, info.duration, 16))
    crop = V.sample_crop(path, 1.0, 4.0, fps=4.0, max_frames=12, min_pixels=64 * 64, max_pixels=200 * 200)
    _check(crop, times, V.uniform_times(1.0, 4.0, 12))


def _cuts_after_reference_frames(path: Path, n: int) -> list[int]:
    """Byte offsets at the ends of the first ``n`` packets past 40% of the file that are shown after the packet
    that follows them in the file (reference frames whose B-frames come next): cut there, the file ends without
    frames shown before its last one."""
    import av

    with av.open(str(path)) as c:
        pk = [(p.pts, p.pos, p.size) for p in c.demux(c.streams.video[0]) if p.pts is not None and p.size]
    return [pos + size for (pts, pos, size), (nxt, _, _) in zip(pk, pk[1:])
            if pos > 0.4 * path.stat().st_size and nxt < pts][:n]


def test_a_file_cut_mid_gop_reads_before_the_cut_and_names_the_file_after(tmp_path):
    """A file cut mid-GOP (at 55% of its bytes, and right after each of four reference frames whose B-frames are
    then missing) reads before the cut; a frame after it is an error naming the file, never a shorter video."""
    times = [i / 24 for i in range(240)]
    path = write_timed_video(tmp_path / "whole.mkv", times, options={"g": "48"})
    data = path.read_bytes()
    for k, n in enumerate([int(len(data) * 0.55), *_cuts_after_reference_frames(path, 4)]):
        cut = tmp_path / f"cut{k}.mkv"
        cut.write_bytes(data[:n])  # somewhere after 4 s
        V.READERS.clear()
        early = V.sample_crop(str(cut), 0.5, 2.5, fps=2.0, min_pixels=64 * 64, max_pixels=200 * 200)
        _check(early, times, V.uniform_times(0.5, 2.5, 4))
        with pytest.raises(V.VideoError, match=f"cut{k}.mkv"):
            V.sample_overview(str(cut), 16, min_pixels=64 * 64, max_pixels=200 * 200)


def test_variable_rate_timestamps_beat_decord(files):
    """decord maps times to indices with the average rate: on a dropped-frame file its shown times are
    tens of ms off; ours are the frames' own."""
    decord = pytest.importorskip("decord", reason="decord has no wheel for this platform")
    path, times = files["dropped_frames"]
    vr = decord.VideoReader(path)
    fps = vr.get_avg_fps()
    asked = V.uniform_times(0.0, len(vr) / fps, 16)
    idx = [min(len(vr) - 1, int(round(t * fps))) for t in asked]
    arr = vr.get_batch(idx).asnumpy()
    decord_err = max(abs(times[read_frame_number(a)] - times[0] - i / fps) for a, i in zip(arr, idx))
    V.READERS.clear()
    ours = V.sample_overview(path, 16, min_pixels=64 * 64, max_pixels=200 * 200)
    our_err = max(abs(times[read_frame_number(np.asarray(f.image))] - times[0] - f.timestamp) for f in ours)
    assert our_err < 1e-3 < decord_err


def test_decord_asked_for_without_decord_is_one_clear_error(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_decord(name, *a, **kw):
        if name == "decord":
            raise ImportError("no decord")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_decord)
    from paravt.agent.tools import CropConfig
    with pytest.raises(ValueError, match="decord is not installed"):
        CropConfig(decoder="decord")
    with pytest.raises(V.VideoError, match="decord is not installed"):
        V._decord_reader("x.mp4")


def _read_some(files, names, seed: int, n: int) -> None:
    """``n`` 4-frame overviews of files drawn by ``seed``, every frame checked."""
    import random

    rng = random.Random(seed)
    for _ in range(n):
        path, times = files[rng.choice(names)]
        ov = V.sample_overview(path, 4, min_pixels=64 * 64, max_pixels=100 * 100)
        _check(ov, times, V.uniform_times(0.0, V.probe(path).duration, 4))


STRESS = ["cfr24", "dropped_frames", "jitter", "vp9_webm", "offset_2s", "ntsc_mkv"]


def _reader_threads(files, n: int, reads: int, start=None):
    """``n`` started threads each doing ``reads`` checked overviews (after ``start.wait()`` if given),
    and the list their errors go to."""
    import threading

    errors: list[BaseException] = []

    def work(seed: int) -> None:
        if start is not None:
            start.wait()
        try:
            _read_some(files, STRESS, seed, reads)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, errors


def test_reader_cache_never_closes_a_reader_in_use(files, monkeypatch):
    """More videos than max_open, eight threads decoding at once: no reader is closed under a thread
    that holds it (that used to surface as an IndexError), every frame is the right one."""
    monkeypatch.setattr(V, "READERS", V._ReaderCache(max_open=2))
    threads, errors = _reader_threads(files, 8, 12)
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert V.READERS.opened > 2 and len(V.READERS._items) <= 2 and not V.READERS._users


def _child_reads(files, seed: int) -> None:
    """Body of a forked child: its own reads of the same files, every frame checked; exit 1 on any error."""
    import os
    import traceback

    try:
        _read_some(files, STRESS, seed, 4)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def test_reader_cache_survives_forks_while_threads_decode(files, monkeypatch):
    """Children forked (as DataLoader workers are) while eight threads of the parent decode: each child
    reads the same files with readers of its own and gets the right frames; the parent's readers,
    shared file offsets included, are untouched by the children and its threads get the right frames."""
    import multiprocessing
    import threading

    monkeypatch.setattr(V, "READERS", V._ReaderCache(max_open=2))
    start = threading.Barrier(9)
    threads, errors = _reader_threads(files, 8, 10, start)
    start.wait()
    ctx = multiprocessing.get_context("fork")
    children = []
    for i in range(4):  # forked while the threads hold readers, locks and decoder threads
        p = ctx.Process(target=_child_reads, args=(files, 100 + i))
        p.start()
        children.append(p)
    for p in children:
        p.join(timeout=180)
    codes = [p.exitcode for p in children]
    for p in children:
        if p.is_alive():
            p.kill()
    for t in threads:
        t.join()
    assert codes == [0, 0, 0, 0], codes
    assert not errors, errors[:3]
    assert V.READERS.opened > 2 and not V.READERS._users


def test_keep_open_lets_a_data_set_that_fits_decode_each_frame_once(files, monkeypatch):
    """With as many videos kept open as a data set has, a second pass over it opens no video and decodes
    no frame (the frames come from each reader's cache); with fewer, it reopens and decodes again.
    Shrinking closes the least recently used readers, never one a thread is using."""
    monkeypatch.setattr(V, "READERS", V._ReaderCache(max_open=1))
    paths = [p for p, _ in files.values()]

    def one_pass():
        return [[f.image.tobytes() for f in V.sample_fps(p, fps=1.0, max_frames=3)] for p in paths]

    def decoded():
        return sum(r.stats["decoded"] for r in V.READERS._items.values())

    first = one_pass()
    opened = V.READERS.opened
    assert one_pass() == first and V.READERS.opened == opened + len(paths)  # too few kept open: all reopened

    V.keep_open_videos(len(paths))
    assert V.READERS.max_open == len(paths)
    one_pass()
    opened, before = V.READERS.opened, decoded()
    assert one_pass() == first
    assert V.READERS.opened == opened and decoded() == before  # nothing reopened, nothing decoded

    with V.READERS.use(paths[0]) as busy:  # held by this thread, then made the least recently used
        for p in paths[1:]:
            V.READERS.get(p)
        V.keep_open_videos(1)
        assert len(V.READERS._items) == 1 and busy not in V.READERS._items.values()
        assert busy._decoders and busy.frames([0]).shape[0] == 1  # dropped from the cache, still open
    assert not busy._decoders  # its last user closed it
    with pytest.raises(ValueError, match="max_open"):
        V.keep_open_videos(0)
