"""A step's samples go from rank 0 to the other ranks without pixels: each video frame as its source,
decoded again by the receiver into the same pixels; the processor cache is keyed by the processor's
settings, so a receiver's own processor (equal settings) reuses tensors and makes the same ones."""

from __future__ import annotations

import io
import os
import pickle
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from paravt.core import video
from paravt.core.video import sample_overview
from paravt.core.video_reader import VideoError
from paravt.data.synthetic.render import write_video
from paravt.data.synthetic.world import WorldConfig, make_spec
from paravt.models.images import ImageInputs
from paravt.models.loading import load_processor
from paravt.models.tokenize import encode_text
from paravt.rl.rollout import RolloutBatch, Sample
from paravt.rl.trainer import RLTrainer
from tests.rl.test_packing import PAD, _image


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> str:
    """80 frames at 2 fps, 64x64."""
    spec = make_spec(WorldConfig(seed=3, n_train_videos=1, n_eval_videos=1, min_duration=40, max_duration=40), "t", 0)
    path = tmp_path_factory.mktemp("v") / "v.mp4"
    write_video(spec, path)
    return str(path)


def _overview_sample(proc, path: str, k: int = 64) -> Sample:
    """A sample whose prompt shows ``k`` frames of ``path``, its tensors and data URLs cached as rank 0's are."""
    frames = sample_overview(path, k)
    text = ("<|im_start|>user\n" + "".join(f"<{f.timestamp}s>{PAD}" for f in frames)
            + " what happens?<|im_end|>\n<|im_start|>assistant\n")
    ids, imgs = encode_text(proc, text, [f.image for f in frames])
    imgs.data_urls()
    answer = proc.tokenizer.encode("a red circle")
    return Sample(ids + answer, [0] * len(ids) + [1] * len(answer), [-1.0] * (len(ids) + len(answer)), imgs, 0.5)


class _Names(pickle.Unpickler):
    """An unpickler that records the module of every class or function the payload names."""

    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data))
        self.modules: set[str] = set()

    def find_class(self, module, name):
        self.modules.add(module)
        return super().find_class(module, name)


def _step_payloads(batch, monkeypatch, other_rank_misses_a_video: bool = False) -> tuple[list[bytes], object]:
    """What rank 0's :meth:`RLTrainer.step` sends to the other rank (pickled, as NCCL's object broadcast
    pickles it), and the samples rank 0 trains on."""
    from paravt.models import parallel

    sent: list[bytes] = []
    monkeypatch.setattr(parallel, "broadcast_object", lambda obj, src=0: sent.append(pickle.dumps(obj)) or obj)
    monkeypatch.setattr(parallel, "all_reduce_max", lambda x: 1.0 if other_rank_misses_a_video else float(x))
    trained = []
    rank0 = SimpleNamespace(gtr=None, global_step=0, actor=None, dist=SimpleNamespace(world_size=2, rank=0),
                            sync=SimpleNamespace(push=lambda actor, step: 0.0, push_bytes={}),
                            train_on=lambda samples, sft: trained.append(samples) or {})
    RLTrainer.step(rank0, batch)
    return sent, trained[0]


def _batch(samples):
    return RolloutBatch(0, samples, {}, [], 0.0, 0)


def test_the_broadcast_carries_no_pixels(tiny, clip, monkeypatch):
    _, proc = tiny
    s = _overview_sample(proc, clip)
    pixels = s.images.tensors(proc)[0]
    assert len(s.images) == 64 and pixels.nbytes > 6_000_000
    batch = _batch([s, Sample(s.input_ids, s.loss_mask, s.behav_logprobs, s.images, -0.5)])  # a group of two
    sent, trained = _step_payloads(batch, monkeypatch)
    print(f"\nbroadcast: {len(sent[0])} bytes for two 64-frame samples ({pixels.nbytes} bytes of pixel tensors each)")
    assert len(sent) == 1 and len(sent[0]) < 32_000  # two 64-frame samples: ~1/200 of one's pixel tensors
    names = _Names(sent[0])
    received, _, _ = names.load()
    assert received[0].images is received[1].images  # one copy of the group's images: decoded, processed once
    assert not any(m.split(".")[0] in ("torch", "PIL", "numpy") for m in names.modules), names.modules
    assert b"data:image" not in sent[0]
    assert all(a is b for a, b in zip(trained, batch.samples, strict=True))  # rank 0 keeps its own (tensors computed)


