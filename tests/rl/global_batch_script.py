"""Run under ``torchrun --nproc_per_node=N`` by test_global_batch.py (gloo on CPU): one RL step of the
tiny model on a fixed global batch, in each of the test's cases.

argv: tiny model dir, synthetic world dir, output file. Every rank builds the same five samples (two
prompt groups of two rollouts, one with a tool turn and a crop, and a sub-agent sample; lengths differ,
so the token-balanced split gives the ranks uneven counts) and, for the GTR case, two SFT samples, then
calls ``RLTrainer.train_on`` on the whole lists. The optimizer is plain SGD (Adam's first step divides
out the gradient's scale, so it would hide a wrong normalisation) and there is no clipping. Rank 0 writes
each case's weight change, metrics and every rank's forward count; ``agree``: every rank ends with the
same weights."""

import sys

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image

from paravt.core.config import load_config
from paravt.models import parallel
from paravt.models.tokenize import encode_text
from paravt.rl.config import RLConfig
from paravt.rl.rollout import Sample
from paravt.rl.trainer import RLTrainer

PAD = "<|vision_start|><|image_pad|><|vision_end|>"
BASE = ["grpo.prompts_per_step=2", "grpo.n_samples=2", "optim.grad_clip=1e9", "logging.wandb_project=null",
        "logging.progress=false"]
CASES = {  # name: (recipe, overrides)
    "k1_token": ("configs/rl/tiny.yaml", ["grpo.kl_mode=reward_k1", "grpo.adv_norm_level=token", "grpo.kl_coef=0.05"]),
    "mb2_unpacked": ("configs/rl/tiny.yaml", ["grpo.ppo_minibatches=2", "trainer.pack_tokens=0", "grpo.kl_coef=0.05"]),
    "gtr_none": ("configs/rl/tiny_gtr.yaml", ["trainer.strategy=none", "grpo.kl_coef=0", "gtr.sft_weight=0.7",
                                              "gtr.think_weight=0.5"]),
    "seq_mean_mb2": ("configs/rl/tiny.yaml", ["grpo.loss_agg=seq-mean-token-mean", "grpo.ppo_minibatches=2",
                                              "grpo.kl_coef=0.05"]),
    "seq_sum": ("configs/rl/tiny.yaml", ["grpo.loss_agg=seq-mean-token-sum", "grpo.loss_agg_norm=16",
                                         "grpo.kl_coef=0.05"]),
}


def _images(seed: int, n: int) -> list:
    r = np.random.default_rng(seed)
    return [Image.fromarray(r.integers(0, 255, (64, 64, 3), dtype=np.uint8)) for _ in range(n)]


def _turn(proc, text: str, images, n_answer: int, g: torch.Generator, behav: float):
    """(ids, loss mask, behaviour logprobs) of a user turn with ``images`` and an answer of random tokens."""
    ids, imgs = encode_text(proc, f"<|im_start|>user\n{text}{PAD * len(images)}<|im_end|>\n<|im_start|>assistant\n",
                            images)
    answer = torch.randint(10, 300, (n_answer,), generator=g).tolist()
    lp = (behav + torch.randn(n_answer, generator=g)).tolist()
    lp[0] = -12.0  # a behaviour weight far over the cap: dropped from the loss
    return ids + answer, [0] * len(ids) + [1] * n_answer, [0.0] * len(ids) + lp, imgs


def samples(proc) -> tuple[list[Sample], list[Sample]]:
    g = torch.Generator().manual_seed(0)
    ov_a, ov_b, crop = _images(1, 2), _images(2, 2), _images(3, 1)
    out = []
    for ov, n, adv in ((ov_a, 9, 0.7), (ov_a, 14, -0.7), (ov_b, 6, 1.1), (ov_b, 12, -1.1)):
        ids, mask, lp, imgs = _turn(proc, "what happens? ", ov, n, g, -7.0)
        think = [0] * (len(ids) - n) + [1] * 4 + [0] * (n - 4)  # the answer's first 4 tokens: its thought
        if n == 12:  # a tool turn: the crop's response, then a second answer
            ids2, mask2, lp2, imgs2 = _turn(proc, "<tool_response>", crop, 7, g, -7.5)
            ids, mask, lp, imgs, think = ids + ids2, mask + mask2, lp + lp2, imgs + imgs2, think + [0] * len(ids2)
        out.append(Sample(ids, mask, lp, imgs, adv, think_mask=think))
    ids, mask, lp, imgs = _turn(proc, "describe the crop ", crop, 8, g, -7.2)
    out.append(Sample(ids, mask, lp, imgs, -0.7, "subagent"))
    sft = []
    for ov, n in ((ov_a, 3), (ov_b, 5)):
        ids, mask, lp, imgs = _turn(proc, "what happens? ", ov, n, g, 0.0)
        sft.append(Sample(ids, mask, [0.0] * len(ids), imgs, 0.0, "sft"))
    return out, sft


def main():
    tiny, world, out = sys.argv[1:4]
    results = {}
    for name, (recipe, over) in CASES.items():
        cfg = load_config(RLConfig, recipe, [f"model_path={tiny}", f"output_dir={out}.runs/{name}",
                                             f"train_data=[{world}/local/paravt_rl_synth.parquet]", *BASE, *over])
        tr = RLTrainer(cfg)
        tr.optimizer = torch.optim.SGD([p for p in tr.actor.parameters() if p.requires_grad], lr=0.5)
        before = {k: v.clone() for k, v in parallel.iter_full_params(tr.actor)}
        calls = []
        hook = tr.actor.register_forward_hook(lambda *a: calls.append(1))
        rl, sft = samples(tr.processor)
        m = tr.train_on(rl, sft if name == "gtr_none" else [])
        hook.remove()
        after = dict(parallel.iter_full_params(tr.actor))
        flat = torch.cat([v.reshape(-1) for v in after.values()]).double()
        lo, hi = flat.clone(), flat.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        counts = [None] * dist.get_world_size()
        dist.all_gather_object(counts, len(calls))
        results[name] = {"delta": {k: after[k] - before[k] for k in after}, "metrics": m, "forwards": counts,
                         "agree": bool(torch.equal(lo, hi))}
    if dist.get_rank() == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
