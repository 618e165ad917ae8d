"""One training step of a recipe on one fake rank, through the trainers' own code.

* SFT: the model built and wrapped as ``SFTTrainer`` does (``parallel.wrap_fsdp2``, the recipe's compute
  dtype over fp32 master weights, activation checkpointing as set, ``param_groups`` + AdamW as on CUDA:
  fused), a pack collated by ``paravt.sft.data.collate_packed``, then this rank's passes through
  ``SFTTrainer._pass`` (``token_ce_sum``: packed attention, logits at supervised positions only) and the
  step's tail (``clip_grad_norm``, ``optimizer.step``).
* RL: actor and reference built as ``RLTrainer`` does, the step's samples, then ``RLTrainer.train_on``
  itself: the split over ranks by tokens, packing to ``trainer.pack_tokens``, the reference's scores,
  token advantages, the PPO loss over logits at policy tokens, backward and the optimizer step.

:func:`trace` returns what :mod:`paravt.dryrun.measure` saw, with the notes the report prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from paravt.dryrun import workload
from paravt.dryrun.fake import MARKER, SIM, HostMode, init_fake_group, make_fake_mode, propagation_guard
from paravt.dryrun.measure import PeakTracker, StepCounter, split

# attention implementations the CPU runs as they are; the others (flash_attention_2, a GPU kernel) are
# stood in for by sdpa_varlen: causal SDPA on each packed sequence, the same FLOPs and O(length) memory
CPU_ATTENTION = ("sdpa_varlen", "torch_varlen", "sdpa", "eager")


@dataclass
class Trace:
    """One rank's step at one depth: the figures the report combines."""

    layers: int
    rank: int
    world: int
    memory: dict[str, int]
    peak_where: str
    flops: dict[str, int]
    bytes: dict[str, int]
    kernels: dict[tuple[int, int], int]
    collectives: dict[str, list[int]]
    attention: dict[str, int]
    blocks: dict[str, int]
    block_flops: dict[str, list[int]]
    syncs: int
    reads: int
    syncs_by_phase: dict[str, int]
    sync_sites: list[tuple[str, int]]
    placeholders: list[tuple[str, int]]
    stand_ins: list[tuple[str, int]]
    work: dict[str, Any]
    scale: float = 1.0  # the traced passes' share of the step (figures of the forward/backward phases x 1/scale)
    notes: list[str] = field(default_factory=list)
    torch_has_propagation_hook: bool = True


def attention_for(recipe_attn: str | None) -> tuple[str, str | None]:
    """(implementation the dry run uses, a note when it stands in for the recipe's)."""
    if recipe_attn in CPU_ATTENTION:
        return recipe_attn, None
    name = recipe_attn or "flash_attention_2 where flash-attn is installed (the recipe's null)"
    return "sdpa_varlen", (f"attention: sdpa_varlen (causal SDPA per packed sequence, a CPU kernel) stands in for "
                           f"{name}: the same FLOPs and memory of O(length); the GPU kernel makes one varlen call "
                           f"per layer where this makes one per sequence")


def steady_optimizer(opt) -> None:
    """The optimizer as from its second step on: its moments allocated (one step on zero gradients, before
    the traced step), so they count through the whole traced step."""
    for group in opt.param_groups:
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)


def _shard_bytes(model) -> int:
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total


