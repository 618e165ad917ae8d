"""The 8B path on one GPU: bf16 numerics, speed and memory at Qwen3-VL-8B's width, start-up and the
weight push at 8B size. Run by ``bash scripts/gpu_check.sh`` (which also runs ``tests/gpu``); each
part writes ``OUT/<part>.json``, or says why it was skipped (no CUDA).

* ``numerics`` — the same generated tokens scored twice: by the in-process engine in bf16 (its
  logprobs from ``generate``'s raw logits) and by the trainer's ``forward_logps`` under FSDP2 mixed
  precision (fp32 master weights, bf16 compute), at the recipe's lengths (64 overview frames at the
  recipe's 50176 pixels, a 2048-token answer) and sampling temperature, on Qwen3-VL-8B's width (random
  init, reduced depth): max and mean |Δ| and the spread of the importance ratio exp(Δ) it implies.
* ``width`` — the project's SFT step (FSDP2 bf16 mixed precision, gradient checkpointing, packing,
  video frames, its optimizer) on an 8192-token pack at 8B width and ``--layers`` text layers, at two
  depths for the memory per layer; an RL train step on the recipe's 8 samples (the PPO loss through
  ``forward_logps``); and a plain reference measured in the same run: transformers' Qwen3 text model at
  that width (``--ref-layers``), one 8192-token sequence, fp32 master weights with bf16 autocast, sdpa,
  gradient checkpointing, fused AdamW. tokens/s, MFU, peak memory.
* ``startup`` — an 8B-shaped checkpoint (random init, ``--startup-layers``) saved in bf16 (the disk
  transport's export, timed), loaded the way ``run_rl.sh`` loads the actor and the reference (peak
  GPU and host memory, in a fresh process), then one push's bucket production (gather, bf16 cast,
  packing: the broadcast transport's trainer-side cost).

MFU counts, per token, 6 × the text parameters a token passes through (decoder layers and lm_head,
not the embedding table or the vision tower) + 6 × layers × hidden × sequence length (causal
attention), against the card's dense bf16 peak (``--peak-tflops``, 989 for H100/H200 SXM).

    python benchmarks/gpu_check.py --out runs/gpu_check [--parts numerics,width,startup] [--small]

Every model uses the RL recipe's attention (``--recipe``, default ``configs/rl/paragrpo_8b.yaml``,
resolved as its trainer does) and the numerics its ``grpo.temperature``; ``--attn`` and
``--temperature`` override them. The values used and their source are printed and written to each part.

``--small``: the same code at the tiny model's width on whatever device there is (the CPU dry run CI
does); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_units import part_numerics, part_startup, unit_reference, unit_reference_packed, unit_sft  # noqa: E402
from gpu_units_steps import unit_rl_step, unit_vision  # noqa: E402

PARTS = ("numerics", "width", "startup")
RECIPE = Path(__file__).resolve().parents[1] / "configs" / "rl" / "paragrpo_8b.yaml"


def compose_width(a, units: dict, peak_tflops: float) -> dict:
    """The width part from its units: MFU, GB per layer, the ratio to the reference at equal work."""
    lo = max(1, a.layers // 2)
    out = {k: units.get(k, {"error": "not run"}) for k in (f"sft_{lo}_layers", f"sft_{a.layers}_layers",
                                                          "reference", "reference_packed", "rl_step", "vision")}
    sft, ref, low = out[f"sft_{a.layers}_layers"], out["reference"], out[f"sft_{lo}_layers"]
    packed = out["reference_packed"]
    for r in (sft, ref, packed):
        if "tokens_per_s" in r:
            r["mfu"] = round(r["tokens_per_s"] * r["flops_per_token"] / (peak_tflops * 1e12), 4)
    if "tokens_per_s" in sft:
        per_step = sft["pack_tokens"] * sft["flops_per_token"] + sft["vision_flops_per_step"]
        sft["flops_per_s_with_vision"] = per_step / sft["step_s"]
        sft["mfu_with_vision"] = round(sft["flops_per_s_with_vision"] / (peak_tflops * 1e12), 4)
    if lo != a.layers and sft.get("peak_gb") is not None and low.get("peak_gb") is not None:
        out["sft_gb_per_layer"] = round((sft["peak_gb"] - low["peak_gb"]) / (a.layers - lo), 3)
    if "tokens_per_s" in sft and "tokens_per_s" in ref:
        ref_fps = ref["tokens_per_s"] * ref["flops_per_token"]
        # The reference runs the text model only; the project's step also runs the vision tower, counted
        # per layer on the tokens each layer sees (paravt.models.reference_shapes.vision_train_flops: the
        # mergers on a quarter of the patches, attention within each frame). Goal: >= 0.9 with vision counted.
        out["sft_vs_reference_tokens_per_s_at_equal_flops"] = round(sft["tokens_per_s"] * sft["flops_per_token"]
                                                                    / ref_fps, 3)
        out["sft_vs_reference_flops_per_s_with_vision"] = round(sft["flops_per_s_with_vision"] / ref_fps, 3)
    if "tokens_per_s" in sft and "tokens_per_s" in packed:
        # equal work, text only: the same pack through the same wrapper and loss, without the vision
        # tower and M-RoPE. The SFT step's vision FLOPs are excluded here (the arm has none).
        out["sft_text_vs_reference_packed_flops_per_s"] = round(
            sft["pack_tokens"] * sft["flops_per_token"] / sft["step_s"]
            / (packed["tokens_per_s"] * packed["flops_per_token"]), 3)
        out["sft_step_s_minus_reference_packed_step_s"] = round(sft["step_s"] - packed["step_s"], 4)
    return out



# ---------------------------------------------------------------------------------------------- main
# Seconds each unit may take (x --timeout-scale): ~1.4-2x what each took on one H100 80GB HBM3
# (numerics 147 s, most of it the in-process engine generating 2048 tokens; SFT 21 and 18 s, reference
# 7 s, RL step 29 s, start-up 56 s). gpu_check.sh bounds their sum at 440 s and tests/gpu at 120 s.
TIMEOUT_S = {"numerics": 210, "sft_low": 45, "sft_high": 45, "reference": 30, "reference_packed": 40, "rl_step": 60, "vision": 40,
             "startup": 100}
# Dense bf16 peak TFLOP/s by the card's name (the first match wins); None: unknown card, MFU not given.
PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("H800", 989.0),
               ("A100", 312.0), ("L40S", 362.0), ("B200", 2250.0))


def card_peak_tflops(name: str) -> float | None:
    return next((v for k, v in PEAK_TFLOPS if k in name), None)


def gpu_listed() -> bool:
    """``nvidia-smi -L`` names a GPU: then CUDA is required, and a part without it fails, never skips."""
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and any(line.startswith("GPU ") for line in r.stdout.splitlines())


def units_of(a) -> dict[str, list[tuple[str, str, object]]]:
    """part -> [(unit name, timeout key, function)]: each unit runs in its own process."""
    lo = max(1, a.layers // 2)
    sft = [(f"sft_{lo}_layers", "sft_low", unit_sft(lo))] if lo != a.layers else []
    sft.append((f"sft_{a.layers}_layers", "sft_high", unit_sft(a.layers)))
    return {"numerics": [("numerics", "numerics", part_numerics)],
            "width": sft + [("reference", "reference", unit_reference),
                            ("reference_packed", "reference_packed", unit_reference_packed), ("rl_step", "rl_step", unit_rl_step),
                            ("vision", "vision", unit_vision)],
            "startup": [("startup", "startup", part_startup)]}


def recipe_defaults(a) -> dict[str, str]:
    """Fill ``a.attn`` and ``a.temperature`` where no flag gave them, from the RL recipe ``a.recipe``: the
    attention the RL trainer resolves (``trainer.attn_implementation``, else
    ``default_attn_implementation()``: flash_attention_2 where flash-attn is installed) and the sampling
    temperature ``grpo.temperature`` (the logprob error enters the ratio scaled by 1/T). Returns where
    each value came from."""
    from paravt.core.config import load_config  # noqa: PLC0415
    from paravt.rl.config import RLConfig  # noqa: PLC0415

    src = {"attn": "--attn", "temperature": "--temperature"}
    if a.attn is None or a.temperature is None:
        cfg = load_config(RLConfig, a.recipe)
        if a.attn is None:
            from paravt.models.loading import default_attn_implementation  # noqa: PLC0415

            a.attn = cfg.trainer.attn_implementation or default_attn_implementation()
            src["attn"] = f"{a.recipe} " + (f"(trainer.attn_implementation: {cfg.trainer.attn_implementation})"
                                            if cfg.trainer.attn_implementation else
                                            "(trainer.attn_implementation null: default_attn_implementation())")
        if a.temperature is None:
            a.temperature = float(cfg.grpo.temperature)
            src["temperature"] = f"{a.recipe} (grpo.temperature)"
    return src


def run_unit(a, name: str) -> int:
    """In a fresh process: check the GPU holds nothing of an earlier unit, run one unit, write its JSON."""
    import torch

    import gpu_units

    gpu_units.FAST_VISION = a.vision == "batched"
    fn = {u: f for units in units_of(a).values() for u, _, f in units}[name]
    res: dict = {}
    t0 = time.perf_counter()
    try:
        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info(0)
            res["gpu_in_use_gb_at_start"] = round((total - free) / 2**30, 2)
            res["gpu_total_gb"] = round(total / 2**30, 2)
            if res["gpu_in_use_gb_at_start"] > a.max_gb_at_start:
                raise RuntimeError(f"{res['gpu_in_use_gb_at_start']} GiB of the GPU in use before the unit started "
                                   f"(> {a.max_gb_at_start}): another process holds it, its figures would be wrong")
        with tempfile.TemporaryDirectory() as tmp:
            res.update(fn(a, Path(tmp)))
        res["seconds"] = round(time.perf_counter() - t0, 1)
        rc = 0
    except Exception as exc:  # noqa: BLE001 - written for the parent, which reports it with the others
        res["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:1000]}"
        rc = 1
    (Path(a.out) / "units").mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "units" / f"{name}.json").write_text(json.dumps(res, indent=2))
    return rc


def verdicts(parts: dict, card_gb: float | None, margin_gb: float) -> dict:
    """Thresholds the figures must meet: bf16 numerics of the weight the loss applies (|delta logprob| p99
    <= 0.1 nats; the behaviour weight w = exp(trainer - engine): <= 0.1% of tokens above the cap of 5,
    the loss drops them, effective sample size >= 0.9) and every peak leaving ``margin_gb`` of the card.
    The share outside the PPO clip is reported, not gated: with one minibatch the PPO ratio is 1."""
    v = {}
    num = parts.get("numerics", {})
    if "abs_delta_q50_q99" in num:
        v["numerics_abs_delta_p99_le_0.1"] = num["abs_delta_q50_q99"][1] <= 0.1
    w = num.get("behav_weight") or {}
    if w:
        v["numerics_behav_weight_over_cap_le_0.1pct"] = w["behav_weight_over_cap"] <= 0.001
        v["numerics_behav_weight_ess_ge_0.9"] = w["behav_weight_ess"] >= 0.9
    if card_gb:
        peaks = {f"width.{k}": r.get("peak_gb") for k, r in parts.get("width", {}).items() if isinstance(r, dict)}
        peaks["startup"] = parts.get("startup", {}).get("peak_gpu_gb")
        for k, gb in peaks.items():
            if gb is not None:
                v[f"{k}_peak_fits_card_with_{margin_gb:g}_gb"] = gb <= card_gb - margin_gb
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/gpu_check")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {PARTS}")
    p.add_argument("--small", action="store_true", help="tiny width on any device: a dry run of the code, not a figure")
    p.add_argument("--numerics-layers", type=int, default=4)
    p.add_argument("--answer-tokens", type=int, default=2048)
    p.add_argument("--layers", type=int, default=8, help="width part: text layers at 8B width (and half of it)")
    p.add_argument("--ref-layers", type=int, default=8)
    p.add_argument("--pack-tokens", type=int, default=8192)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rl-samples", type=int, default=8)
    p.add_argument("--rl-pack-tokens", type=int, default=32768, help="RL step: samples per packed forward up to this "
                   "many tokens (0: one forward per sample)")
    p.add_argument("--vision", default="batched", choices=("batched", "per_frame"),
                   help="vision attention: the project's batched path or transformers' per-frame loop")
    p.add_argument("--startup-layers", type=int, default=36)
    p.add_argument("--recipe", default=str(RECIPE), help="RL recipe that --attn and --temperature default to")
    p.add_argument("--attn", default=None,
                   help="attention of every model (default: the recipe's, as its trainer resolves it: "
                        "flash_attention_2 where flash-attn is installed, else sdpa_varlen, SDPA per packed sequence; "
                        "sdpa = one block-masked call over the whole pack)")
    p.add_argument("--temperature", type=float, default=None,
                   help="numerics: sampling and scoring temperature (default: the recipe's grpo.temperature)")
    p.add_argument("--peak-tflops", type=float, default=None, help="the card's dense bf16 peak (default: by its name)")
    p.add_argument("--timeout-scale", type=float, default=None, help="x the per-unit timeouts (default 1; 20 with --small)")
    p.add_argument("--max-gb-at-start", type=float, default=2.0, help="GPU GiB in use before a unit that fails it")
    p.add_argument("--margin-gb", type=float, default=4.0, help="GiB every peak must leave free on the card")
    p.add_argument("--unit", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    sources = recipe_defaults(a)
    if a.unit:
        return run_unit(a, a.unit)
    import torch

    parts = [x for x in a.parts.split(",") if x]
    bad = [x for x in parts if x not in PARTS]
    if bad:
        print(f"gpu_check.py: unknown part(s) {bad}; choose from {PARTS}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    peak = a.peak_tflops or card_peak_tflops(name) or 989.0
    card_gb = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 2) if cuda else None
    scale = a.timeout_scale or (20.0 if a.small else 1.0)
    meta = {"device": name, "torch": torch.__version__, "small": a.small, "date": time.strftime("%Y-%m-%d"),
            "peak_tflops_used": peak, "peak_tflops_from": "--peak-tflops" if a.peak_tflops else
            "the card's name" if card_peak_tflops(name) else "default (card not in the table)",
            "card_gb": card_gb, "attn": a.attn, "attn_from": sources["attn"], "temperature": a.temperature,
            "temperature_from": sources["temperature"]}
    print(f"[gpu_check] attention {a.attn} (from {sources['attn']}), temperature {a.temperature:g} "
          f"(from {sources['temperature']})", flush=True)
    required = gpu_listed() and not cuda
    running: list[subprocess.Popen] = []

    def _stop(signum, _frame):  # a timeout around this script ends the unit it is running too
        for pr in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pr.pid, signal.SIGKILL)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, _stop)
    results, failed = {}, 0
    for part in parts:
        if required:
            res = {"error": "nvidia-smi lists a GPU but torch cannot use CUDA here: no figure can be measured"}
            failed += 1
        elif not cuda and not a.small:
            res = {"skipped": "needs CUDA (this machine has none); --small runs the same code at the tiny width"}
        else:
            got = {}
            for unit, key, _ in units_of(a)[part]:
                t = TIMEOUT_S[key] * scale
                f = out / "units" / f"{unit}.json"
                f.unlink(missing_ok=True)
                # its own session, so a timeout takes the unit's children (the start-up loader) with it
                proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv, "--unit", unit],
                                        start_new_session=True)
                running[:] = [proc]
                try:
                    proc.wait(timeout=t)
                    got[unit] = json.loads(f.read_text()) if f.exists() else {
                        "error": f"the unit wrote no result (exit {proc.returncode})"}
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    got[unit] = {"error": f"timed out after {t:.0f} s"}
                failed += "error" in got[unit]
                print(f"[gpu_check] {part}/{unit}: {json.dumps(got[unit])[:600]}", flush=True)
            res = compose_width(a, got, peak) if part == "width" else got[part]
        res.update(meta)
        results[part] = res
        (out / f"{part}.json").write_text(json.dumps(res, indent=2))
    v = verdicts(results, card_gb, a.margin_gb)
    (out / "verdicts.json").write_text(json.dumps(v, indent=2))
    print(f"[gpu_check] verdicts: {json.dumps(v)}", flush=True)
    return 1 if failed or not all(v.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
