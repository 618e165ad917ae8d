"""Teacher-forced: what the cold-start SFT model gives its own training rows' call-or-skip decision.

For a world built with ``--habit-sentence`` every main SFT row says "... I will check N windows ..." or
"... I will answer from them." at the same place. This scores, per overview budget K, the model's
P(" check") / (P(" check") + P(" answer")) at that token on up to ``--rows`` rows of each K, split by
what the row itself did, beside the rows' own call rate. A model that fitted its data gives about the
rows' rate; a sampled policy that departs from it while this matches points at the eval prompt instead.

    python experiments/sft_decision_probe.py RUN_DIR [--ks 4 64] [--rows 30] [--model sft_reading/final]

RUN_DIR holds ``world/local/paravt_sft_synth.parquet`` and the checkpoint ``--model`` (default
``sft/final``, the last SFT phase; an earlier phase is ``sft_<name>/final``): the RL-effects pilot's layout.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paravt.data.schema import SFTRow  # noqa: E402
from paravt.models.loading import load_model, load_processor  # noqa: E402
from paravt.sft.data import IGNORE, ExampleBuilder, VideoSamplingConfig  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--ks", type=int, nargs="+", default=[4, 64])
    p.add_argument("--rows", type=int, default=30, help="main rows per K (the first ones, in file order)")
    p.add_argument("--model", default="sft/final", help="the checkpoint, relative to RUN_DIR")
    a = p.parse_args(argv)
    d = Path(a.run_dir)
    proc = load_processor(d / a.model, 784, 50176)  # configs/sft/tiny.yaml's video pixels
    model = load_model(d / a.model, "float32").eval()
    tok = proc.tokenizer
    build = ExampleBuilder(proc, VideoSamplingConfig(fps=1.0, max_frames=64, min_pixels=784, max_pixels=50176), 1 << 16)
    check, answer, will = tok.encode(" check")[0], tok.encode(" answer")[0], tok.encode(" will")[-1]
    probs: dict[tuple[int, bool], list[float]] = collections.defaultdict(list)
    seen: collections.Counter = collections.Counter()
    for i, rec in enumerate(pq.read_table(d / "world/local/paravt_sft_synth.parquet").to_pylist()):
        k = rec["nframes"]
        if rec["kind"] != "main" or k not in a.ks or seen[k] >= a.rows:
            continue
        ex = build(SFTRow.from_record(rec, f"row {i}"))
        ids = ex.input_ids
        first = next(j for j, lab in enumerate(ex.labels) if lab != IGNORE)
        pos = next((j for j in range(first, len(ids) - 1) if ids[j] == will and ids[j + 1] in (check, answer)), None)
        if pos is None:
            print(f"row {i}: no 'I will check/answer' decision (a world built without --habit-sentence?)", file=sys.stderr)
            return 2
        seen[k] += 1
        x = torch.tensor([ids])
        kw = {"input_ids": x, "attention_mask": torch.ones_like(x),
              "mm_token_type_ids": (x == model.config.image_token_id).long(), "use_cache": False}
        if ex.images is not None and len(ex.images):
            kw["pixel_values"], kw["image_grid_thw"] = ex.images.tensors(proc)
        with torch.no_grad():
            lp = torch.log_softmax(model(**kw).logits[0, pos].float(), -1)
        pc, pa = lp[check].exp().item(), lp[answer].exp().item()
        probs[(k, ids[pos + 1] == check)].append(pc / (pc + pa))
    for k in a.ks:
        n_call, n_skip = len(probs[(k, True)]), len(probs[(k, False)])
        allp = probs[(k, True)] + probs[(k, False)]
        if not allp:
            continue
        print(f"K={k:<3d} rows {n_call + n_skip:3d}: rows' call rate {n_call / (n_call + n_skip):.3f}; model's "
              f"P(check) {sum(allp) / len(allp):.3f} (on calling rows "
              f"{sum(probs[(k, True)]) / max(1, n_call):.3f}, on skipping rows {sum(probs[(k, False)]) / max(1, n_skip):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