def trace(stage: str, cfg, model_cfg, world: int, rank: int, opts: SimpleNamespace) -> Trace:
    """The step of ``cfg`` (an SFTConfig or RLConfig, ``stage`` "sft"/"rl") on rank ``rank`` of ``world``,
    the model of ``model_cfg``. ``opts``: answer_tokens, passes (SFT passes to trace, 0 = all), seed."""
    from paravt.models import parallel  # noqa: PLC0415
    from paravt.models.loading import resolve_dtype  # noqa: PLC0415

    init_fake_group(rank, world)
    torch.manual_seed(opts.seed)  # the initialisers' draws (fake: no values, but drawn from a known seed)
    fm = make_fake_mode()
    host = HostMode(fm)
    notes: list[str] = []
    sim = parallel.DistInfo(rank, world, 0, SIM)
    step_dist = parallel.DistInfo(rank, world, 0, MARKER)
    if stage == "sft":
        strategy, dtype, ckpt, attn = cfg.dist.strategy, cfg.dtype, cfg.gradient_checkpointing, cfg.attn_implementation
        reshard = cfg.dist.reshard_after_forward
    else:
        t = cfg.trainer
        strategy, dtype, ckpt, attn = t.strategy, t.dtype, t.gradient_checkpointing, t.attn_implementation
        reshard = True
    if strategy != "fsdp2":
        raise ValueError(f"the dry run models FSDP2 training; this recipe sets strategy {strategy!r}")
    attn, note = attention_for(attn)
    if note:
        notes.append(note)
    compute = resolve_dtype(dtype)
    with propagation_guard() as hooked, fm:
        with host:
            model = workload.build_model(model_cfg, attn, ckpt)
            if cfg.lora.enabled:  # as the trainers do before sharding: peft's adapters, every other weight frozen
                from paravt.models import lora  # noqa: PLC0415
                from torch.utils._python_dispatch import _disable_current_modes  # noqa: PLC0415
                with _disable_current_modes():  # the adapters made on meta, outside the fake modes
                    lora.attach(model, cfg.lora, empty=True)
                for m in model.modules():
                    if any(p.is_meta for p in m.parameters(recurse=False)):
                        m.to_empty(device=SIM, recurse=False)
            if stage == "sft" and cfg.optim.freeze_lm_head:
                from paravt.sft.trainer import freeze_lm_head  # noqa: PLC0415
                freeze_lm_head(model)
            parallel.wrap_fsdp2(model, sim, compute, reshard)
            setup = _sft_setup if stage == "sft" else _rl_setup
            opt, run, work, extra_params = setup(cfg, model, model_cfg, sim, step_dist, opts, notes, attn, ckpt)
            steady_optimizer(opt)
        tracker = PeakTracker(model, opt)
        counter = StepCounter(workload.blocks(model))
        host.phase = counter.phase
        with tracker, counter, host:
            # the tracker keeps per-module figures of one forward only; the step runs the model several
            # times (passes, packs, scores): cleared before each (the peak and its split are kept)
            h = model.register_forward_pre_hook(lambda m, a: tracker.reset_mod_stats(), prepend=True)
            scale = run(counter)
            h.remove()
        counter.close()
    snap = tracker.get_tracker_snapshot("peak").get(SIM, {})
    memory = split(snap)
    if extra_params:  # the reference model's shards: held all step, outside the tracked FSDP root
        memory["parameters"] += extra_params
        memory["peak"] += extra_params
    kinds: dict[str, int] = {}
    for kind, _ in workload.blocks(model).values():
        kinds[kind] = kinds.get(kind, 0) + 1
    per_block: dict[str, list[int]] = {}
    for (kind, i), f in sorted(counter.block_flops.items()):
        per_block.setdefault(kind, []).append(f)
    return Trace(layers=workload.text_layers(model_cfg), rank=rank, world=world, memory=memory,
                 peak_where=tracker.peak_where.get(SIM, "?"), flops=dict(counter.flops), bytes=dict(counter.bytes),
                 kernels=dict(counter.kernels), collectives={k: list(v) for k, v in counter.collectives.items()},
                 attention=dict(counter.attention), blocks=kinds, block_flops=per_block,
                 syncs=host.syncs + counter.host_collectives, reads=host.reads + counter.host_collectives,
                 syncs_by_phase=dict(host.by_phase, host_collectives=counter.host_collectives),
                 sync_sites=host.sites.most_common(), placeholders=host.placeholders.most_common(),
                 stand_ins=host.stand_ins.most_common(),
                 work=dict(work, host_collectives=counter.host_collectives), scale=scale, notes=notes,
                 torch_has_propagation_hook=hooked)


