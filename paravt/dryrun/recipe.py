"""A recipe's dry run: its stage and config, the trainer ranks its placement gives, the ranks with distinct
work, one trace per such rank (or two depths and a linear extrapolation), and every figure of the report."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any


def load(recipe: str, overrides: list[str]):
    """(stage, config) of a recipe: its folder names the stage (configs/sft, configs/rl), else the schema
    that accepts it."""
    from paravt.core.config import load_config  # noqa: PLC0415
    from paravt.rl.config import RLConfig  # noqa: PLC0415
    from paravt.sft.config import SFTConfig  # noqa: PLC0415

    folder = Path(recipe).parent.name
    order = [("sft", SFTConfig), ("rl", RLConfig)] if folder == "sft" else [("rl", RLConfig), ("sft", SFTConfig)]
    errors = []
    for stage, schema in order:
        try:
            return stage, load_config(schema, recipe, overrides)
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001 - the other schema may take it
            errors.append(f"{stage}: {' '.join(str(exc).split())}")
            if folder in ("sft", "rl"):
                break
    raise ValueError("; ".join(errors))


def trainer_world(stage: str, cfg, gpus: int) -> dict[str, Any]:
    """Trainer ranks (and, for RL, rollout servers and whether they sit on other nodes) of ``gpus`` GPUs a node."""
    if stage == "sft":
        return {"world": gpus, "servers": 0, "remote_servers": False}
    from paravt.rl.layout import plan  # noqa: PLC0415

    nodes = cfg.rollout.layout.split(",") if cfg.rollout.layout else ["node 0"]
    pl = plan(cfg, gpus, {"NNODES": str(len(nodes))} if len(nodes) > 1 else {})
    if pl.expect:
        servers = sum(pl.expect.values())
    else:
        servers = len(cfg.rollout.urls) if cfg.rollout.urls else cfg.rollout.replicas
    remote = bool(pl.expect) and any(n != 0 for n in pl.expect)
    cfg.check_world_size(pl.world)
    return {"world": pl.world, "servers": servers, "remote_servers": remote}


def rank_groups(stage: str, cfg, model_cfg, world: int, opts) -> list[list[int]]:
    """Ranks with the same work (one traced for each group): SFT ranks all train one pack shape; RL ranks
    by the lengths of the samples the token split gives them."""
    if stage == "sft":
        return [list(range(world))]
    from paravt.dryrun import workload  # noqa: PLC0415
    from paravt.rl.packing import split_by_tokens  # noqa: PLC0415

    g, ha = cfg.grpo, cfg.hierarchical_agent
    frames = max(cfg.paravt.gating.choices) if cfg.paravt.gating.nframes_gating else ha.nframes
    shape = workload.frame_shape(model_cfg.vision_config, ha.crop.max_pixels)
    n = workload.prompt_len(frames, shape) + (opts.answer_tokens or ha.max_new_tokens)
    lengths = [SimpleNamespace(input_ids=range(n))] * (g.prompts_per_step * g.n_samples)
    groups: dict[tuple, list[int]] = {}
    for r, part in enumerate(split_by_tokens(lengths, world)):
        groups.setdefault(tuple(len(s.input_ids) for s in part), []).append(r)
    return list(groups.values())


def run(stage: str, cfg, recipe: str, gpus: int, gpu_name: str, gpu_memory: float | None, model_path: str | None,
        layers: str, answer_tokens: int | None, passes: int, seed: int, world: int | None = None,
        sft_examples: list[tuple[int, int]] | None = None, text_layers: int | None = None) -> dict[str, Any]:
    """Trace the recipe's step and return every figure (the report's and ``--json``'s). ``world``: the
    trainer ranks (default: the recipe's on ``gpus`` GPUs a node); ``sft_examples``: [(frames, answer
    tokens)] of the SFT pack instead of a filled one; ``text_layers``: the model at this depth."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    from paravt.dryrun import report, steps, workload  # noqa: PLC0415

    gpu = report.GPUS[gpu_name]
    if gpu_memory is not None:
        gpu = report.GPU(gpu.name, gpu_memory, gpu.bf16_tflops, gpu.hbm_tbs, gpu.link_gbs)
    # no --model-config: the published config the recipe's model_path names (Qwen3-VL-2B/4B/8B), else the 8B's
    from paravt.models.reference_shapes import reference_size  # noqa: PLC0415

    reference = None if model_path is not None else (reference_size(getattr(cfg, "model_path", None)) or "8b")
    full = workload.model_config(model_path, text_layers, reference)
    depth = workload.text_layers(full)
    if world is None:
        placement = trainer_world(stage, cfg, gpus)
    else:
        placement = {"world": world, "servers": 1, "remote_servers": False}
    world = placement["world"]
    if stage == "sft":
        answer = 512 if answer_tokens is None else answer_tokens
    else:
        answer = answer_tokens or 0
    opts = SimpleNamespace(answer_tokens=answer, passes=passes, seed=seed, sft_examples=sft_examples)
    depths = [depth] if layers == "all" else sorted({int(x) for x in layers.split(",")})
    if layers != "all" and (len(depths) != 2 or depths[0] < 1 or depths[1] >= depth + 1):
        raise ValueError(f"--layers {layers}: give two depths A,B with 1 <= A < B <= {depth} (or 'all')")
    deep = len(getattr(full.vision_config, "deepstack_visual_indexes", []) or [])
    if layers != "all" and depths[0] < deep:
        raise ValueError(f"--layers {layers}: trace at least {deep} text layers (the vision tower's {deep} deepstack "
                         f"features join the first {deep}; a shallower model leaves some mergers out of the step)")
    extrapolated = depths != [depth]
    groups = rank_groups(stage, cfg, full, world, opts)
    ranks, notes, busiest, traces_kept = [], [], None, None
    checks: dict[str, Any] = {}
    for group in groups:
        traces = [steps.trace(stage, cfg, workload.model_config(model_path, d, reference), world, group[0], opts)
                  for d in depths]
        figs = [report.figures(t, gpu) for t in traces]
        if extrapolated:
            fig = report.extrapolate(figs[0], figs[1], depths[0], depths[1], depth)
            checks = linear_check(traces, figs, depths)
        else:
            fig = figs[0]
        fig = report.derive(fig, gpu)
        memory = {c: fig[f"memory.{c}"] for c in report.MEMORY}
        memory["peak"] = fig["memory.peak"]  # the tracker's total (the categories partition it)
        ranks.append({"ranks": group, "traced_rank": group[0], "memory": memory, "peak_where": traces[-1].peak_where,
                      "fits": memory["peak"] <= gpu.memory_gib * report.GiB})
        for t in traces:
            notes.extend(n for n in t.notes if n not in notes)
        if busiest is None or fig["flops.model"] > busiest["flops.model"]:
            busiest, traces_kept = fig, traces
    t = traces_kept[-1]
    if extrapolated:
        notes.append(f"traced at {depths[0]} and {depths[1]} text layers (the vision tower whole); every figure "
                     f"extrapolated linearly to {depth} layers; the module at the peak is the {depths[1]}-layer "
                     "trace's")
    if t.placeholders:
        notes.append("values a fake tensor cannot give were read as 1 (their figures do not depend on them): "
                     + "; ".join(f"{s} x{n}" for s, n in t.placeholders))
    if t.stand_ins:
        notes.append("ops whose output shape depends on unknown values ran on real zero tensors: "
                     + "; ".join(f"{s} x{n}" for s, n in t.stand_ins))
    notes.append("host tensors (ids, positions, image grids, masks from lists) are real and computed on the CPU; "
                 "their values on the device are kept beside the fake tensors, so reads of them return true values")
    if not t.torch_has_propagation_hook:
        notes.append("this torch has no ShardingPropagator._fake_mode_lock: DTensor's metadata propagation in the "
                     "optimizer step counts as memory (the peak may be too high there)")
    notes.append(f"torch {torch.__version__} traced it (the SFT stage pins torch 2.9.1, the RL stage 2.14.1); not "
                 "modelled: the CUDA context, NCCL buffers, the caching allocator's fragmentation")
    work = dict(t.work)
    work.pop("grids", None)
    if stage == "sft":
        work["summary"] = (f"{work['packs_per_rank']} pass(es) of one {work['pack_tokens']:,}-token pack "
                           f"({len(work['examples'])} examples, {sum(work['frames'])} frames of "
                           f"{work['frame_grid'][0]}x{work['frame_grid'][1]} patches, "
                           f"{work['supervised_tokens_per_pack']:,} supervised tokens), then the optimizer step")
    else:
        work["summary"] = (f"{work['samples_this_rank']} of the step's {work['samples_per_step']} samples of "
                           f"{work['sample_tokens']:,} tokens ({work['overview_frames']} overview frames + "
                           f"{work['answer_tokens']:,} policy tokens) in packs of {work['packs_this_rank']} tokens"
                           f"{', reference scores' if work['reference_model'] else ''}, PPO loss, optimizer step")
    res: dict[str, Any] = {
        "recipe": recipe, "stage": stage, "torch": torch.__version__, "transformers": transformers.__version__,
        "model": {"name": f"Qwen3-VL-{reference.upper()}" if model_path is None else model_path, "text_layers": depth,
                  "vision_blocks": int(full.vision_config.depth), "params": 0},
        "gpu": {"key": gpu_name, **vars(gpu)}, "world": world, "gpus_per_node": gpus,
        "layers_traced": depths, "extrapolated": extrapolated, "linear_check": checks or {"verdict": "not needed"},
        "work": work, "ranks": ranks, "figures": busiest,
        "collectives": {k: {"calls": busiest[f"collectives.{k}.calls"],
                            "buffer_bytes": busiest[f"collectives.{k}.buffer_bytes"],
                            "wire_bytes": busiest[f"collectives.{k}.wire_bytes"]}
                        for k in ("all_gather", "reduce_scatter", "all_reduce", "broadcast")},
        "host_syncs": {"count": busiest["host_syncs"], "sites": t.sync_sites, "reads": t.reads},
        "attention_calls_per_block": {k.split(".", 1)[1]: v for k, v in busiest.items()
                                      if k.startswith("attention_calls.")},
        "roofline": {k.split(".", 1)[1]: v for k, v in busiest.items() if k.startswith("roofline.")}
        | {"link_s": busiest["collectives.link_s"], "mfu_at_bound": busiest["mfu_at_bound"]},
        "notes": notes}
    n_params, push = _param_bytes(full)
    res["model"]["params"] = n_params
    if cfg.lora.enabled:
        adapter = _adapter_bytes(full, cfg.lora) // 2
        ref = " the KL reference is the actor with its adapters off (no second model);" \
            if stage == "rl" and cfg.grpo.kl_coef > 0 else ""
        notes.append(f"lora: rank {cfg.lora.rank} adapters (peft) on the frozen base, {adapter:,} of "
                     f"{n_params + adapter:,} parameters train;{ref} gradients and AdamW state for the adapters alone")
    if stage == "rl":
        from paravt.rl.engine_sync import pushes_adapter  # noqa: PLC0415

        link = report.NET_GBS if placement["remote_servers"] else gpu.link_gbs
        kind = "merged" if cfg.lora.enabled else "full"
        if pushes_adapter(cfg):  # the adapter alone, written by rank 0 and loaded by each server
            kind, push = "adapter", _adapter_bytes(full, cfg.lora)
        res["weight_push"] = {"bytes": push, "servers": placement["servers"], "link_gbs": link, "kind": kind,
                              "gather_wire_bytes": report.wire_bytes("all_gather", push, world),
                              "seconds": push / (link * 1e9)}
    return res


