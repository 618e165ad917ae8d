"""The in-process engine's generation of a batch of long prompts: its reserved KV cache and row-by-row prefill
(``paravt.engines.kv_cache``, ``paravt.models.packed_attention.left_padded``) and its continuation of the rows
still running once half have stopped (``HFEngine(shrink=True)``), against transformers' defaults (a
``DynamicCache`` grown by concatenation, the prefill under a (B, 1, L, L) mask, every row to the longest's end).

    python benchmarks/bench_engine_cache.py --model runs/quickstart/sft/final [--out ...]

Text-only prompts of random ids (the engine's cost past the vision tower is the same for image tokens), left
padded to the longest, sampled at temperature 1 with a seed per row, one OpenMP thread as in the quickstart's
chains. Each setting runs --repeats times alternately; the generations are compared token for token.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import random
import statistics
import sys
import time

import torch

from _util import write_result  # benchmarks/_util.py: the script's folder is on sys.path
from paravt.engines import hf
from paravt.engines.base import SamplingParams
from paravt.engines.hf import HFEngine, _Request


def requests(vocab: int, batch: int, length: int, new: int, seed: int) -> list[_Request]:
    rng = random.Random(seed)
    return [_Request([rng.randrange(50, vocab) for _ in range(length - 37 * i)], None,
                     SamplingParams(temperature=1.0, max_new_tokens=new), torch.Generator().manual_seed(i))
            for i in range(batch)]


@contextlib.contextmanager
def transformers_defaults():
    """The engine as it would be without its two changes: DynamicCache, the prefill under transformers' mask."""
    from transformers.cache_utils import DynamicCache  # noqa: PLC0415

    cache, padded = hf.ReservedCache, hf.left_padded
    hf.ReservedCache = lambda n, reserve: DynamicCache()
    hf.left_padded = lambda pads: contextlib.nullcontext()
    try:
        yield
    finally:
        hf.ReservedCache, hf.left_padded = cache, padded


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a tiny checkpoint folder (e.g. runs/quickstart/sft/final)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=3000, help="the longest prompt (a K = 64 overview is ~3,700)")
    ap.add_argument("--new-tokens", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/engine_cache.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    eng = HFEngine.from_pretrained(args.model)
    vocab = eng.model.config.get_text_config().vocab_size
    eng._run_batch(requests(vocab, 2, 64, 8, 1))  # warm-up
    times: dict[str, list[float]] = {"engine": [], "engine_without_shrink": [], "transformers_defaults": []}
    outs: dict[str, list] = {}
    for _ in range(args.repeats):
        for name in times:
            reqs = requests(vocab, args.batch, args.length, args.new_tokens, 0)
            eng.shrink = name == "engine"
            with transformers_defaults() if name == "transformers_defaults" else contextlib.nullcontext():
                t = time.perf_counter()
                res = eng._run_batch(reqs)
                times[name].append(time.perf_counter() - t)
            outs[name] = [(o.token_ids, o.logprobs) for o in res]
    same_tokens = [a[0] == b[0] for a, b in zip(outs["engine"], outs["transformers_defaults"])]
    max_lp = max((abs(x - y) for a, b in zip(outs["engine"], outs["transformers_defaults"]) if a[0] == b[0]
                  for x, y in zip(a[1], b[1])), default=0.0)
    lengths = sorted(len(t) for t, _ in outs["engine"])
    res = {"machine": platform.machine(), "torch": torch.__version__, "threads": 1, "batch": args.batch,
           "longest_prompt": args.length, "new_tokens_max": args.new_tokens,
           "generated_tokens": sum(lengths), "row_lengths": lengths,
           "seconds": {k: [round(x, 2) for x in v] for k, v in times.items()},
           "median_s": {k: round(statistics.median(v), 2) for k, v in times.items()},
           "rows_with_the_same_tokens": f"{sum(same_tokens)}/{len(same_tokens)}",
           "max_logprob_difference_same_rows": max_lp}
    return write_result(args.out, res)


if __name__ == "__main__":
    sys.exit(main())
