"""The dry run against the GPU check's measurements (benchmarks/README.md, "Measured: one NVIDIA H100 80GB
HBM3, 2026-11-27"): the same configurations on one rank, the predicted peak (and the roofline bound
against the measured step time), and predicted / measured.

The measured figures came from the code of that date: the RL step ran one forward per sample with logits
at every position, and plain ``sdpa`` with a block mask for the SFT pack. The dry run traces today's code
(logits at the loss's positions only, attention per packed sequence) with one forward per sample for
the RL step, so a ratio below 1 is partly the code's own saving since.
"""

from __future__ import annotations

from typing import Any

from paravt.dryrun.report import GiB

# (name, stage, recipe, overrides, text layers, SFT examples [(frames, answer)], RL answer tokens,
#  measured peak GiB, measured step s)
MEASURED = [
    ("SFT step, 8 text layers, 8,520-token pack of two 64-frame examples", "sft", "configs/sft/qwen3vl_8b.yaml",
     ["global_batch_size=1"], 8, [(64, 16), (64, 16)], None, 55.6, 2.65),
    ("SFT step, 4 text layers, same pack", "sft", "configs/sft/qwen3vl_8b.yaml",
     ["global_batch_size=1"], 4, [(64, 16), (64, 16)], None, 46.7, 2.38),
    ("RL train step, 8 samples x 6,292 tokens (64 frames + 2,048-token answer), 8 layers", "rl",
     "configs/rl/paragrpo_8b.yaml",
     ["grpo.prompts_per_step=1", "grpo.n_samples=8", "grpo.kl_coef=0", "paravt.gating.nframes_gating=false",
      "hierarchical_agent.nframes=64", "trainer.pack_tokens=0"], 8, None, 2048, 69.8, 10.5),
]


def calibrate(gpu: str = "h100", layers: str = "all", seed: int = 0) -> dict[str, Any]:
    """Run each measured configuration; returns {"results": [...], "text": the printed table}."""
    from paravt.dryrun.recipe import load, run  # noqa: PLC0415

    rows = []
    for name, stage, recipe, overrides, depth, examples, answer, peak, step_s in MEASURED:
        _, cfg = load(recipe, overrides)
        res = run(stage, cfg, recipe, 1, gpu, None, None, layers if layers != "all" else "all", answer, 0, seed,
                  world=1, sft_examples=examples, text_layers=depth)
        pred = res["ranks"][0]["memory"]["peak"] / GiB
        bound = res["roofline"]["bound_s"]
        rows.append({"configuration": name, "recipe": recipe, "overrides": overrides, "text_layers": depth,
                     "measured_peak_gib": peak, "predicted_peak_gib": round(pred, 2), "ratio": round(pred / peak, 3),
                     "measured_step_s": step_s, "roofline_bound_s": round(bound, 3),
                     "bound_over_measured": round(bound / step_s, 3), "split_gib": {
                         k: round(v / GiB, 2) for k, v in res["ranks"][0]["memory"].items()},
                     "peak_where": res["ranks"][0]["peak_where"]})
    sft8, sft4 = rows[0]["predicted_peak_gib"], rows[1]["predicted_peak_gib"]
    per_layer = {"configuration": "GB per text layer (8 - 4 layers) / 4", "measured_peak_gib": 2.24,
                 "predicted_peak_gib": round((sft8 - sft4) / 4, 3), "ratio": round((sft8 - sft4) / 4 / 2.24, 3)}
    lines = ["dry run vs the GPU check (one H100 80GB, 2026-11-27), one rank, peak in GiB:",
             f"  {'configuration':<86} {'measured':>8} {'predicted':>9} {'ratio':>6}   step: bound / measured s"]
    for r in rows:
        lines.append(f"  {r['configuration']:<86} {r['measured_peak_gib']:>8.1f} {r['predicted_peak_gib']:>9.1f} "
                     f"{r['ratio']:>6.2f}   {r['roofline_bound_s']:.2f} / {r['measured_step_s']:.2f}")
    lines.append(f"  {per_layer['configuration']:<86} {2.24:>8.2f} {per_layer['predicted_peak_gib']:>9.2f} "
                 f"{per_layer['ratio']:>6.2f}")
    lines.append("  (measured: the code of that date; predicted: today's step code; see paravt/dryrun/calibrate.py)")
    return {"results": rows + [per_layer], "text": "\n".join(lines)}
