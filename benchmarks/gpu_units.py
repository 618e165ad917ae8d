"""The measurements of the GPU check (``benchmarks/gpu_check.py``), one function per unit: each runs in
a fresh process that ``gpu_check.py --unit NAME`` starts. ``python benchmarks/gpu_units.py --load-like-run-rl
CKPT OUT`` is the start-up unit's own child: it loads a checkpoint the way ``run_rl.sh`` does."""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from paravt.models import vision_attention  # noqa: E402
from paravt.models.loading import enable_activation_checkpointing  # noqa: E402


FAST_VISION = True  # the project's vision path (batched attention, linear patch embedding); set by gpu_check

# ---------------------------------------------------------------------------------------------- setup
def _device():
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _peak_gb(dev) -> float:
    import torch

    return round(torch.cuda.max_memory_allocated(dev) / 2**30, 2) if dev.type == "cuda" else None


def _reset_peak(dev) -> None:
    import torch

    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


def _assets(tmp: Path, small: bool):
    """The tiny processor (offline tokenizer + image processor at the recipe's 50176 pixels per frame)
    and a synthetic video to take 64 overview frames from."""
    from paravt.data.synthetic.world import WorldConfig
    from paravt.data.synthetic.writer import build_world
    from paravt.models.loading import load_processor
    from paravt.models.tiny import build_tiny

    build_tiny(tmp / "tiny", seed=0)
    pixels = 4096 if small else 50176
    proc = load_processor(tmp / "tiny", min_pixels=pixels, max_pixels=pixels)
    build_world(tmp / "world", WorldConfig(seed=0, n_train_videos=1, n_eval_videos=1), progress=False)
    video = sorted((tmp / "world").rglob("*.mp4"))[0]
    return proc, video


