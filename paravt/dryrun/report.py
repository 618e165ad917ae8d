"""From traces to the dry run's figures: the GPU's numbers, a depth extrapolation, the roofline bound,
the collectives on the wire, the fit verdict, and the printed table.

Units: memory in GiB (2^30 bytes, as ``torch.cuda.max_memory_allocated`` figures are quoted in this
repository), FLOPs in TFLOP (10^12), traffic in GB (10^9), time in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GiB = 2 ** 30


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float  # what torch reports as the card's total memory
    bf16_tflops: float  # dense bf16 peak (the MFU denominator)
    hbm_tbs: float  # HBM bandwidth, TB/s
    link_gbs: float  # NVLink bandwidth per GPU and direction, GB/s


GPUS = {
    "h100": GPU("NVIDIA H100 80GB HBM3 (SXM)", 79.2, 989.0, 3.35, 450.0),
    "h200": GPU("NVIDIA H200 141GB HBM3e (SXM)", 139.8, 989.0, 4.8, 450.0),
    "a100": GPU("NVIDIA A100-SXM4-80GB", 79.2, 312.0, 2.039, 300.0),
}
NET_GBS = 50.0  # one 400 Gb/s NIC: the weight push to servers on another node

MEMORY = ("parameters", "gradients", "optimizer", "activations", "temporaries")
PHASES = ("forward", "recompute", "backward", "optimizer")


def wire_bytes(kind: str, buffer: float, world: int) -> float:
    """Bytes one rank sends (= receives) for a collective over ``world`` ranks with a ring: (N-1)/N of
    an all-gather's output or a reduce-scatter's input, twice that for an all-reduce, the whole tensor
    for a broadcast."""
    if world <= 1:
        return 0.0
    share = (world - 1) / world
    return {"all_gather": share, "reduce_scatter": share, "all_reduce": 2 * share}.get(kind, 1.0) * buffer


def figures(tr, gpu: GPU) -> dict[str, float]:
    """Every number of one trace, flat, with the traced passes scaled to the whole step."""
    k = 1.0 / tr.scale
    out: dict[str, float] = {f"memory.{c}": float(tr.memory[c]) for c in MEMORY}
    out["memory.peak"] = float(tr.memory["peak"])
    for p in PHASES:
        f = float(tr.flops.get(p, 0)) * (1 if p == "optimizer" else k)
        b = float(tr.bytes.get(p, 0)) * (1 if p == "optimizer" else k)
        out[f"flops.{p}"], out[f"bytes.{p}"] = f, b
    for kind in ("all_gather", "reduce_scatter", "all_reduce", "broadcast"):
        calls, buf = tr.collectives.get(kind, [0, 0])
        m = k if kind in ("all_gather", "reduce_scatter") else 1.0
        out[f"collectives.{kind}.calls"] = calls * m
        out[f"collectives.{kind}.buffer_bytes"] = buf * m
        out[f"collectives.{kind}.wire_bytes"] = wire_bytes(kind, buf * m, tr.world)
    syncs = sum(v * (1 if p in ("optimizer", "host_collectives") else k) for p, v in tr.syncs_by_phase.items())
    out["host_syncs"] = float(syncs)
    for kind, n in tr.blocks.items():  # the step's forwards of the trained model (not the reference's)
        out[f"attention_calls.{kind}"] = tr.attention.get(kind, 0) * k / max(1, n)
    peak, bw = gpu.bf16_tflops * 1e12, gpu.hbm_tbs * 1e12
    per_kernel = sum(n * max(f / peak, b / bw) for (f, b), n in tr.kernels.items())
    # the kernels of the traced passes stand for all of them (optimizer kernels counted once: a small error)
    out["roofline.per_kernel_s"] = per_kernel * k
    return out


def derive(fig: dict[str, float], gpu: GPU) -> dict[str, float]:
    """Totals and time bounds from :func:`figures` (after any extrapolation)."""
    f = dict(fig)
    f["flops.model"] = f["flops.forward"] + f["flops.backward"] + f["flops.optimizer"]
    f["flops.executed"] = f["flops.model"] + f["flops.recompute"]
    f["bytes.total"] = sum(f[f"bytes.{p}"] for p in PHASES)
    f["roofline.compute_s"] = f["flops.executed"] / (gpu.bf16_tflops * 1e12)
    f["roofline.memory_s"] = f["bytes.total"] / (gpu.hbm_tbs * 1e12)
    f["roofline.bound_s"] = max(f["roofline.compute_s"], f["roofline.memory_s"], f["roofline.per_kernel_s"])
    wire = sum(f[f"collectives.{k}.wire_bytes"] for k in ("all_gather", "reduce_scatter", "all_reduce", "broadcast"))
    f["collectives.wire_bytes"] = wire
    f["collectives.link_s"] = wire / (gpu.link_gbs * 1e9)
    bound = f["roofline.bound_s"]
    f["mfu_at_bound"] = f["flops.model"] / (gpu.bf16_tflops * 1e12) / bound if bound else 0.0
    return f


def extrapolate(fa: dict[str, float], fb: dict[str, float], la: int, lb: int, layers: int) -> dict[str, float]:
    """Each figure linear in the text layers through the traces at ``la`` and ``lb`` layers, at ``layers``."""
    return {k: fb[k] + (layers - lb) * (fb[k] - fa[k]) / (lb - la) for k in fb}


def per_layer(fa: dict[str, float], fb: dict[str, float], la: int, lb: int) -> dict[str, float]:
    return {k: (fb[k] - fa[k]) / (lb - la) for k in fb}


def advice(stage: str, cfg, split: dict[str, float], world: int, ckpt: bool) -> str:
    """What to lower, the largest category's knob first."""
    knobs = []
    act = split["activations"] + split["temporaries"]
    state = split["parameters"] + split["gradients"] + split["optimizer"]
    if stage == "sft":
        pack = f"max_length ({cfg.max_length})"
        frames = f"video.max_frames ({cfg.video.max_frames}) or video.max_pixels ({cfg.video.max_pixels})"
        micro = None
    else:
        pack = f"trainer.pack_tokens ({cfg.trainer.pack_tokens})"
        if cfg.paravt.gating.nframes_gating:
            frames = f"paravt.gating.choices (up to {max(cfg.paravt.gating.choices)} frames)"
        else:
            frames = f"hierarchical_agent.nframes ({cfg.hierarchical_agent.nframes})"
        micro = f"hierarchical_agent.max_new_tokens ({cfg.hierarchical_agent.max_new_tokens})"
    more = f"more GPUs than {world} (parameters, gradients and optimizer state shard over them)"
    if act >= state:
        knobs = [pack, frames] + ([micro] if micro else []) + ([] if ckpt else ["turn gradient_checkpointing on"])
        knobs.append(more)
    else:  # the sharded state dominates: more GPUs first
        return f"use {more}, or lower {pack} or {frames}"
    return "lower " + ", ".join(knobs[:-1]) + f", or use {knobs[-1]}" if len(knobs) > 1 else knobs[0]


