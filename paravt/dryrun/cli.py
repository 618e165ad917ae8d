"""``python -m paravt.dryrun RECIPE [key=value ...] [options]``: one training step of a recipe at its real
width on the CPU, no weights, no GPU; per rank its peak memory and where it occurs, the step's FLOPs,
kernel traffic, collectives, host syncs and a roofline bound on the named GPU. Exit 2 with one line when
a rank does not fit the GPU's memory. ``--calibrate``: the GPU check's measured configurations, the
ratio predicted / measured (:mod:`paravt.dryrun.calibrate`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

PROG = "paravt.dryrun"


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe", nargs="?", help="a recipe under configs/sft or configs/rl")
    p.add_argument("--gpus", type=int, default=8, help="SFT: the trainer GPUs (of every node); RL: the GPUs of a "
                   "node, the recipe's placement choosing the trainer ranks among them. Default 8")
    p.add_argument("--gpu", choices=("h100", "h200", "a100"), default="h100", help="the GPU the figures are for")
    p.add_argument("--gpu-memory", type=float, default=None, help="GiB a rank may use (default: the GPU's)")
    p.add_argument("--model-config", default=None, help="a config.json (or its folder); default: the published "
                   "config of the Qwen3-VL-2B/4B/8B the recipe's model_path names, else Qwen3-VL-8B's")
    p.add_argument("--layers", default="all", help="'all' (trace every text layer) or 'A,B': trace A and B text "
                   "layers and extrapolate linearly to the model's depth")
    p.add_argument("--answer-tokens", type=int, default=None, help="RL: policy tokens a sample (default "
                   "hierarchical_agent.max_new_tokens); SFT: supervised tokens an example (default 512)")
    p.add_argument("--passes", type=int, default=2, help="SFT: forward/backward passes to trace (the rest, the same "
                   "pack, scaled); 0 = all")
    p.add_argument("--seed", type=int, default=0, help="seed of the token ids drawn")
    p.add_argument("--json", default=None, help="write every figure here")
    p.add_argument("--calibrate", action="store_true", help="run the GPU check's measured configurations and print "
                   "predicted / measured")
    args, rest = p.parse_known_args(argv)
    bad = [a for a in rest if "=" not in a or a.startswith("-")]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)}")
    if not args.calibrate and not args.recipe:
        p.error("a recipe is required (or --calibrate)")
    return args, rest


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse(list(sys.argv[1:] if argv is None else argv))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import logging  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    from paravt.dryrun import report  # noqa: PLC0415
    from paravt.dryrun.recipe import load, run  # noqa: PLC0415

    if args.calibrate:
        from paravt.dryrun.calibrate import calibrate  # noqa: PLC0415

        out = calibrate(args.gpu, args.layers, args.seed)
        print(out["text"])
        if args.json:
            Path(args.json).write_text(json.dumps(out["results"], indent=2, default=str))
        return 0
    try:
        stage, cfg = load(args.recipe, overrides)
        res = run(stage, cfg, args.recipe, args.gpus, args.gpu, args.gpu_memory, args.model_config, args.layers,
                  args.answer_tokens, args.passes, args.seed)
    except (ValueError, FileNotFoundError) as exc:
        print(f"{PROG}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(report.render(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str))
    over = [r for r in res["ranks"] if not r["fits"]]
    if over:
        r = max(over, key=lambda r: r["memory"]["peak"])
        ckpt = cfg.gradient_checkpointing if stage == "sft" else cfg.trainer.gradient_checkpointing
        who = f"rank {r['ranks'][0]}" + (f" (and {report.ranks_label(r['ranks'][1:])}, the same work)"
                                         if len(r["ranks"]) > 1 else "")
        print(f"{PROG}: {args.recipe}: {who} peaks at {r['memory']['peak'] / report.GiB:.1f} GiB, over the "
              f"{res['gpu']['memory_gib']:.1f} GiB of a {res['gpu']['name']} (at {r['peak_where']}): "
              f"{report.advice(stage, cfg, r['memory'], res['world'], ckpt)}", file=sys.stderr)
        return 2
    return 0
