"""The vision tower's batched attention: one SDPA kernel per block for one video's frames (counted at the
dispatcher), the same features and gradients as transformers' per-frame loop, and the linear patch
embedding equal to the Conv3d. The feature equality runs on both tiny models, the 8B-structured one (vision
head_dim 72, three deepstack levels) also in bf16 (:mod:`tests.models.tiny_cases`)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from paravt.models.vision_attention import frame_runs
from tests.models.tiny_cases import CASE_IDS, CASES, DIR_FIXTURES, assert_close


class AttentionCalls(TorchDispatchMode):
    """Counts the SDPA kernels dispatched (any backend: flash/efficient/math/cuDNN)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "scaled_dot_product" in str(func):
            self.n += 1
        return func(*args, **(kwargs or {}))


def test_frame_runs_group_consecutive_frames_of_one_size():
    grid = torch.tensor([[1, 4, 4], [1, 4, 4], [8, 4, 4], [1, 8, 4], [2, 8, 4], [1, 4, 4]])
    assert frame_runs(grid) == ((0, 10, 16), (160, 3, 32), (256, 1, 16))
    assert frame_runs(torch.tensor([[8, 6, 10]])) == ((0, 8, 60),)


def _towers(path, dtype="float32"):
    """(transformers' own model, the project's load_model), the same weights, training mode."""
    from transformers import AutoModelForImageTextToText

    from paravt.models.loading import load_model

    plain = AutoModelForImageTextToText.from_pretrained(str(path), attn_implementation="sdpa",
                                                        dtype=getattr(torch, dtype)).train()
    fast = load_model(path, dtype).train()
    return plain, fast


@pytest.fixture(scope="module")
def towers(tiny_dir):
    return _towers(tiny_dir)


def _inputs(visual, grid, seed=0):
    c = visual.config
    n = int(grid.prod(-1).sum())
    return torch.randn(n, c.in_channels * c.temporal_patch_size * c.patch_size ** 2,
                       generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("grid", [[[8, 4, 4]], [[1, 4, 4]] * 16])  # one video's 8 temporal patches; 16 frame images
def test_one_attention_call_per_block_for_one_videos_frames(towers, grid):
    plain, fast = towers
    grid = torch.tensor(grid)
    frames = int(grid[:, 0].sum())
    x = _inputs(fast.model.visual, grid)
    depth = len(fast.model.visual.blocks)
    counts = []
    for model in (plain, fast):
        with AttentionCalls() as c:
            model.model.visual(x, grid_thw=grid)
        counts.append(c.n)
    assert counts == [frames * depth, depth]  # before: one call per frame per block; now one per block


@pytest.mark.parametrize("which", CASES, ids=CASE_IDS)
def test_features_and_gradients_equal_the_per_frame_loop(which, request):
    name, dtype = which
    plain, fast = _towers(request.getfixturevalue(DIR_FIXTURES[name]), dtype)
    assert len(fast.model.visual.deepstack_merger_list) == {"tiny": 1, "tiny8b": 3}[name]
    grid = torch.tensor([[1, 4, 4]] * 6 + [[2, 8, 4]] + [[1, 4, 8]] * 3)  # three runs of different sizes
    x = _inputs(fast.model.visual, grid, seed=1)
    outs = []
    for model in (plain, fast):
        model.zero_grad(set_to_none=True)
        o = model.model.visual(x, grid_thw=grid)
        loss = o.pooler_output.square().sum() + sum(f.square().sum() for f in o.deepstack_features)
        loss.backward()
        outs.append((o, {n: p.grad.clone() for n, p in model.model.visual.named_parameters() if p.grad is not None}))
    (a, ga), (b, gb) = outs
    assert_close(b.pooler_output, a.pooler_output, dtype, atol=1e-5, rtol=1e-4, what="merger")
    assert len(a.deepstack_features) == len(b.deepstack_features)
    for i, (fa, fb) in enumerate(zip(a.deepstack_features, b.deepstack_features)):
        assert_close(fb, fa, dtype, atol=1e-5, rtol=1e-4, what=f"deepstack {i}")
    assert ga.keys() == gb.keys() and "patch_embed.proj.weight" in ga
    for n in ga:
        assert_close(gb[n], ga[n], dtype, atol=1e-5, rtol=1e-3, what=n)


def test_patch_embedding_is_a_linear_on_the_same_parameter(towers):
    plain, fast = towers
    pe = fast.model.visual.patch_embed
    assert [n for n, _ in pe.named_parameters()] == ["proj.weight", "proj.bias"]  # checkpoints unchanged
    assert isinstance(pe.proj, torch.nn.Conv3d)
    x = _inputs(fast.model.visual, torch.tensor([[2, 4, 4]]), seed=2)
    seen = []
    hook = pe.proj.register_forward_hook(lambda *a: seen.append(1))  # the conv module itself never runs
    try:
        got = pe(x)
    finally:
        hook.remove()
    assert not seen
    assert torch.allclose(got, plain.model.visual.patch_embed(x), atol=1e-5, rtol=1e-5)


def test_a_flash_attention_tower_ignores_the_text_packs_keywords(tiny_dir):
    """Under a flash-attention implementation transformers' own vision path runs, and passes its own
    cu_seq_lens_* beside the forward's keywords: the packed text row's keywords (what ``packed_call`` gives the
    model) must not reach it. A stand-in flash kernel (SDPA within each cu_seqlens segment, registered under
    a name with "flash" in it, which is what transformers checks) runs that path on the CPU."""
    from transformers import AttentionInterface, AutoModelForImageTextToText

    from paravt.models.loading import load_model
    from paravt.models.packed_attention import varlen_kwargs

    def stand_in_flash(module, q, k, v, attention_mask, cu_seq_lens_q=None, scaling=None, **kwargs):
        assert "packed_bounds" not in kwargs, sorted(kwargs)
        bounds = cu_seq_lens_q.tolist()
        outs = [torch.nn.functional.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], scale=scaling)
                for s, e in zip(bounds, bounds[1:])]
        return torch.cat(outs, 2).transpose(1, 2), None

    AttentionInterface.register("paravt_flash_stand_in", stand_in_flash)
    plain = AutoModelForImageTextToText.from_pretrained(str(tiny_dir), attn_implementation="sdpa").eval()
    fast = load_model(tiny_dir).eval()
    fast.model.visual.config._attn_implementation = "paravt_flash_stand_in"
    grid = torch.tensor([[1, 4, 4]] * 4)
    x = _inputs(fast.model.visual, grid, seed=2)
    text = varlen_kwargs(torch.tensor([[0, 1, 2, 0, 1]]))  # a packed row of two sequences
    with torch.no_grad():
        want = plain.model.visual(x, grid_thw=grid).pooler_output
        got = fast.model.visual(x, grid_thw=grid, **text).pooler_output
    assert torch.allclose(want, got, atol=1e-5, rtol=1e-4)
