"""The GPU check's RL-step and vision-tower units (``benchmarks/gpu_check.py`` runs each in its own process):
the RL trainer's step at the recipe's shape, packed as the trainer packs it, and the vision tower alone
with transformers' per-frame attention and with the batched one."""

from __future__ import annotations

import time
from pathlib import Path

import gpu_units as gu
from gpu_units import _assets, _config, _device, _dist, _model, _overview, _peak_gb, _reset_peak, _sync

from paravt.models import vision_attention
from paravt.models.loading import enable_activation_checkpointing


def _rl_step_timing(cfg, proc, video, dev, d, attn: str, samples: int, answer: int, pack_tokens: int = 32768) -> dict:
    """The RL trainer's step at the recipe's shape: ``samples`` rollouts of one prompt (its 64-frame
    overview shared) with ``answer`` policy tokens each, in packs of ``pack_tokens`` (0: one forward per
    sample), logits at the policy tokens, the PPO loss, one optimizer step."""
    import torch

    from paravt.models import parallel
    from paravt.models.tokenize import vision_token_ids
    from paravt.rl.grpo import ppo_token_loss
    from paravt.rl.logps import forward_logps
    from paravt.rl.packing import bins, packed_logps
    from paravt.rl.rollout import Sample

    _reset_peak(dev)
    model = _model(cfg, dev, torch.float32, attn)
    enable_activation_checkpointing(model)
    model.config.use_cache = False
    model = parallel.wrap_fsdp2(model, d, torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, **parallel.adamw_kwargs(dev))
    ids, images = _overview(proc, video)
    vision = torch.tensor(vision_token_ids(proc.tokenizer), dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    group = [Sample(ids + torch.randint(10, min(1000, cfg.text_config.vocab_size), (answer,), generator=g).tolist(),
                    [0] * len(ids) + [1] * answer, [0.0] * (len(ids) + answer), images, 1.0 if j % 2 else -1.0)
             for j in range(samples)]
    pos = list(range(len(ids) - 1, len(ids) + answer - 1))
    packs = bins(group, pack_tokens) if pack_tokens > 0 else [[s] for s in group]
    model.train()
    times = []
    for i in range(2):
        _sync(dev)
        t0 = time.perf_counter()
        for pack in packs:
            if len(pack) > 1:
                outs = packed_logps(model, pack, proc, cfg.image_token_id, vision, 0.7, dev, [pos] * len(pack))
            else:
                outs = [forward_logps(model, pack[0].input_ids, images, proc, cfg.image_token_id, vision, 0.7, dev,
                                      positions=pos, with_entropy=False)]
            loss = 0.0
            for s, (logp, _) in zip(pack, outs):
                mask = torch.tensor(s.loss_mask[1:], dtype=torch.bool, device=dev)
                behav = logp.detach()
                out = ppo_token_loss(logp, behav, behav, None, torch.full_like(logp, s.advantage), mask, 0.2, 0.0, 5.0)
                loss = loss + out.loss_sum
            (loss / (samples * answer)).backward()
        parallel.clip_grad_norm(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(dev)
        times.append(time.perf_counter() - t0)
    n_tok = samples * len(group[0].input_ids)
    res = {"samples": samples, "tokens_per_sample": len(group[0].input_ids), "pack_tokens": pack_tokens,
           "forwards": len(packs), "step_s": round(times[-1], 3), "first_step_s": round(times[0], 3),
           "tokens_per_s": round(n_tok / times[-1], 1), "peak_gb": _peak_gb(dev)}
    del model, opt
    return res


def unit_rl_step(a, tmp: Path) -> dict:
    dev, d = _device(), _dist()
    proc, video = _assets(tmp, a.small)
    return _rl_step_timing(_config(proc, a.layers, a.small), proc, video, dev, d, a.attn, a.rl_samples,
                           a.answer_tokens, a.rl_pack_tokens)


def unit_vision(a, tmp: Path) -> dict:
    """The vision tower alone (forward + backward, bf16 autocast on CUDA) on the recipe's 64-frame overview, with
    transformers' per-frame attention and then the project's batched path on the same weights; and the
    patch embedding alone as the Conv3d and as the linear."""
    import torch
    import torch.nn.functional as F

    from paravt.models.reference_shapes import vision_train_flops

    dev = _device()
    proc, video = _assets(tmp, a.small)
    cfg = _config(proc, 1, a.small)
    _, images = _overview(proc, video)
    pv, grid = (t.to(dev) for t in images.tensors(proc))
    keep, gu.FAST_VISION = gu.FAST_VISION, False
    try:
        model = _model(cfg, dev, torch.float32, a.attn)
    finally:
        gu.FAST_VISION = keep
    visual = model.model.visual.train()
    amp = torch.autocast("cuda", torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)

    def timed(fn, reps: int = 3) -> float:
        fn()
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(dev)
        return (time.perf_counter() - t0) / reps

    def step():
        with amp:
            out = visual(pv, grid_thw=grid)
        out.pooler_output.float().square().mean().backward()

    res = {"frames": int(grid[:, 0].sum()), "patches": int(grid.prod(-1).sum()),
           "train_flops": vision_train_flops(cfg.vision_config, grid.tolist())["total"]}
    res["per_frame_s"] = round(timed(step), 4)
    vision_attention.install(model)
    res["batched_s"] = round(timed(step), 4)
    w = visual.patch_embed.proj.weight
    x = pv.to(w.dtype)
    with torch.no_grad(), amp:
        c = visual.patch_embed.proj
        res["patch_embed_conv3d_s"] = round(timed(lambda: c(x.view(-1, c.in_channels, *c.kernel_size))), 5)
        res["patch_embed_linear_s"] = round(timed(lambda: F.linear(x, w.reshape(w.shape[0], -1), c.bias)), 5)
    res["batched_tflops"] = round(res["train_flops"] / res["batched_s"] / 1e12, 2)
    del model
    return res
