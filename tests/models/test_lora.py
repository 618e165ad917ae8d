"""LoRA through peft (:mod:`paravt.models.lora`): the config block, the adapters on the tiny Qwen3-VL, the
reference with the adapters off, the merged model every whole-model consumer gets (exports, pushes), and
the adapter in peft's own format."""

from __future__ import annotations

import pytest
import torch

from paravt.core.config import load_config
from paravt.models import lora, parallel
from paravt.models.loading import load_model
from paravt.rl.config import RLConfig
from paravt.sft.config import SFTConfig


def _adapted(tiny_dir, vision: bool = False, seed: int = 0):
    """The tiny model with rank-4 adapters whose B is random (a fresh adapter's B is 0: no effect)."""
    m = load_model(tiny_dir).eval()
    lora.attach(m, lora.LoraConfig(enabled=True, rank=4, alpha=8.0, vision=vision))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return m


def _logits(m, ids):
    with torch.no_grad():
        return m(input_ids=ids).logits


IDS = torch.arange(5, 29).unsqueeze(0)


@pytest.mark.parametrize("override, message", [
    ("lora.rank=0", "lora.rank must be >= 1"),
    ("lora.dropout=1.0", "lora.dropout in [0, 1)"),
    ("lora.target_modules=[q_proj,qkv]", "lora.target_modules must be some of q_proj | k_proj"),
    ("lora.push=adapter", "lora.push must be one of auto | merged, got 'adapter'"),
])
def test_a_bad_lora_setting_is_one_line(override, message):
    import re

    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(SFTConfig, None, ["model_path=m", "data=[{path: x}]", override])
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(RLConfig, None, ["model_path=m", "train_data=[x]", override])


def test_off_by_default_and_refused_with_deepspeed():
    for cfg in (load_config(SFTConfig, "configs/sft/qwen3vl_8b.yaml"), load_config(RLConfig, "configs/rl/paragrpo_8b.yaml"),
                load_config(SFTConfig, "configs/sft/tiny.yaml"), load_config(RLConfig, "configs/rl/tiny.yaml")):
        assert cfg.lora.enabled is False
    with pytest.raises(ValueError, match="lora.enabled trains under dist.strategy=fsdp2, ddp or none, not deepspeed"):
        load_config(SFTConfig, "configs/sft/tiny.yaml", ["model_path=m", "lora.enabled=true", "dist.strategy=deepspeed"])


def test_only_the_adapters_train_and_the_reference_is_the_base(tiny_dir):
    base = load_model(tiny_dir).eval()
    m = _adapted(tiny_dir)
    trainable = [n for n, p in m.named_parameters() if p.requires_grad]
    assert trainable and all(lora.is_adapter_param(n) for n in trainable)
    # text decoder linears only: 7 per layer, an A and a B each
    assert len(trainable) == 2 * 7 * m.config.text_config.num_hidden_layers
    assert not any(".visual." in n for n in trainable)
    assert (_logits(m, IDS) - _logits(base, IDS)).abs().max() > 1e-3  # the adapters change the model
    with lora.reference(m):  # peft's disable_adapter: exactly the frozen base, no second model
        assert torch.equal(_logits(m, IDS), _logits(base, IDS))
        # the adapters still marked trained inside (FSDP2 may read it at a first forward here)
        assert [n for n, p in m.named_parameters() if p.requires_grad] == trainable
    assert not torch.equal(_logits(m, IDS), _logits(base, IDS))  # switched back on after the context
    with lora.reference(base):  # a model without adapters: a no-op context
        pass
    assert lora.peft_model(base) is None
    vis = _adapted(tiny_dir, vision=True)
    assert any(".visual.blocks.0.attn.qkv.lora_A." in n for n, p in vis.named_parameters() if p.requires_grad)
    assert not any(".merger." in n and p.requires_grad for n, p in vis.named_parameters())


def test_the_merged_stream_is_peft_merge_and_unload(tiny_dir, tmp_path):
    """Every whole-model consumer (the hf/ export, the in-process push's state dict, the broadcast buckets) gets
    the merged checkpoint: W + (alpha/r) B A under the plain names, equal to peft's merge_and_unload."""
    import copy

    from paravt.models.loading import load_processor

    m = _adapted(tiny_dir, vision=True)
    ref = copy.deepcopy(lora.peft_model(m)).merge_and_unload()
    want = dict(ref.named_parameters())
    got = dict(parallel.iter_full_params(m))
    assert list(got) == [n for n, _ in lora.merged_params(m)]  # the bucket plan's order is the stream's
    assert set(got) == set(want) == {n for n, _ in load_model(tiny_dir).named_parameters()}
    assert max(float((got[k] - want[k]).abs().max()) for k in want) == 0.0
    sd = parallel.full_state_dict(m)
    assert set(sd) == set(ref.state_dict()) and all(torch.equal(sd[k], v) for k, v in ref.state_dict().items())
    out = parallel.export_hf(m, load_processor(tiny_dir), tmp_path / "hf", parallel.DistInfo(0, 1, 0, torch.device("cpu")))
    assert torch.allclose(_logits(load_model(out), IDS), _logits(m, IDS), atol=1e-5)
    from paravt.core.weight_sync import unflatten  # the broadcast transport's buckets: the merged tensors

    b = parallel.weight_buckets(m, torch.float32, 1 << 20, True)
    assert [x.name for bucket in b.plan for x in bucket] == list(got)
    sent = {k: v.clone() for metas, flat in zip(b.plan, b) for k, v in unflatten(flat, metas)}  # buffers reused
    assert list(sent) == list(got) and all(torch.equal(sent[k], want[k]) for k in want)
    assert lora.full_bytes(m) == sum(p.numel() * 4 for p in ref.parameters())


def test_no_adapters_streams_unchanged(tiny_dir):
    m = load_model(tiny_dir)
    named = list(m.named_parameters())
    assert list(lora.merged(m, iter(named))) == named and lora.merged_params(m) == named
    sd = m.state_dict()
    assert lora.merge_state_dict(m, sd) is sd


def test_the_adapter_in_peft_format(tiny_dir, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file

    m = _adapted(tiny_dir)
    n = lora.save_adapter(m, tmp_path / "a", True, dtype=torch.bfloat16, base_model=str(tiny_dir))
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == ["adapter_config.json", "adapter_model.safetensors"]
    t = load_file(str(tmp_path / "a/adapter_model.safetensors"))
    assert all(k.startswith("base_model.model.model.language_model.layers.") and k.endswith((".lora_A.weight", ".lora_B.weight"))
               for k in t)
    assert n == sum(v.numel() * 2 for v in t.values()) and all(v.dtype == torch.bfloat16 for v in t.values())
    lora.save_adapter(m, tmp_path / "b", True)  # fp32: loads back to the trained model exactly
    back = PeftModel.from_pretrained(load_model(tiny_dir), str(tmp_path / "b")).eval()
    assert torch.equal(_logits(back, IDS), _logits(m, IDS))
    with pytest.raises(ValueError, match="no LoRA adapters"):
        lora.save_adapter(load_model(tiny_dir), tmp_path / "c", True)
