"""The models, inputs and tolerances of the fast paths' equality tests, on both tiny Qwen3-VLs.

``tiny``: the default tiny model (tied embeddings, one deepstack level, vision head_dim 32), on the world's
first four SFT rows (64 × 64 frames). ``tiny8b``: the tiny model with Qwen3-VL-8B's structure
(:func:`paravt.models.tiny.tiny_8b_structure_shape`: untied lm_head, three deepstack levels into text
layers 0-2, text head_dim 128 with 4:1 GQA, vision head_dim 72, the 8B's M-RoPE sections and theta), on
four rows with several frame images each, two of them at 64 × 64 and two at 96 × 96: one pack holds two
frame sizes. It runs in fp32 and in bf16 (the 8B's training dtype), the latter with a bf16 tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

# (model, dtype): every model in fp32, the 8B-structured one also in bf16
CASES = [("tiny", "float32"), ("tiny8b", "float32"), ("tiny8b", "bfloat16")]
CASE_IDS = [f"{m}-{'bf16' if d == 'bfloat16' else 'fp32'}" for m, d in CASES]
DIR_FIXTURES = {"tiny": "tiny_dir", "tiny8b": "tiny8b_dir"}
LARGE_FRAME_PIXELS = 96 * 96  # min_pixels of the second frame size (6 × 6 patches; the default gives 4 × 4)

# bf16 keeps 8 significant bits (a relative step of 2^-8 ≈ 0.4%); two computations that round differently
# (another kernel, another summation order) drift apart by a few steps through the layers.
BF16_REL = 3e-2


@dataclass
class Case:
    name: str
    dtype: str
    path: Path
    processor: object
    examples: list


def case_for(request, name: str, dtype: str, world: Path) -> Case:
    """The directory, processor and SFT examples of one case (``request`` gives the session fixtures)."""
    from paravt.data.schema import load_sft_rows
    from paravt.models.loading import load_processor
    from paravt.sft.data import ExampleBuilder, VideoSamplingConfig

    path = request.getfixturevalue(DIR_FIXTURES[name])
    proc = load_processor(path)
    rows = load_sft_rows([world / "local" / "paravt_sft_synth.parquet"])[0]
    if name == "tiny":
        b = ExampleBuilder(proc, VideoSamplingConfig(), 8192)
        return Case(name, dtype, path, proc, [b(r) for r in rows[:4]])
    small = ExampleBuilder(proc, VideoSamplingConfig(), 8192)
    large = ExampleBuilder(proc, VideoSamplingConfig(min_pixels=LARGE_FRAME_PIXELS), 8192)
    examples = [small(rows[1]), large(rows[2]), small(rows[3]), large(rows[4])]
    sizes = {tuple(g[1:]) for e in examples for g in e.images.tensors(proc)[1].tolist()}
    assert len(sizes) == 2 and all(len(e.images) > 1 for e in examples)
    return Case(name, dtype, path, proc, examples)


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: str, atol: float = 1e-5, rtol: float = 1e-4,
                 what: str = "") -> None:
    """fp32: elementwise within ``atol``/``rtol``. bf16: the relative error of the whole tensor (its norm)
    within :data:`BF16_REL`, and no element off by more than ``BF16_REL`` of the tensor's largest magnitude."""
    if dtype == "float32":
        assert torch.allclose(got, want, atol=atol, rtol=rtol), (what, float((got - want).abs().max()))
        return
    g, w = got.detach().float(), want.detach().float()
    scale = float(w.norm())
    rel = float((g - w).norm()) / max(scale, 1e-12)
    worst = float((g - w).abs().max()) / max(float(w.abs().max()), 1e-12)
    assert rel <= BF16_REL and worst <= BF16_REL, (what, rel, worst)
