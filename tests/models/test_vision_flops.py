"""The vision tower's FLOP count (the GPU check's "with vision" figure): per layer on the tokens each
layer sees, equal to what torch's FLOP counter measures on the tiny tower's forward + backward."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from paravt.models.reference_shapes import qwen3vl_8b_config, vision_train_flops


def test_count_equals_the_measured_matmuls_of_a_training_step(tiny):
    model, _ = tiny
    vis = model.model.visual.train()
    c = vis.config
    grid = torch.tensor([[1, 4, 4]] * 8 + [[2, 8, 4]])
    x = torch.randn(int(grid.prod(-1).sum()), c.in_channels * c.temporal_patch_size * c.patch_size ** 2)
    with FlopCounterMode(display=False) as fc:
        o = vis(x, grid_thw=grid)
        (o.pooler_output.sum() + sum(f.sum() for f in o.deepstack_features)).backward()
    model.zero_grad(set_to_none=True)
    vis.eval()  # the session's shared model
    counts = {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}
    matmuls = sum(v for k, v in counts.items() if k in ("aten.mm", "aten.addmm", "aten.bmm"))
    got = vision_train_flops(c, grid.tolist())
    # the counter does not register CPU flash attention: the matmuls alone are the rest of the count
    assert matmuls == got["total"] - got["attention"]
    assert got["patches"] == 192


def test_mergers_are_charged_on_a_quarter_of_the_patches():
    v = qwen3vl_8b_config(num_hidden_layers=1).vision_config
    grid = [[1, 14, 14]] * 64  # the recipe's 64-frame overview at 50,176 pixels per frame
    f = vision_train_flops(v, grid)
    n = 64 * 196
    merger = (v.hidden_size * 4) ** 2 + v.hidden_size * 4 * v.out_hidden_size
    assert f["mergers"] == 3 * 2 * merger * (1 + len(v.deepstack_visual_indexes)) * n / 4
    assert f["attention"] == 3 * v.depth * 4 * v.hidden_size * 64 * 196 ** 2
    params_6n = 6 * n * (v.depth * (4 * v.hidden_size ** 2 + 2 * v.hidden_size * v.intermediate_size)
                         + (1 + len(v.deepstack_visual_indexes)) * merger
                         + v.in_channels * v.temporal_patch_size * v.patch_size ** 2 * v.hidden_size)
    assert f["total"] < params_6n  # the count by 6 x parameters x patches overstates the tower
