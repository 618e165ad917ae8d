"""The dry run of a LoRA recipe (configs/rl/paragrpo_8b_lora_4gpu.yaml): peft's adapters on the frozen base as the
trainers attach them, no reference model (the actor with its adapters off), gradients and AdamW state for the
adapters alone, and the weight push the engine gets (the adapter alone for launched vLLM servers, merged for
SGLang). Small model in seconds; the recipe's full-width record in benchmarks/results/dryrun/."""

from __future__ import annotations

import json

import pytest

from tests.dryrun.conftest import ROOT, TEXT, dry_run

RECIPE = "configs/rl/paragrpo_8b_lora_4gpu.yaml"
GIB = 2 ** 30
# 6 x 2 samples over the 3 trainer ranks: every rank the same work, so each run traces one rank (uneven ranks, each
# kind traced, are tests/dryrun/test_launch.py's)
SMALL = ["--gpus", "4", "grpo.prompts_per_step=6", "grpo.n_samples=2", "hierarchical_agent.max_new_tokens=64",
         "paravt.gating.choices=[4]", "hierarchical_agent.crop.max_pixels=12544"]


def _adapter_params(rank: int) -> int:
    """r x (in + out) of every text decoder linear of the small model (TEXT), from its shapes by hand."""
    h, i = TEXT["hidden_size"], TEXT["intermediate_size"]
    q, kv = TEXT["num_attention_heads"] * TEXT["head_dim"], TEXT["num_key_value_heads"] * TEXT["head_dim"]
    per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
    return rank * per_layer * TEXT["num_hidden_layers"]


def test_lora_shrinks_the_optimizer_state_drops_the_reference_and_pushes_the_adapter(small_config, tmp_path):
    """The same step with and without adapters: with them, AdamW state holds the adapters alone (fp32 moments: 8
    bytes a parameter, over 3 trainer ranks) and no second model is held for the KL reference;
    the step itself (bf16 compute, the reference scored with the adapters off first) runs through the trainer."""
    runs = {}  # vLLM servers the run launches: the LoRA run pushes the adapter alone, the full run the model
    for name, extra in (("lora", ["rollout.engine=vllm"]), ("full", ["lora.enabled=false", "rollout.engine=vllm"])):
        proc, res = dry_run(RECIPE, "--model-config", str(small_config), *SMALL, *extra,
                            json_out=tmp_path / f"{name}.json")
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = res
        if name == "lora":
            assert "weight push per step: the LoRA adapter alone" in proc.stdout
    lora, full = runs["lora"], runs["full"]
    assert lora["world"] == full["world"] == 3 and len(lora["ranks"]) == len(full["ranks"]) == 1  # one kind of rank
    n_adapter = _adapter_params(64)
    note = next(n for n in lora["notes"] if n.startswith("lora:"))
    assert f"{n_adapter:,} of {lora['model']['params'] + n_adapter:,} parameters train" in note
    assert "adapters off (no second model)" in note and not any(n.startswith("lora:") for n in full["notes"])
    m_lora, m_full = lora["ranks"][0]["memory"], full["ranks"][0]["memory"]
    shard = n_adapter / 3
    assert m_lora["optimizer"] == pytest.approx(8 * shard, rel=0.05)  # AdamW's two fp32 moments
    assert m_full["optimizer"] == pytest.approx(8 * full["model"]["params"] / 3, rel=0.05)  # every parameter's
    assert m_lora["peak"] < m_full["peak"]
    # the full run holds a bf16 reference beside the fp32 actor; the LoRA run only the actor (and its adapters)
    assert m_lora["parameters"] < m_full["parameters"]
    assert lora["weight_push"]["kind"] == "adapter" and lora["weight_push"]["bytes"] == 2 * n_adapter  # bf16
    assert full["weight_push"]["kind"] == "full" and full["weight_push"]["bytes"] == 2 * full["model"]["params"]


def test_the_recorded_lora_dry_run_fits_an_h100():
    """The recipe at Qwen3-VL-8B's width, every layer traced (benchmarks/results/dryrun/): 3 trainer ranks fit
    an 80 GB H100 with the 8B recipe's whole batch; the adapters' AdamW state is under a GiB a rank where the
    full 4-GPU recipe's is tens; its SGLang server gets the merged weights."""
    from paravt.core.config import load_config
    from paravt.models.reference_shapes import PUBLISHED_PARAMS
    from paravt.rl.config import RLConfig

    cfg = load_config(RLConfig, RECIPE)
    res = json.loads((ROOT / "benchmarks/results/dryrun/paragrpo_8b_lora_4gpu.json").read_text())
    full = json.loads((ROOT / "benchmarks/results/dryrun/paragrpo_4gpu.json").read_text())
    assert (res["recipe"], res["world"], res["gpus_per_node"], res["extrapolated"]) == (RECIPE, 3, 4, False)
    assert res["model"]["params"] == PUBLISHED_PARAMS["8b"] and cfg.lora.enabled and cfg.lora.rank == 64
    assert res["work"]["samples_per_step"] == cfg.grpo.prompts_per_step * cfg.grpo.n_samples == 56
    assert all(r["fits"] and r["memory"]["peak"] <= 79.2 * GIB for r in res["ranks"])
    assert all(r["memory"]["optimizer"] < 1 * GIB for r in res["ranks"])
    assert max(r["memory"]["optimizer"] for r in full["ranks"]) > 20 * GIB
    assert res["weight_push"]["kind"] == "merged" and cfg.rollout.engine == "sglang"