def test_the_receiver_rebuilds_the_same_inputs(tiny, tiny_dir, clip, monkeypatch):
    _, proc = tiny
    s = _overview_sample(proc, clip, 16)
    pixels, grid = s.images.tensors(proc)
    sent, _ = _step_payloads(_batch([s]), monkeypatch)
    (got,), index, sft = pickle.loads(sent[0])
    assert index == 0 and not sft and len(got.images) == 16
    video.READERS.clear()  # the receiver decodes the frames itself
    receiver = load_processor(tiny_dir)  # its own processor, the same settings
    pv, g = got.images.tensors(receiver)
    assert got.input_ids == s.input_ids and torch.equal(g, grid) and torch.equal(pv, pixels)


def test_a_rank_without_the_videos_gets_the_frames(tiny, clip, monkeypatch):
    _, proc = tiny
    s = _overview_sample(proc, clip, 8)
    crop = ImageInputs([_image(7)])  # an image that is no video frame: sent as itself
    s.images = s.images + crop
    sent, _ = _step_payloads(_batch([s]), monkeypatch, other_rank_misses_a_video=True)
    assert len(sent) == 2 and b"data:image" not in sent[1]
    names = _Names(sent[1])
    samples, _ = names.load()
    assert "torch" not in {m.split(".")[0] for m in names.modules}
    assert samples[0].images.sources() == [] and len(samples[0].images) == 9
    assert [im.tobytes() for im in samples[0].images.images] == [im.tobytes() for im in s.images.images]


def test_equal_settings_share_the_cache(tiny_dir, monkeypatch):
    a, b = load_processor(tiny_dir), load_processor(tiny_dir)
    imgs = ImageInputs([_image(1), _image(2)])
    pv, _ = imgs.tensors(a)
    calls = []
    cls = type(b.image_processor)
    real = cls.__call__
    monkeypatch.setattr(cls, "__call__", lambda self, *x, **k: calls.append(1) or real(self, *x, **k))
    assert imgs.tensors(b)[0] is pv and calls == []  # another object, the same settings: a hit
    smaller = load_processor(tiny_dir, max_pixels=1024)
    assert imgs.tensors(smaller)[0].shape[0] < pv.shape[0] and calls == [1]  # other settings: computed


def test_sources_are_checked(clip, tmp_path):
    from paravt.core.frame_sources import FrameSource, decode, missing_files, source_of

    frame = sample_overview(clip, 2)[0].image
    src = source_of(frame)
    assert src is not None and source_of(frame) is src and source_of(_image(0)) is None
    assert missing_files([src]) == []
    gone = FrameSource(str(tmp_path / "absent.mp4"), src.file_size, src.index, src.factor, src.min_pixels,
                       src.max_pixels, src.digest)
    assert missing_files([src, gone]) == [gone.path]
    other = FrameSource(src.path, src.file_size, src.index + 1, src.factor, src.min_pixels, src.max_pixels,
                        src.digest)  # a digest that is not that frame's
    with pytest.raises(VideoError, match="differs"):
        decode([other])


def _rank(rank: int, port: int, clip: str, tiny_dir: str, out: str) -> None:
    """One of two gloo ranks: rank 0 sends an 8-frame sample twice, rank 1 receives it, the second time as a
    rank that cannot read the video, and decodes it; each writes the tensors its own processor makes of it."""
    from paravt.rl import transfer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        proc = load_processor(tiny_dir)
        for hidden in (False, True):  # one pair of processes for both cases: each start imports torch again
            batch = _batch([_overview_sample(proc, clip, 8)]) if rank == 0 else None
            if rank == 1 and hidden:
                transfer.missing_files = lambda sources: ["(not on this node)"]
            samples, index, _ = transfer.broadcast_step(batch, None, 2)
            pv, grid = samples[0].images.tensors(proc)
            torch.save({"pv": pv, "grid": grid, "ids": samples[0].input_ids, "index": index,
                        "sources": len(samples[0].images.sources())}, f"{out}/{rank}_{hidden}.pt")
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_get_the_same_sample_from_its_sources_or_its_frames(tiny_dir, clip, tmp_path):
    from paravt.models.parallel import free_port

    mp.spawn(_rank, args=(free_port(), clip, str(tiny_dir), str(tmp_path)), nprocs=2)
    for hidden in (False, True):
        r0, r1 = (torch.load(tmp_path / f"{r}_{hidden}.pt", weights_only=False) for r in (0, 1))
        assert r1["ids"] == r0["ids"] and r1["index"] == r0["index"] == 0
        assert torch.equal(r1["grid"], r0["grid"]) and torch.equal(r1["pv"], r0["pv"])
        assert r1["sources"] == (0 if hidden else 8)  # the frames' sources, or (a rank without the video) the frames
