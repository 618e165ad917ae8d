"""SFT packing efficiency and throughput, packed vs padded, tiny model on the synthetic world; the
attention of a pack (the tiny recipe's ``sdpa`` over the whole row with its block mask, against
``sdpa_varlen``, one SDPA call per sequence); and the cost of FSDP2's hooks on one fp32 rank
(``wrap_fsdp2(..., shard_one_rank=True)``), which the trainers skip.

    python benchmarks/bench_sft_packing.py [--steps 20] [--out benchmarks/results/sft_packing.json]
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path

from _util import write_result  # benchmarks/_util.py: the script's folder is on sys.path
from paravt.core.config import load_config
from paravt.data.materialize import materialize
from paravt.data.synthetic.world import WorldConfig
from paravt.data.synthetic.writer import build_world
from paravt.models import parallel
from paravt.models.tiny import build_tiny
from paravt.sft.config import SFTConfig
from paravt.sft.trainer import SFTTrainer


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results/sft_packing.json")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp())
    build_tiny(tmp / "tiny")
    build_world(tmp / "world", WorldConfig(n_train_videos=30, n_eval_videos=1), progress=False)
    materialize(tmp / "world/media", tmp / "world/parquet", tmp / "world/local")
    res = {}
    packed = ["packing=true", "max_length=2048", "per_device_batch_size=1"]
    plain_wrap = parallel.wrap_fsdp2
    for name, over, shard in (("packed (max_length 2048)", packed, False),
                              ("packed, sdpa_varlen (one SDPA call per sequence)", [*packed, "attn_implementation=sdpa_varlen"],
                               False),
                              ("padded (4 rows)", ["packing=false", "max_length=2048", "global_batch_size=4", "per_device_batch_size=4"], False),
                              ("packed, FSDP2 hooks on one rank", packed, True)):
        parallel.wrap_fsdp2 = functools.partial(plain_wrap, shard_one_rank=True) if shard else plain_wrap
        cfg = load_config(SFTConfig, "configs/sft/tiny.yaml", [
            f"model_path={tmp / 'tiny'}", f"output_dir={tmp / name.split()[0]}{int(shard)}",
            f"data.0.path={tmp}/world/local/paravt_sft_synth.parquet", f"max_steps={a.steps}",
            f"save_every={a.steps}", "logging.wandb_project=null", "logging.progress=false", *over])
        tr = SFTTrainer(cfg)
        ms = [tr.train_step() for _ in range(a.steps)]
        ms = ms[2:]  # warm-up
        real = sum(m["real_tokens"] for m in ms)
        secs = sum(m["step_seconds"] for m in ms)
        batch_tokens = sum(m["real_tokens"] / max(1e-9, 1 - m["padding_fraction"]) for m in ms)
        res[name] = {"real_token_fraction": real / batch_tokens, "real_tokens_per_s": real / secs,
                     "real_tokens_per_step": real / len(ms), "seconds_per_step": secs / len(ms)}
    parallel.wrap_fsdp2 = plain_wrap
    return write_result(a.out, res)


if __name__ == "__main__":
    sys.exit(main())
