"""FSDP2 layout of the trainers' model (:func:`paravt.models.parallel.wrap_fsdp2`) on a gloo group of one:
the embeddings, the lm_head, the vision embeddings and every merger are groups of their own (the root keeps
the final norm only), the root keeps torch's reshard default while the groups take the configured one, and
under bf16 mixed precision the vision blocks receive their rotary (cos, sin) in fp32."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import FSDPModule

from paravt.models import parallel


@pytest.fixture(scope="module")
def dist_one():
    d = parallel.init_distributed()
    assert d.world_size == 1
    return d


def _untied(tiny_dir):
    """The tiny model's shape with a separate lm_head (the 8B's layout), random init."""
    from transformers import Qwen3VLForConditionalGeneration

    from paravt.models.loading import load_processor
    from paravt.models.tiny import TinyShape, build_config

    torch.manual_seed(0)
    cfg = build_config(TinyShape(tie_word_embeddings=False), load_processor(tiny_dir).tokenizer)
    return Qwen3VLForConditionalGeneration(cfg)


def _image_batch(model, n_text=12):
    """One row: an image of a 4 × 4 patch grid (4 merged tokens) between text tokens; labels = ids."""
    cfg = model.config
    vis = cfg.vision_config
    grid = torch.tensor([[1, 4, 4]])
    merged = int(grid.prod()) // vis.spatial_merge_size ** 2
    text = torch.randint(10, 400, (n_text,), generator=torch.Generator().manual_seed(0)).tolist()
    ids = torch.tensor([text[:4] + [cfg.vision_start_token_id] + [cfg.image_token_id] * merged
                        + [cfg.vision_end_token_id] + text[4:]])
    pixels = torch.randn(int(grid.prod()), vis.in_channels * vis.temporal_patch_size * vis.patch_size ** 2,
                         generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels, "image_grid_thw": grid,
            "mm_token_type_ids": (ids == cfg.image_token_id).long(), "labels": ids}


def _root_params(model) -> set[str]:
    """Names of the modules whose parameters the root's FSDP group holds."""
    names = {id(m): n for n, m in model.named_modules()}
    return {names[id(fp._module_info.module)] for g in model._get_fsdp_state()._fsdp_param_groups
            for fp in g.fsdp_params}


def _groups_of(model) -> dict[str, object]:
    return {n: m._get_fsdp_state() for n, m in model.named_modules() if isinstance(m, FSDPModule) and n}


@pytest.mark.parametrize("tied", [True, False])
def test_embeddings_head_and_vision_mergers_are_groups_of_their_own(tiny_dir, dist_one, tied):
    from paravt.models.loading import load_model

    model = load_model(tiny_dir) if tied else _untied(tiny_dir)
    head, emb = model.lm_head, model.model.language_model.embed_tokens
    assert (head.weight is emb.weight) == tied
    parallel.wrap_fsdp2(model, dist_one, torch.float32, shard_one_rank=True)
    visual = model.model.visual
    own = [emb, head, visual.patch_embed, visual.pos_embed, visual.merger, *visual.deepstack_merger_list,
           *visual.blocks, *model.model.language_model.layers]
    assert all(isinstance(m, FSDPModule) for m in own)
    assert _root_params(model) == {"model.language_model.norm"}  # nothing of the modules above
    states = _groups_of(model)
    # one group for the patch and position embeddings; a tied lm_head in the embeddings' group
    assert states["model.visual.patch_embed"] is states["model.visual.pos_embed"]
    assert (states["lm_head"] is states["model.language_model.embed_tokens"]) == tied
    held = sum(fp.sharded_param.numel() for g in model._get_fsdp_state()._fsdp_param_groups for fp in g.fsdp_params)
    assert held == model.config.text_config.hidden_size  # one rank: the shard is the whole norm weight


@pytest.mark.parametrize("reshard", [True, False])
def test_the_root_keeps_torchs_reshard_default_and_the_groups_the_configured_one(tiny_dir, dist_one, reshard):
    from paravt.models.loading import load_model

    model = load_model(tiny_dir)
    parallel.wrap_fsdp2(model, dist_one, torch.float32, reshard_after_forward=reshard, shard_one_rank=True)
    root = model._get_fsdp_state()
    assert root._auto_reshard_after_forward  # reshard_after_forward=None: torch decides for the root
    with torch.no_grad():
        model(input_ids=torch.tensor([[11, 12, 13, 14]]), use_cache=False)  # lazy init: the root is known
    assert all(g.post_forward_mesh_info is None for g in root._fsdp_param_groups)  # not freed after forward
    for name, state in _groups_of(model).items():
        for g in state._fsdp_param_groups:
            assert (g.post_forward_mesh_info is not None) == reshard, name


def test_vision_blocks_get_fp32_rotary_under_bf16_mixed_precision(tiny_dir, dist_one):
    from paravt.models.loading import load_model
    from paravt.models.losses import supervised_ce_sum

    model = load_model(tiny_dir)
    parallel.wrap_fsdp2(model, dist_one, torch.bfloat16)
    seen = []

    def capture(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        cos, sin = kwargs["position_embeddings"]
        seen.append((hidden.dtype, cos.dtype, sin.dtype))

    for blk in model.model.visual.blocks:  # after FSDP's own pre-hook (it is prepended): what the block computes on
        blk.register_forward_pre_hook(capture, with_kwargs=True)
    model.train()
    ce, n = supervised_ce_sum(model, _image_batch(model))
    ce.backward()
    assert n > 0 and torch.isfinite(ce)
    assert seen == [(torch.bfloat16, torch.float32, torch.float32)] * len(model.model.visual.blocks)
    grads = [p.grad for p in model.model.visual.parameters()]
    assert all(g is not None and torch.isfinite(g.full_tensor()).all() for g in grads)


@pytest.mark.parametrize("first", ["reference", "policy"])
def test_lora_under_bf16_trains_whether_the_first_forward_is_the_references_or_not(tiny_dir, dist_one, first):
    """RL with LoRA scores the KL reference with the adapters off (``lora.reference``), often as the model's
    first forward, where FSDP2 reads which parameters train. peft's switch-off freezes the adapters; seen frozen
    there, the adapter groups got no fp32 original dtype and their bf16 gradients were never cast back (the
    first backward failed). The adapters' fp32 gradients arrive either way."""
    from paravt.models import lora
    from paravt.models.loading import load_model

    model = load_model(tiny_dir)
    lora.attach(model, lora.LoraConfig(enabled=True, rank=4, alpha=8.0))
    parallel.wrap_fsdp2(model, dist_one, torch.bfloat16, shard_one_rank=True)
    ids = torch.tensor([[11, 12, 13, 14, 15, 16]])
    if first == "reference":
        with torch.no_grad(), lora.reference(model):
            model(input_ids=ids, use_cache=False)
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n for n in trained)
    model(input_ids=ids, use_cache=False).logits.float().square().mean().backward()
    for n, p in trained.items():
        assert p.grad is not None and p.grad.dtype == torch.float32, n
    # a fresh adapter's B is 0, so A's gradient is 0 too; B's is not
    assert all(float(p.grad.full_tensor().abs().sum()) > 0 for n, p in trained.items() if ".lora_B." in n)