def _adapter_bytes(cfg, lora_cfg) -> int:
    """bf16 bytes of the LoRA adapter on the full-depth model: r x (in + out) for each adapted linear."""
    import re  # noqa: PLC0415

    from paravt.models.lora import target_pattern  # noqa: PLC0415
    from paravt.models.reference_shapes import param_shapes  # noqa: PLC0415

    pattern = re.compile(rf"(?:{target_pattern(lora_cfg)})\.weight")
    return 2 * sum(lora_cfg.rank * (shape[0] + shape[1]) for name, shape in param_shapes(cfg)
                   if len(shape) == 2 and pattern.fullmatch(name))


def _param_bytes(cfg) -> tuple[int, int]:
    """(parameters, their bf16 bytes) of the full-depth model, from its shapes (meta device)."""
    from paravt.models.reference_shapes import param_shapes  # noqa: PLC0415

    n = 0
    for _, shape in param_shapes(cfg):
        k = 1
        for s in shape:
            k *= s
        n += k
    return n, 2 * n


def linear_check(traces, figs, depths) -> dict[str, Any]:
    """Whether the two traces grow by whole layers: every text layer's forward FLOPs equal (within and
    between the traces) and the peak reached at the same place (the same module, its layer index aside,
    in the same phase); with the per-layer increments of the main figures."""
    import re  # noqa: PLC0415

    layer_flops = [[f / t.scale for f in t.block_flops.get("text layer", [])] for t in traces]
    equal = len({f for fl in layer_flops for f in fl}) == 1
    places = [re.sub(r"\.\d+\.", ".N.", t.peak_where) for t in traces]
    same_place = places[0] == places[1]
    inc = {k: (figs[1][k] - figs[0][k]) / (depths[1] - depths[0])
           for k in ("flops.forward", "flops.backward", "collectives.all_gather.buffer_bytes", "memory.peak")}
    ok = equal and same_place
    return {"text_layer_forward_flops_per_step": sorted({f for fl in layer_flops for f in fl}),
            "peak_places": places, "per_layer_increment": inc,
            "verdict": ("equal per layer: every text layer's forward FLOPs are the same in both traces and the "
                        "peak is at the same place" if ok else
                        "NOT equal per layer (" + ("layer FLOPs differ" if not equal else
                                                   f"the peak moves: {places[0]} / {places[1]}")
                        + "): the extrapolation is suspect, trace more layers or --layers all")}