def _sft_setup(cfg, model, model_cfg, sim, step_dist, opts, notes, attn, ckpt):
    from paravt.models import parallel  # noqa: PLC0415
    from paravt.sft.data import collate_packed  # noqa: PLC0415
    from paravt.sft.trainer import SFTTrainer, param_groups  # noqa: PLC0415

    opt = torch.optim.AdamW(param_groups(model, cfg.optim.weight_decay, cfg.optim.vision_lr_scale, cfg.optim.lr),
                            lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), eps=cfg.optim.eps,
                            **parallel.adamw_kwargs(torch.device("cuda")))
    shape = workload.frame_shape(model_cfg.vision_config, cfg.video.max_pixels)
    examples = workload.sft_examples(model_cfg, cfg.max_length, cfg.video.max_frames, shape, opts.answer_tokens,
                                     opts.seed, opts.sft_examples)
    batch = collate_packed(examples, None, model_cfg.image_token_id, model.model.get_rope_index)
    split_ = cfg.step_split(sim.world_size)
    passes = split_.passes
    traced = passes if not opts.passes else min(passes, opts.passes)
    n_sup = int((batch["labels"][:, 1:] != -100).sum())
    scale = sim.world_size / max(1, n_sup * passes * sim.world_size)
    stub = SimpleNamespace(dist=step_dist, model=model, ds_engine=None)
    if traced < passes:
        notes.append(f"{traced} of the step's {passes} passes traced (every pass holds the same pack): the "
                     f"forward/backward FLOPs, bytes and collectives are the traced passes' x {passes / traced:g}")

    def run(counter: StepCounter) -> float:
        model.train()
        for _ in range(traced):
            SFTTrainer._pass(stub, dict(batch), scale)
        with counter.optimizer_phase():
            parallel.clip_grad_norm(model.parameters(), cfg.optim.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return traced / passes

    lengths = [len(e) for e in examples]
    frames = [len(e.images) if e.images is not None else 0 for e in examples]
    work = {"packs_per_rank": passes, "pack_tokens": sum(lengths), "examples": lengths, "frames": frames,
            "frame_grid": [shape.h, shape.w], "patches_per_pack": sum(frames) * shape.patches,
            "supervised_tokens_per_pack": n_sup, "grids": [[1, shape.h, shape.w]] * sum(frames)}
    return opt, run, work, 0


def _rl_setup(cfg, model, model_cfg, sim, step_dist, opts, notes, attn, ckpt):
    from paravt.models import parallel  # noqa: PLC0415
    from paravt.models.loading import resolve_dtype  # noqa: PLC0415
    from paravt.rl.packing import split_by_tokens  # noqa: PLC0415
    from paravt.rl.trainer import RLTrainer  # noqa: PLC0415

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.optim.lr,
                            betas=tuple(cfg.optim.betas), eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay,
                            **parallel.adamw_kwargs(torch.device("cuda")))
    ref, ref_bytes = None, 0
    if cfg.grpo.kl_coef > 0 and cfg.lora.enabled:  # the KL reference: the actor with its adapters off
        ref = model
    elif cfg.grpo.kl_coef > 0:
        ref = workload.build_model(model_cfg, attn, False, resolve_dtype(cfg.trainer.dtype))
        ref.requires_grad_(False)
        ref = parallel.wrap_fsdp2(ref, sim, None)
        ref.eval()
        ref_bytes = _shard_bytes(ref)
    g, ha = cfg.grpo, cfg.hierarchical_agent
    frames = max(cfg.paravt.gating.choices) if cfg.paravt.gating.nframes_gating else ha.nframes
    if cfg.paravt.gating.nframes_gating:
        notes.append(f"every prompt at K = {frames} overview frames, the gate's largest (the heaviest step)")
    shape = workload.frame_shape(model_cfg.vision_config, ha.crop.max_pixels)
    answer = opts.answer_tokens or ha.max_new_tokens
    samples = workload.rl_samples(model_cfg, g.prompts_per_step, g.n_samples, frames, shape, answer, opts.seed)
    trainer = RLTrainer.__new__(RLTrainer)
    trainer.cfg, trainer.dist, trainer.actor, trainer.ref, trainer.optimizer = cfg, step_dist, model, ref, opt
    trainer.processor, trainer.gtr, trainer.global_step = None, None, 0
    trainer.image_token_id = model_cfg.image_token_id
    trainer.vision_ids = workload.vision_ids(model_cfg)
    if cfg.gtr.mode != "off":
        notes.append(f"gtr.mode={cfg.gtr.mode}: the corrected-thought NLL samples are not modelled")

    def run(counter: StepCounter) -> float:
        plain = trainer._optimizer_step

        def optimizer_step():
            with counter.optimizer_phase():
                return plain()

        trainer._optimizer_step = optimizer_step
        trainer.train_on(samples)
        return 1.0

    mine = [s for part in [split_by_tokens(samples[i::g.ppo_minibatches], sim.world_size)[sim.rank]
                           for i in range(g.ppo_minibatches)] for s in part]
    packs = trainer._rank_packs(split_by_tokens(samples, sim.world_size), samples[0]) if g.ppo_minibatches == 1 else []
    work = {"samples_per_step": len(samples), "samples_this_rank": len(mine),
            "sample_tokens": len(samples[0].input_ids),
            "overview_frames": frames, "answer_tokens": answer, "frame_grid": [shape.h, shape.w],
            "pack_tokens_budget": cfg.trainer.pack_tokens,
            "packs_this_rank": [sum(len(s.input_ids) for s in p) for p in packs],
            "reference_model": ref is not None, "patches_per_prompt": frames * shape.patches,
            "grids": [[1, shape.h, shape.w]] * frames * len({id(s.images) for s in mine})}
    return opt, run, work, ref_bytes
