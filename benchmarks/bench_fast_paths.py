"""The training forwards' fast paths against the paths they replace, on the tiny Qwen3-VL (CPU or GPU):

- the vision tower on a 64-frame overview: SDPA kernels per block and forward + backward time, with
  transformers' per-frame attention and with the batched one (``paravt.models.vision_attention``);
- the SFT loss on a pack of 64-frame examples: step time and the bytes autograd keeps, every position's
  logits in fp32 against the supervised positions only (``paravt.models.losses``);
- the RL loss over 8 rollouts of one prompt: one forward per sample against one packed forward with the
  overview encoded once (``paravt.rl.packing``), step time and patches through the tower.

    python benchmarks/bench_fast_paths.py [--out benchmarks/results/fast_paths.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_units as gu  # noqa: E402


def _timed(fn, reps: int = 3) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def vision(proc, video, cfg) -> dict:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from paravt.models import vision_attention

    class Calls(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Calls.n += "scaled_dot_product" in str(func)
            return func(*args, **(kwargs or {}))

    gu.FAST_VISION = False
    model = gu._model(cfg, torch.device("cpu"), torch.float32, "sdpa_varlen").train()
    _, images = gu._overview(proc, video)
    pv, grid = images.tensors(proc)
    visual = model.model.visual

    def step():
        visual(pv, grid_thw=grid).pooler_output.square().mean().backward()

    out = {"frames": int(grid[:, 0].sum()), "blocks": len(visual.blocks)}
    for name in ("per_frame", "batched"):
        if name == "batched":
            vision_attention.install(model)
        Calls.n = 0
        with Calls(), torch.no_grad():
            visual(pv, grid_thw=grid)
        out[f"{name}_sdpa_calls_per_block"] = Calls.n / len(visual.blocks)
        out[f"{name}_fwd_bwd_s"] = round(_timed(step), 4)
    return out


def sft(proc, video, cfg) -> dict:
    import torch

    from paravt.models.losses import supervised_ce_sum
    from paravt.sft.data import IGNORE, collate_packed

    model = gu._model(cfg, torch.device("cpu"), torch.float32, "sdpa_varlen").train()
    examples, total = gu._pack(cfg, proc, video, 3000)
    batch = collate_packed(examples, proc, cfg.image_token_id, model.model.get_rope_index)

    def full(b):
        labels = b.pop("labels")
        logits = model(**b, use_cache=False).logits[:, :-1].float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                                 ignore_index=IGNORE, reduction="sum")

    def kept(fn):
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return sum(seen.values())

    sup = int((batch["labels"][:, 1:] != IGNORE).sum())
    out = {"pack_tokens": total, "supervised": sup}
    for name, fn in (("full_logits", lambda: full(dict(batch))),
                     ("supervised_only", lambda: supervised_ce_sum(model, dict(batch), IGNORE)[0])):
        out[f"{name}_step_s"] = round(_timed(lambda: fn().backward()), 4)
        out[f"{name}_kept_mib"] = round(kept(fn) / 2**20, 2)
    return out


def rl(proc, video, cfg) -> dict:
    import torch

    from paravt.models.tokenize import vision_token_ids
    from paravt.rl.logps import forward_logps
    from paravt.rl.packing import packed_logps
    from paravt.rl.rollout import Sample

    gu.FAST_VISION = True
    model = gu._model(cfg, torch.device("cpu"), torch.float32, "sdpa_varlen").train()
    ids, images = gu._overview(proc, video)
    vision_ids = torch.tensor(vision_token_ids(proc.tokenizer))
    g = torch.Generator().manual_seed(0)
    answer = 128
    group = [Sample(ids + torch.randint(10, cfg.text_config.vocab_size, (answer,), generator=g).tolist(),
                    [0] * len(ids) + [1] * answer,
                    [0.0] * (len(ids) + answer), images, 1.0) for _ in range(8)]
    pos = list(range(len(ids) - 1, len(ids) + answer - 1))
    patches = []
    model.model.visual.register_forward_hook(lambda m, a, o: patches.append(a[0].shape[0]))
    dev, itid = torch.device("cpu"), cfg.image_token_id

    def per_sample():
        for s in group:
            forward_logps(model, s.input_ids, s.images, proc, itid, vision_ids, 0.7, dev)[0][pos].sum().backward()

    def packed():
        outs = packed_logps(model, group, proc, itid, vision_ids, 0.7, dev, [pos] * len(group))
        sum(lp.sum() for lp, _ in outs).backward()

    out = {"samples": len(group), "tokens_per_sample": len(group[0].input_ids)}
    for name, fn in (("per_sample", per_sample), ("packed", packed)):
        patches.clear()
        fn()
        out[f"{name}_vision_patches"] = sum(patches)
        out[f"{name}_step_s"] = round(_timed(fn, reps=2), 3)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/fast_paths.json")
    a = p.parse_args()
    import torch

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        proc, video = gu._assets(Path(tmp), small=True)
        cfg = gu._config(proc, 4, small=True)
        from paravt.core.machine_speed import measure  # noqa: PLC0415

        speed = measure(seconds=1.0, repeats=3)  # GFLOP/s beside the timings: machines differ up to 2.2x
        res = {"device": "cpu", "threads": torch.get_num_threads(), "machine_speed_gflops": speed["machine_speed_gflops"],
               "vision": vision(proc, video, cfg), "sft": sft(proc, video, cfg), "rl": rl(proc, video, cfg)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