def ranks_label(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0-2,4-6``."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    text = ",".join(f"{x[0]}-{x[-1]}" if len(x) > 1 else f"{x[0]}" for x in runs)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


def gib(x: float) -> str:
    return f"{x / GiB:.1f}"


def render(res: dict[str, Any]) -> str:
    """The printed report of :func:`paravt.dryrun.recipe.run`'s result."""
    g = res["gpu"]
    m = res["model"]
    f = res["figures"]
    lines = [(f"paravt dry run: {res['recipe']} ({res['stage'].upper()}) on {res['world']} trainer rank(s) x "
              f"{g['name']}"),
             (f"  model: {m['name']}, {m['text_layers']} text layers, {m['vision_blocks']} vision blocks, "
              f"{m['params'] / 1e9:.2f} B parameters; fake tensors, fake process group (torch {res['torch']})")]
    if res["extrapolated"]:
        lines.append(f"  traced at {res['layers_traced'][0]} and {res['layers_traced'][1]} text layers, figures "
                     f"extrapolated linearly to {m['text_layers']} (per-layer check: {res['linear_check']['verdict']})")
    w = res["work"]
    lines.append("  step per rank: " + w["summary"])
    lines.append("")
    lines.append("  memory per rank, GiB       params  grads  optim  activ  temps   peak   "
                 f"vs {g['memory_gib']:.1f}  at")
    for r in res["ranks"]:
        s = r["memory"]
        who = ranks_label(r["ranks"])
        lines.append(f"  {who:<26} {gib(s['parameters']):>6} {gib(s['gradients']):>6} {gib(s['optimizer']):>6} "
                     f"{gib(s['activations']):>6} {gib(s['temporaries']):>6} {gib(s['peak']):>6}   "
                     f"{'fits' if r['fits'] else 'OVER'}  {r['peak_where']}")
    lines.append("")
    tf = {k: f[f"flops.{k}"] / 1e12 for k in ("model", "forward", "backward", "executed")}
    lines.append(f"  FLOPs per rank per step: {tf['model']:,.1f} TFLOP (forward {tf['forward']:,.1f}, backward "
                 f"{tf['backward']:,.1f}); executed with activation recompute {tf['executed']:,.1f}; MFU denominator "
                 f"{g['bf16_tflops']:.0f} TFLOP/s a GPU (dense bf16)")
    lines.append(f"  kernel traffic per rank: {f['bytes.total'] / 1e9:,.0f} GB read + written (eager: each op reads "
                 "its inputs, writes its outputs)")
    c = res["collectives"]
    lines.append("  collectives per rank per step (buffer / on the wire, GB): " + "; ".join(
        f"{k.replace('_', '-')} {v['calls']:.0f} x: {v['buffer_bytes'] / 1e9:,.1f} / {v['wire_bytes'] / 1e9:,.1f}"
        for k, v in c.items() if v["calls"]))
    if res.get("weight_push"):
        p = res["weight_push"]
        if p.get("kind") == "adapter":
            lines.append(f"  weight push per step: the LoRA adapter alone, {p['bytes'] / 1e9:,.2f} GB (bf16), written by "
                         f"trainer rank 0 and loaded by each of {p['servers']} server(s) (lora.push=auto)")
        else:
            merged = " (LoRA: the merged weights)" if p.get("kind") == "merged" else ""
            lines.append(f"  weight push per step{merged}: {p['bytes'] / 1e9:,.1f} GB (bf16) broadcast from trainer "
                         f"rank 0 to {p['servers']} server(s), each receiving all of it; before it every trainer rank "
                         f"all-gathers each parameter in bf16: {p['gather_wire_bytes'] / 1e9:,.1f} GB on the wire per "
                         f"rank; {p['seconds']:.2f} s at {p['link_gbs']:.0f} GB/s (a bound)")
    hs = res["host_syncs"]
    lines.append(f"  host syncs per rank per step: {hs['count']:.0f} (device values read on the host; top sites, "
                 "counted in the traced passes: "
                 + "; ".join(f"{s} x{n}" for s, n in hs["sites"][:4]) + ")")
    lines.append("  attention calls per block per step (the trained model's forwards): " + ", ".join(
        f"{k} {v:g}" for k, v in res["attention_calls_per_block"].items()))
    rf = res["roofline"]
    lines.append(f"  roofline on {g['name']} (a bound, not a prediction): {rf['bound_s']:.2f} s per step "
                 f"= max(compute {rf['compute_s']:.2f} s, HBM {rf['memory_s']:.2f} s, "
                 f"per kernel {rf['per_kernel_s']:.2f} s); "
                 f"collectives {rf['link_s']:.2f} s on NVLink (overlap compute); MFU at the bound "
                 f"{100 * rf['mfu_at_bound']:.0f}%")
    if res["notes"]:
        lines.append("")
        lines.append("  notes:")
        lines.extend(f"  - {n}" for n in res["notes"])
    return "\n".join(lines)
