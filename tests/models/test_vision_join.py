"""A forward without images still runs the vision tower (:mod:`paravt.models.vision_join`): on two FSDP2
gloo ranks, one with an image and one text only, a training step finishes, each rank's loss is that of the
plain model and every gradient is the mean of the ranks' plain gradients; in one process the text-only loss
is bitwise the same with or without the tower's pass, whose parameters get zero gradients."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from paravt.models import vision_join
from tests.helpers import torchrun_script


def _text_batch(n=16):
    ids = torch.randint(10, 400, (1, n), generator=torch.Generator().manual_seed(3))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

def test_a_text_only_forward_runs_the_tower_with_zero_weight(tiny_dir):
    from paravt.models.loading import load_model
    from paravt.models.losses import supervised_ce_sum

    plain, joined = load_model(tiny_dir).train(), load_model(tiny_dir).train()
    assert vision_join.install(joined) and vision_join.install(joined)  # idempotent: one set of hooks
    calls = []
    joined.model.visual.register_forward_pre_hook(lambda m, a: calls.append(1))
    losses = {}
    for name, m in (("plain", plain), ("joined", joined)):
        ce, n = supervised_ce_sum(m, _text_batch())
        (ce / n).backward()
        losses[name] = float(ce.detach())
    assert calls == [1]  # one tower pass in that forward
    assert losses["joined"] == losses["plain"]  # bitwise
    vision = {n: p for n, p in joined.named_parameters() if ".visual." in f".{n}"}
    assert vision and all(p.grad is not None and not p.grad.any() for p in vision.values())
    text = dict(plain.named_parameters())
    for n, p in joined.named_parameters():
        if n not in vision:
            assert torch.equal(p.grad, text[n].grad), n
    with torch.no_grad():  # a forward given images runs the tower for them, once
        joined(input_ids=torch.tensor([[11, 12]]), use_cache=False)
    assert calls == [1, 1]

def test_dummy_inputs_are_one_image_of_the_smallest_grid(tiny):
    model, _ = tiny
    visual = model.model.visual
    pixels, grid = vision_join.dummy_inputs(visual, torch.device("cpu"))
    c = visual.config
    assert grid.tolist() == [[1, c.spatial_merge_size, c.spatial_merge_size]]
    assert pixels.shape == (c.spatial_merge_size ** 2, c.in_channels * c.temporal_patch_size * c.patch_size ** 2)
    with torch.no_grad():
        assert float(vision_join.zero_term(visual, pixels.device)) == 0.0

@pytest.mark.launcher  # torchrun over two gloo ranks: CI's launcher group
def test_a_text_only_rank_joins_the_vision_collectives_on_two_ranks(tiny_dir, tmp_path):
    out = tmp_path / "result.json"
    r = torchrun_script("tests/models/vision_join_script.py", str(tiny_dir), str(out), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = {x["rank"]: x for x in (json.loads(Path(f"{out}.{k}").read_text()) for k in (0, 1))}
    assert res[0]["has_image"] and not res[1]["has_image"]
    assert res[0]["visual_calls"] == res[1]["visual_calls"] == 1  # the text-only rank ran the tower too
    for x in res.values():
        assert x["ce"] == x["ce_plain"], x  # bitwise: the tower's pass adds 0 to the loss
        assert x["grads_match"], x
