"""The trainer's one-sample forwards (a padding pack, a sample over the pack budget) take M-RoPE positions
computed on the host: the model reads nothing back to compute them, and its logits are those it gives
when it computes the positions itself."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from paravt.models.tokenize import vision_token_ids
from paravt.rl.packing import padding_sample
from paravt.rl.rollout import Sample
from paravt.rl.trainer import RLTrainer
from tests.rl.test_packing import _image, _positions, _sample


class PositionReads(TorchDispatchMode):
    """Host reads (``_local_scalar_dense``: ``.item()``, ``int(t)``; ``.tolist()`` spied on) made while the
    model's forward computes positions (``get_rope_index`` / ``compute_3d_position_ids``)."""

    def __init__(self, model, monkeypatch):
        super().__init__()
        self.forward = self.positions = 0
        self.reads = []
        self.hooks = [model.register_forward_pre_hook(lambda *a: self._move("forward", 1)),
                      model.register_forward_hook(lambda *a: self._move("forward", -1))]
        cls = type(model.model)
        for name in ("get_rope_index", "compute_3d_position_ids"):
            real = getattr(cls, name)

            def wrapped(inner, *a, _real=real, **k):
                self._move("positions", 1)
                try:
                    return _real(inner, *a, **k)
                finally:
                    self._move("positions", -1)
            monkeypatch.setattr(cls, name, wrapped)
        real_tolist = torch.Tensor.tolist

        def tolist(t, *a, **k):
            self._note("tolist")
            return real_tolist(t, *a, **k)
        monkeypatch.setattr(torch.Tensor, "tolist", tolist)

    def _move(self, what, d):
        setattr(self, what, getattr(self, what) + d)

    def _note(self, what):
        if self.forward and self.positions:
            self.reads.append(what)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "_local_scalar_dense" in str(func):
            self._note(str(func))
        return func(*args, **(kwargs or {}))

    def close(self):
        for h in self.hooks:
            h.remove()


def _logits_as_the_model_positions_them(model, s, proc, keep):
    """The forward with positions left to the model (computed inside it from the ids)."""
    ids = torch.tensor([s.input_ids])
    kw = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False,
          "mm_token_type_ids": (ids == model.config.image_token_id).long(),
          "logits_to_keep": torch.tensor(keep, dtype=torch.long)}
    if s.images is not None:
        kw["pixel_values"], kw["image_grid_thw"] = s.images.tensors(proc)
    return model(**kw).logits


@pytest.fixture(scope="module")
def samples(tiny):
    _, proc = tiny
    ov = [_image(i) for i in range(3)]
    with_images = [_sample(proc, ov, [_image(100)], 1), _sample(proc, ov, [], 2)]
    ids = proc.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello there")
    text = Sample(ids, [0] * (len(ids) - 3) + [1] * 3, [-1.0] * len(ids), None, 0.5)
    return with_images + [padding_sample(with_images), text]


def test_one_sample_forwards_read_nothing_back_for_positions(tiny_dir, tiny, samples, monkeypatch):
    from paravt.models.loading import load_model

    _, proc = tiny
    model = load_model(tiny_dir).eval()
    trainer = SimpleNamespace(cfg=SimpleNamespace(grpo=SimpleNamespace(temperature=0.7)), processor=proc,
                              image_token_id=model.config.image_token_id,
                              vision_ids=torch.tensor(vision_token_ids(proc.tokenizer)),
                              dist=SimpleNamespace(device=torch.device("cpu")))
    want = [_logits_as_the_model_positions_them(model, s, proc, _positions(s)) for s in samples]
    got = []
    hook = model.register_forward_hook(lambda m, a, o: got.append(o.logits))
    spy = PositionReads(model, monkeypatch)
    try:
        with torch.no_grad(), spy:
            for s in samples:  # the trainer's path for a pack of one (RLTrainer._logps)
                RLTrainer._logps(trainer, model, [s], with_entropy=True)
    finally:
        spy.close()
        hook.remove()
    assert spy.reads == []
    assert samples[2].kind == "pad" and len(got) == len(samples)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_the_spy_sees_the_models_own_position_reads(tiny_dir, tiny, samples, monkeypatch):
    from paravt.models.loading import load_model

    _, proc = tiny
    model = load_model(tiny_dir).eval()
    spy = PositionReads(model, monkeypatch)
    try:
        with torch.no_grad(), spy:
            _logits_as_the_model_positions_them(model, samples[0], proc, _positions(samples[0]))
    finally:
        spy.close()
    assert "tolist" in spy.reads and len(spy.reads) >= 1 + 3 * len(samples[0].images)
