"""A pack's log-probabilities scored once over its kept rows, then split per sample: the same values and
gradients as scoring each sample's slice of the logits, without a pack-sized zero gradient per sample."""

from __future__ import annotations

import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from paravt.models.tokenize import vision_token_ids
from paravt.rl.logps import logps_from_logits
from paravt.rl.packing import packed_logps
from tests.rl.test_packing import _image, _positions, _sample

#: ops that make a tensor of zeros (a gradient buffer filled later)
ZEROS = ("aten.zeros.", "aten.new_zeros.", "aten.zeros_like.", "aten.zero_.", "aten.slice_backward.",
         "aten.select_backward.")


class Made(TorchDispatchMode):
    """(op, numel) of every tensor an op returns while active."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.made.append((str(func), out.numel()))
        return out


def _random_pack(dtype):
    g = torch.Generator().manual_seed(0)
    vocab, lengths = 97, [13, 9, 1, 21]  # a sample with one row; positions in each sample's own order
    positions = [sorted(torch.randperm(n, generator=g)[: max(1, n // 2)].tolist()) for n in lengths]
    targets = [torch.randint(0, vocab, (n + 1,), generator=g) for n in lengths]
    targets[1][positions[1][0] + 1] = 5  # a kept row followed by an image placeholder: log p 0
    rows = sum(map(len, positions))
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(dtype).requires_grad_()
    return logits, positions, targets, lengths


def test_pack_at_once_equals_per_sample_slices():
    from paravt.rl.logps import kept_logps, scatter

    vision = torch.tensor([5, 6])
    for dtype in (torch.float32, torch.bfloat16):
        logits, positions, targets, lengths = _random_pack(dtype)
        w = [torch.linspace(-1, 1, n) for n in lengths]
        res = []
        for at_once in (False, True):
            x = logits.detach().clone().requires_grad_()
            if at_once:
                kept = torch.cat([t[torch.tensor(p) + 1] for t, p in zip(targets, positions)])
                lp, ent = kept_logps(x, kept, vision, 0.7)
                counts = [len(p) for p in positions]
                out = [(scatter(a, torch.tensor(p), n), scatter(e, torch.tensor(p), n))
                       for a, e, p, n in zip(lp.split(counts), ent.split(counts), positions, lengths)]
            else:  # each sample's slice of the pack's logits, scored alone
                out, row = [], 0
                for t, p, n in zip(targets, positions, lengths):
                    out.append(logps_from_logits(x[row:row + len(p)], t[1:], vision, 0.7, torch.tensor(p), n))
                    row += len(p)
            sum((a * wi).sum() for (a, _), wi in zip(out, w)).backward()
            res.append((out, x.grad))
        (one, g_one), (pack, g_pack) = res
        for (a1, e1), (a2, e2) in zip(one, pack):
            assert torch.allclose(a1, a2, atol=1e-6) and torch.allclose(e1, e2, atol=1e-6)
        assert torch.allclose(g_one, g_pack, atol=1e-6) and g_pack.abs().sum() > 0
        assert one[1][0][positions[1][0]] == 0


def test_backward_makes_no_pack_sized_zeros_per_sample(tiny_dir, tiny):
    """The tiny model's pack of three samples: its backward makes at most one zero tensor of the pack's
    logits size (the gather's gradient), not one per sample."""
    from paravt.models.loading import load_model

    _, proc = tiny
    model = load_model(tiny_dir).train()
    ov = [_image(i) for i in range(4)]
    group = [_sample(proc, ov, [_image(100)], 1), _sample(proc, ov, [], 2), _sample(proc, ov, [_image(101)], 3)]
    vision = torch.tensor(vision_token_ids(proc.tokenizer))
    pos = [_positions(s) for s in group]
    out = packed_logps(model, group, proc, model.config.image_token_id, vision, 0.7, torch.device("cpu"), pos,
                       with_entropy=True)
    loss = sum(lp.sum() for lp, _ in out)
    spy = Made()
    with spy:
        loss.backward()
    pack_size = sum(map(len, pos)) * model.config.text_config.vocab_size
    zeros = collections.Counter(op for op, n in spy.made if n == pack_size and op.startswith(ZEROS))
    assert sum(zeros.values()) <= 1, zeros
