"""Cold-start SFT with LoRA (``lora.enabled=true``): only the adapters train, every checkpoint holds the
adapter in peft's format beside the merged ``hf/`` export (what ``final`` points at, what RL and eval load),
resume continues exactly, and the adapters compose with FSDP2 on two gloo ranks through ``run_sft.sh``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from paravt.core.config import load_config
from paravt.sft.config import SFTConfig
from paravt.sft.trainer import SFTTrainer

ROOT = Path(__file__).resolve().parents[2]
LORA = ["lora.enabled=true", "lora.rank=4", "lora.alpha=8", "optim.lr=1e-2"]


def _over(world, tiny_dir, out, *extra):
    return [f"model_path={tiny_dir}", f"output_dir={out}", f"data.0.path={world}/local/paravt_sft_synth.parquet",
            "max_length=1024", "logging.wandb_project=null", "logging.progress=false", "save_every=2", *LORA, *extra]


def _cfg(world, tiny_dir, out, *extra):
    return load_config(SFTConfig, "configs/sft/tiny.yaml", _over(world, tiny_dir, out, *extra))


def _weights(path):
    return load_file(str(path / "model.safetensors"))


def test_lora_sft_trains_the_adapter_saves_it_and_resumes(world, tiny_dir, tmp_path):
    straight = SFTTrainer(_cfg(world, tiny_dir, tmp_path / "a", "max_steps=4"))
    trainable = {n for n, p in straight.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    straight.train()
    half = SFTTrainer(_cfg(world, tiny_dir, tmp_path / "b", "max_steps=4"))
    half.train(until=3)  # "crash" after step 3; the last checkpoint is step 2
    resumed = SFTTrainer(_cfg(world, tiny_dir, tmp_path / "b", "max_steps=4"))
    resumed.train()
    assert resumed.global_step == 4
    ck = tmp_path / "a/checkpoints/step_000004"
    assert sorted(p.name for p in (ck / "adapter").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    for part in ("hf/model.safetensors", "adapter/adapter_model.safetensors"):  # the resumed run ends where the other does
        wa, wb = load_file(str(ck / part)), load_file(str(tmp_path / "b/checkpoints/step_000004" / part))
        assert wa.keys() == wb.keys() and all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa), part
    merged, base = _weights(tmp_path / "a/final"), _weights(tiny_dir)
    assert merged.keys() == base.keys()  # a plain checkpoint: the names of the base, no adapter tensors
    adapted = {k for k in base if any(f".{t}.weight" in k for t in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                       "up_proj", "down_proj"))}
    assert adapted and all(not torch.equal(merged[k], base[k]) for k in adapted)  # B moved: W + (alpha/r) B A
    assert all(torch.equal(merged[k], base[k]) for k in base.keys() - adapted)  # the rest stayed frozen
    from peft import PeftModel

    from paravt.models.loading import load_model
    ids = torch.arange(5, 29).unsqueeze(0)
    with torch.no_grad():  # the adapter over the base is the merged export
        a = PeftModel.from_pretrained(load_model(tiny_dir), str(ck / "adapter"))(input_ids=ids).logits
        b = load_model(tmp_path / "a/final")(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-5)
    steps = [json.loads(ln)["step"] for ln in (tmp_path / "b/metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


@pytest.mark.launcher  # run_sft.sh under torchrun, two gloo ranks: CI's launcher group
def test_run_sft_with_lora_on_one_rank_or_two_fsdp2_ranks_gives_the_same_adapter(world, tiny_dir, tmp_path):
    """``bash scripts/run_sft.sh configs/sft/tiny.yaml lora.enabled=true`` with NPROC=2: FSDP2 shards the
    adapters with their layers (sharded start-up: rank 0's adapter initialisation reaches every rank), and two
    steps of three padded rows give the adapter and merged export of one rank."""
    over = ["packing=false", "global_batch_size=3", "per_device_batch_size=1", "max_length=2048", "max_steps=2"]
    SFTTrainer(_cfg(world, tiny_dir, tmp_path / "one", *over)).train()
    r = subprocess.run(["bash", "scripts/run_sft.sh", "configs/sft/tiny.yaml",
                        *_over(world, tiny_dir, tmp_path / "two", *over)], cwd=ROOT, capture_output=True, text=True,
                       timeout=900, env={**os.environ, "NPROC": "2", "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    rec = [json.loads(ln) for ln in (tmp_path / "two/metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rec] == [1, 2] and all(x["micro_batches"] == 2 for x in rec)
    for part in ("hf/model.safetensors", "adapter/adapter_model.safetensors"):
        wa = load_file(str(tmp_path / "one/checkpoints/step_000002" / part))
        wb = load_file(str(tmp_path / "two/checkpoints/step_000002" / part))
        assert wa.keys() == wb.keys()
        worst = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
        # measured on the adapters: 6e-6 (Adam's first steps divide the ranks' differently summed gradients by their size)
        assert worst < (1e-6 if part.startswith("hf") else 2e-5), (part, worst)
