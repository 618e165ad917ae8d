"""The GPU check's settings, on the CPU: its numerics engine keeps the rotary frequencies in fp32 as a
loaded engine does, and its attention and temperature default to the RL recipe's, flags overriding."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


ROTARY_BUFFERS = ("inv_freq", "original_inv_freq")


def test_numerics_engine_copy_is_bf16_with_fp32_rotary_frequencies(tiny_dir):
    import gpu_units

    from paravt.models.loading import load_model

    master = load_model(tiny_dir)
    engine = gpu_units.engine_copy(master)
    rotary = {n: b for n, b in engine.named_buffers() if n.rsplit(".", 1)[-1] in ROTARY_BUFFERS}
    assert any(".visual." in n for n in rotary) and any("language_model" in n for n in rotary)
    assert {n.rsplit(".", 1)[-1] for n in rotary} == set(ROTARY_BUFFERS)
    assert all(b.dtype == torch.float32 for b in rotary.values()), {n: b.dtype for n, b in rotary.items()}
    assert all(p.dtype == torch.bfloat16 for p in engine.parameters())
    master_buffers = dict(master.named_buffers())
    assert all(torch.equal(b, master_buffers[n]) for n, b in rotary.items())  # the same values, not rounded
    assert all(p.dtype == torch.float32 for p in master.parameters())  # the master is left as it was
    loaded = dict(load_model(tiny_dir, dtype="bfloat16").named_buffers())
    assert all(loaded[n].dtype == b.dtype for n, b in rotary.items())  # as a bf16 engine loads them


def test_attention_and_temperature_default_to_the_rl_recipe(monkeypatch, capsys):
    import gpu_check as gc

    from paravt.core.config import load_config
    from paravt.models import loading
    from paravt.rl.config import RLConfig

    recipe = load_config(RLConfig, ROOT / "configs" / "rl" / "paragrpo_8b.yaml")
    assert recipe.trainer.attn_implementation is None  # the trainer resolves it: flash-attn where installed
    a = gc.build_parser().parse_args([])
    assert Path(a.recipe) == ROOT / "configs" / "rl" / "paragrpo_8b.yaml"
    src = gc.recipe_defaults(a)
    assert a.attn == loading.default_attn_implementation() and a.temperature == recipe.grpo.temperature == 0.7
    assert "paragrpo_8b.yaml" in src["attn"] and "grpo.temperature" in src["temperature"]

    monkeypatch.setattr(loading, "default_attn_implementation", lambda: "flash_attention_2")  # flash-attn installed
    a = gc.build_parser().parse_args([])
    gc.recipe_defaults(a)
    assert a.attn == "flash_attention_2" and a.temperature == 0.7


@pytest.mark.parametrize("flags, attn, temperature", [(["--attn", "sdpa", "--temperature", "1"], "sdpa", 1.0),
                                                      (["--attn", "eager"], "eager", 0.9)])
def test_flags_and_the_recipe_file_override(tmp_path, flags, attn, temperature):
    import gpu_check as gc

    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_path: m\noutput_dir: o\ntrain_data: [t.parquet]\n"
                      "trainer: {attn_implementation: torch_varlen}\ngrpo: {temperature: 0.9}\n")
    a = gc.build_parser().parse_args(["--recipe", str(recipe), *flags])
    src = gc.recipe_defaults(a)
    assert (a.attn, a.temperature) == (attn, temperature) and src["attn"] == "--attn"
    a = gc.build_parser().parse_args(["--recipe", str(recipe)])
    gc.recipe_defaults(a)
    assert (a.attn, a.temperature) == ("torch_varlen", 0.9)