def _config(proc, layers: int, small: bool):
    """Qwen3-VL-8B's config at ``layers`` text layers (or the tiny one), with the tiny tokenizer's ids."""
    from paravt.models.reference_shapes import qwen3vl_8b_config

    tok = proc.tokenizer
    if small:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(str(Path(proc.tokenizer.name_or_path)))
        cfg.text_config.num_hidden_layers = layers
    else:
        cfg = qwen3vl_8b_config(num_hidden_layers=layers)
    for k, t in (("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
                 ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")):
        setattr(cfg, k, tok.convert_tokens_to_ids(t))
    return cfg


def _model(cfg, dev, dtype, attn: str, seed: int = 0):
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    torch.manual_seed(seed)
    with torch.device(dev):
        m = Qwen3VLForConditionalGeneration._from_config(cfg, dtype=dtype, attn_implementation=attn)
    if FAST_VISION:  # gpu_check --vision per_frame: transformers' own vision attention, for before/after
        vision_attention.install(m)  # as load_model does: batched vision attention, linear patch embedding
    return m


def _overview(proc, video: Path, k: int = 64):
    """(prompt ids, images) of the recipe's first turn: K timestamped frames, the question, the tools."""
    from paravt.agent.episode import EpisodeConfig, EpisodeSample, build_overview
    from paravt.data.tool_specs import CROP_VIDEO_SCHEMA

    ov = build_overview(EpisodeSample("gpu_check", "What happens in the video?", str(video), 120.0), k,
                        EpisodeConfig(), proc, [CROP_VIDEO_SCHEMA])
    return list(ov.prompt_ids), ov.images


def _dist():
    from paravt.models import parallel

    return parallel.init_distributed()


def _text_flops_per_token(cfg, seq: int) -> float:
    t = cfg.text_config if hasattr(cfg, "text_config") else cfg
    h, L, inter, v = t.hidden_size, t.num_hidden_layers, t.intermediate_size, t.vocab_size
    q = t.num_attention_heads * t.head_dim
    kv = t.num_key_value_heads * t.head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * inter
    return 6 * (L * per_layer + h * v) + 6 * L * h * seq


def engine_copy(master):
    """The numerics gate's engine: a bf16 copy of the fp32 master with the rotary frequencies kept fp32,
    as a real engine loads them (a plain ``.to(bf16)`` would round the rotary angles too)."""
    import torch

    from paravt.models.loading import cast_keeping_rotary_fp32

    return cast_keeping_rotary_fp32(copy.deepcopy(master), torch.bfloat16)


# ---------------------------------------------------------------------------------------------- parts
def part_numerics(a, tmp: Path) -> dict:
    import torch

    from paravt.engines.base import SamplingParams
    from paravt.engines.hf import HFEngine
    from paravt.models import parallel
    from paravt.models.tokenize import vision_token_ids
    from paravt.rl.logps import forward_logps

    dev = _device()
    d = _dist()
    proc, video = _assets(tmp, a.small)
    cfg = _config(proc, a.numerics_layers, a.small)
    master = _model(cfg, dev, torch.float32, a.attn)
    engine_model = engine_copy(master)
    trainer = parallel.wrap_fsdp2(master, d, torch.bfloat16)  # mixed precision: real fully_shard even on one rank
    ids, images = _overview(proc, video)
    eng = HFEngine(engine_model, proc, seed=0)
    n_new = a.answer_tokens

    async def gen():
        return await eng.generate(ids, images, SamplingParams(temperature=a.temperature, max_new_tokens=n_new, seed=1))

    t0 = time.perf_counter()
    out = asyncio.run(gen())
    t_gen = time.perf_counter() - t0
    if out.error:
        raise RuntimeError(out.error)
    print(f"[gpu_check] numerics: {len(out.token_ids)} tokens generated after a {len(ids)}-token prompt in "
          f"{t_gen:.1f} s", flush=True)
    vision = torch.tensor(vision_token_ids(proc.tokenizer), dtype=torch.long)
    with torch.no_grad():
        logp, _ = forward_logps(trainer, ids + out.token_ids, images, proc, cfg.image_token_id, vision, a.temperature,
                                dev)
    mine = logp[len(ids) - 1: len(ids) - 1 + len(out.token_ids)].double().cpu()
    delta = mine - torch.tensor(out.logprobs, dtype=torch.float64)
    ratio = delta.exp()  # with ppo_minibatches 1: the behaviour weight w = exp(prox - behav) the loss applies
    q = torch.quantile(ratio, torch.tensor([0.001, 0.01, 0.5, 0.99, 0.999], dtype=torch.float64)).tolist()
    from paravt.rl.grpo import WeightStats

    ws = WeightStats()
    ws.add(delta, 5.0)  # the recipes' behav_imp_weight_cap
    behav_weight = {k.split("/", 1)[1]: v for k, v in ws.metrics().items()}
    return {"text_layers": cfg.text_config.num_hidden_layers, "prompt_tokens": len(ids), "attn": a.attn,
            "temperature": a.temperature,
            "answer_tokens": len(out.token_ids), "generate_s": round(t_gen, 1),
            "abs_delta_max": float(delta.abs().max()), "abs_delta_mean": float(delta.abs().mean()),
            "abs_delta_q50_q99": torch.quantile(delta.abs(), torch.tensor([0.5, 0.99], dtype=torch.float64)).tolist(),
            "ratio_std": float(ratio.std()), "ratio_q001_q01_q50_q99_q999": q,
            "ratio_outside_clip_0.2": float(((ratio - 1).abs() > 0.2).double().mean()),  # information only
            "behav_weight": behav_weight,  # what the gate reads: w's quantiles, share over the cap 5, ESS
            "what": "trainer (FSDP2 bf16 mixed, fp32 master) minus engine (bf16 generate) logprob of each sampled token"}


def _pack(cfg, proc, video, pack_tokens: int):
    """The SFT step's pack: examples of the recipe's first turn (64 frames) and a short answer, until
    ``pack_tokens``; (examples, total tokens)."""
    import torch

    from paravt.sft.data import IGNORE, Example

    ids, images = _overview(proc, video)
    g = torch.Generator().manual_seed(0)
    examples, total = [], 0
    while total < pack_tokens:
        n_ans = max(16, min(pack_tokens - total - len(ids), pack_tokens // 2 - len(ids)))
        ans = torch.randint(10, min(1000, cfg.text_config.vocab_size), (n_ans,), generator=g).tolist()
        examples.append(Example(ids + ans, [IGNORE] * len(ids) + ans, images))
        total += len(ids) + n_ans
    return examples, total


def _sft_steps(model, dev, d, make_batch, steps: int) -> float:
    """The SFT step (the project's optimizer groups, ``token_ce_sum``, clipping) ``steps`` + 1 times on
    ``make_batch()``; the median time of all but the first (a warm-up)."""
    import torch

    from paravt.models import parallel
    from paravt.sft.trainer import param_groups, token_ce_sum

    model = parallel.wrap_fsdp2(model, d, torch.bfloat16)
    opt = torch.optim.AdamW(param_groups(model, 0.01, 1.0, 1e-5), lr=1e-5, **parallel.adamw_kwargs(dev))
    times = []
    model.train()
    for i in range(steps + 1):
        batch = make_batch()
        _sync(dev)
        t0 = time.perf_counter()
        ce, n = token_ce_sum(model, batch)
        (ce / max(n, 1)).backward()
        parallel.clip_grad_norm(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(dev)
        if i:
            times.append(time.perf_counter() - t0)
    del model, opt
    return sorted(times)[len(times) // 2]


def _packed_reference_timing(cfg, proc, video, dev, d, attn: str, steps: int, pack_tokens: int) -> dict:
    """The text-only arm at equal work: transformers' Qwen3 text model at the same width and depth on the
    SFT step's own pack (the same documents, image placeholders as text tokens, positions restarting
    at each document so transformers builds the same block mask), wrapped, checkpointed, optimized and
    scored by the project's own code (FSDP2 bf16 mixed precision, ``param_groups``, ``token_ce_sum``).
    Against the SFT step it isolates what the VL model adds (vision tower, M-RoPE)."""
    import torch
    from transformers import Qwen3ForCausalLM

    from paravt.sft.data import IGNORE

    rc = _text_config(cfg, cfg.text_config.num_hidden_layers, pack_tokens)
    examples, total = _pack(cfg, proc, video, pack_tokens)
    _reset_peak(dev)
    torch.manual_seed(0)
    with torch.device(dev):
        m = Qwen3ForCausalLM._from_config(rc, dtype=torch.float32, attn_implementation=attn)
    enable_activation_checkpointing(m)
    m.config.use_cache = False
    text = 11  # a text token in place of every image placeholder
    ids = torch.tensor([[t if t != cfg.image_token_id else text for e in examples for t in e.input_ids]])
    labels = torch.tensor([[(IGNORE if i == 0 else lab) for e in examples for i, lab in enumerate(e.labels)]])
    pos = torch.cat([torch.arange(len(e)) for e in examples])[None]
    step = _sft_steps(m, dev, d, lambda: {"input_ids": ids.to(dev), "labels": labels.to(dev),
                                          "position_ids": pos.to(dev)}, steps)
    del m
    return {"text_layers": rc.num_hidden_layers, "pack_tokens": total, "examples": len(examples),
            "step_s": round(step, 4), "tokens_per_s": round(total / step, 1), "peak_gb": _peak_gb(dev),
            "flops_per_token": _text_flops_per_token(rc, total // len(examples))}


def _sft_step_timing(cfg, proc, video, dev, d, attn: str, steps: int, pack_tokens: int) -> dict:
    import torch

    from paravt.sft.data import collate_packed

    _reset_peak(dev)
    model = _model(cfg, dev, torch.float32, attn)
    enable_activation_checkpointing(model)
    model.config.use_cache = False
    rope_index = model.model.get_rope_index
    vision_params = sum(x.numel() for x in model.model.visual.parameters())
    examples, total = _pack(cfg, proc, video, pack_tokens)
    step = _sft_steps(model, dev, d, lambda: {k: v.to(dev) for k, v in collate_packed(
        examples, proc, cfg.image_token_id, rope_index).items()}, steps)
    del model
    from paravt.models.reference_shapes import vision_train_flops

    grids = [g for e in examples for g in e.images.tensors(proc)[1].tolist()]
    vf = vision_train_flops(cfg.vision_config, grids)
    patches = int(vf["patches"])
    return {"text_layers": cfg.text_config.num_hidden_layers, "pack_tokens": total, "examples": len(examples),
            "vision_params": vision_params, "vision_patches_per_step": patches,
            # per layer on the tokens it sees (mergers on a quarter of the patches, attention per frame)
            "vision_flops_per_step": vf["total"], "vision_flops_by_part": {k: v for k, v in vf.items() if k != "total"},
            "vision_flops_per_step_6np": 6.0 * vision_params * patches,  # the older count, for comparison
            "step_s": round(step, 4), "tokens_per_s": round(total / step, 1), "peak_gb": _peak_gb(dev),
            "flops_per_token": _text_flops_per_token(cfg, total // len(examples))}


def _text_config(cfg, layers: int, seq: int):
    """transformers' Qwen3 text config at the VL model's text width."""
    from transformers import Qwen3Config

    t = cfg.text_config
    return Qwen3Config(hidden_size=t.hidden_size, num_hidden_layers=layers, num_attention_heads=t.num_attention_heads,
                       num_key_value_heads=t.num_key_value_heads, head_dim=t.head_dim,
                       intermediate_size=t.intermediate_size, vocab_size=t.vocab_size,
                       max_position_embeddings=max(seq, 8192), tie_word_embeddings=False)


def _reference_timing(cfg, dev, attn: str, layers: int, seq: int, steps: int) -> dict:
    """transformers' Qwen3 text model at the same width: fp32 master weights, bf16 autocast, gradient
    checkpointing, fused AdamW, one sequence."""
    import torch
    from transformers import Qwen3ForCausalLM

    rc = _text_config(cfg, layers, seq)
    _reset_peak(dev)
    torch.manual_seed(0)
    with torch.device(dev):
        m = Qwen3ForCausalLM._from_config(rc, dtype=torch.float32, attn_implementation=attn)
    enable_activation_checkpointing(m)
    m.config.use_cache = False
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5, fused=dev.type == "cuda")
    x = torch.randint(10, min(1000, rc.vocab_size), (1, seq), device=dev)
    times = []
    m.train()
    for i in range(steps + 1):
        _sync(dev)
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = m(input_ids=x, labels=x, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(dev)
        if i:
            times.append(time.perf_counter() - t0)
    step = sorted(times)[len(times) // 2]
    res = {"text_layers": layers, "seq": seq, "step_s": round(step, 4), "tokens_per_s": round(seq / step, 1),
           "peak_gb": _peak_gb(dev), "flops_per_token": _text_flops_per_token(rc, seq)}
    del m, opt
    return res


def unit_sft(layers: int):
    def run(a, tmp: Path) -> dict:
        dev, d = _device(), _dist()
        proc, video = _assets(tmp, a.small)
        return _sft_step_timing(_config(proc, layers, a.small), proc, video, dev, d, a.attn, a.steps, a.pack_tokens)
    return run


def unit_reference(a, tmp: Path) -> dict:
    proc, _ = _assets(tmp, a.small)
    return _reference_timing(_config(proc, a.layers, a.small), _device(), a.attn, a.ref_layers, a.pack_tokens, a.steps)


def unit_reference_packed(a, tmp: Path) -> dict:
    dev, d = _device(), _dist()
    proc, video = _assets(tmp, a.small)
    return _packed_reference_timing(_config(proc, a.layers, a.small), proc, video, dev, d, a.attn, a.steps,
                                    a.pack_tokens)


def _load_like_run_rl(path: str, out: str) -> None:
    """A fresh process: load actor (fp32 master, bf16 compute) and reference (bf16) as RLTrainer does."""
    import torch

    from paravt.models import parallel

    d = parallel.init_distributed()
    dev = d.device
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    t0 = time.perf_counter()

    def prep(m):
        enable_activation_checkpointing(m)
        m.config.use_cache = False

    actor = parallel.load_fsdp2(path, d, dtype="float32", compute_dtype=torch.bfloat16, prepare=prep)
    ref = parallel.load_fsdp2(path, d, dtype="bfloat16", prepare=lambda m: m.requires_grad_(False))
    _sync(dev)
    t_load = time.perf_counter() - t0
    res = {"load_s": round(t_load, 1), "peak_gpu_gb": _peak_gb(dev),
           "host_rss_before_gb": round(before, 2),
           "host_peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}
    t0 = time.perf_counter()
    b = parallel.weight_buckets(actor, torch.bfloat16, 1 << 30, True)
    nbytes = 0
    for flat in b:
        nbytes += flat.numel()
        del flat
    _sync(dev)
    res.update({"push_bucket_production_s": round(time.perf_counter() - t0, 2), "push_gb": round(nbytes / 1e9, 2),
                "push_buckets": len(b.plan), "peak_gpu_gb_after_push": _peak_gb(dev)})
    del actor, ref
    Path(out).write_text(json.dumps(res))


def part_startup(a, tmp: Path) -> dict:
    import torch

    from paravt.models import parallel

    dev = _device()
    d = _dist()
    proc, _ = _assets(tmp, a.small)
    cfg = _config(proc, a.startup_layers, a.small)
    m = _model(cfg, dev, torch.bfloat16, a.attn)
    n_params = sum(p.numel() for p in m.parameters())
    t0 = time.perf_counter()
    ck = parallel.export_hf(m, proc, tmp / "ckpt", d, dtype=torch.bfloat16)
    t_export = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in ck.glob("*.safetensors"))
    del m
    _reset_peak(dev)
    res_file = tmp / "load.json"
    r = subprocess.run([sys.executable, __file__, "--load-like-run-rl", str(ck), str(res_file)], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)})
    if r.returncode:
        raise RuntimeError(f"loading like run_rl.sh failed: {r.stderr[-2000:]}")
    res = json.loads(res_file.read_text())
    res.update({"text_layers": a.startup_layers, "params": n_params, "export_bf16_s (disk transport, per push)":
                round(t_export, 1), "export_gb": round(size / 1e9, 2), "export_bytes": size})
    return res



if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--load-like-run-rl":
    _load_like_run_rl(sys.argv[2], sys.argv[3])
