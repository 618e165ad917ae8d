"""The RL trainer's packed forwards: one forward for several samples, the vision tower once per distinct
image (a GRPO group's shared overview encoded once), the same log-probabilities, entropies and
gradients as one forward per sample."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from paravt.models.tokenize import encode_text, vision_token_ids
from paravt.rl.logps import forward_logps
from paravt.rl.packing import bins, packed_logps
from paravt.rl.rollout import Sample as RLSample

PAD = "<|vision_start|><|image_pad|><|vision_end|>"


def _image(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (64, 64, 3), dtype=np.uint8))


def _sample(proc, overview, crops, seed):
    g = torch.Generator().manual_seed(seed)
    prompt, imgs = encode_text(proc, "<|im_start|>user\n" + "".join(f"<{i}s>{PAD}" for i in range(len(overview)))
                               + " what happens?<|im_end|>\n<|im_start|>assistant\n", overview)
    a1 = torch.randint(10, 300, (int(torch.randint(5, 12, (1,), generator=g)),), generator=g).tolist()
    ids, mask = prompt + a1, [0] * len(prompt) + [1] * len(a1)
    if crops:
        tool, cimgs = encode_text(proc, "<|im_start|>user\n<tool_response>" + PAD * len(crops)
                                  + "</tool_response><|im_end|>\n<|im_start|>assistant\n", crops)
        a2 = torch.randint(10, 300, (7,), generator=g).tolist()
        ids, mask = ids + tool + a2, mask + [0] * len(tool) + [1] * len(a2)
        imgs = imgs + cimgs
    return RLSample(ids, mask, [-1.0] * len(ids), imgs, 0.5)


@pytest.fixture(scope="module")
def group(tiny):
    _, proc = tiny
    ov_a, ov_b = [_image(i) for i in range(4)], [_image(10 + i) for i in range(4)]
    return [_sample(proc, ov_a, [_image(100)], 1), _sample(proc, ov_a, [], 2),
            _sample(proc, ov_a, [_image(101), _image(102)], 3), _sample(proc, ov_b, [_image(100)], 4)]


def _positions(s):
    return [t for t, m in enumerate(s.loss_mask[1:]) if m]


def test_bins_keep_order_and_the_budget():
    class S:
        def __init__(self, n):
            self.input_ids = [0] * n
    got = bins([S(5), S(4), S(3), S(9), S(1)], 10)
    assert [[len(s.input_ids) for s in b] for b in got] == [[5, 4], [3], [9, 1]]
    assert [[len(s.input_ids) for s in b] for b in bins([S(12), S(2)], 10)] == [[12], [2]]


def test_packed_logps_equal_one_forward_per_sample(tiny_dir, tiny, group):
    from paravt.models.loading import load_model

    _, proc = tiny
    model = load_model(tiny_dir).train()
    vision = torch.tensor(vision_token_ids(proc.tokenizer))
    itid, dev = model.config.image_token_id, torch.device("cpu")
    patches = []
    hook = model.model.visual.register_forward_hook(lambda m, a, o: patches.append(a[0].shape[0]))

    def grads():
        g = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return g

    w = [torch.linspace(-1, 1, len(s.input_ids) - 1) for s in group]
    one = [forward_logps(model, s.input_ids, s.images, proc, itid, vision, 0.7, dev, positions=_positions(s))
           for s in group]
    sum((lp * wi).sum() for (lp, _), wi in zip(one, w)).backward()
    g_one, per_sample_patches = grads(), sum(patches)
    patches.clear()
    packed = packed_logps(model, group, proc, itid, vision, 0.7, dev, [_positions(s) for s in group], with_entropy=True)
    sum((lp * wi).sum() for (lp, _), wi in zip(packed, w)).backward()
    g_packed = grads()
    hook.remove()
    for (lp1, e1), (lp2, e2), s in zip(one, packed, group):
        m = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
        assert lp2.shape == lp1.shape and (lp2[~m] == 0).all()
        assert torch.allclose(lp1, lp2, atol=2e-5, rtol=1e-4) and torch.allclose(e1, e2, atol=2e-5, rtol=1e-4)
    for n in g_one:
        assert torch.allclose(g_one[n], g_packed[n], atol=1e-5, rtol=1e-3), n
    # one tower forward; each distinct image once: overviews a and b (4 + 4 frames), crops 100, 101, 102
    per_image = group[0].images.tensors(proc)[1][0].prod().item()
    assert patches == [11 * per_image] and per_sample_patches == sum(len(s.images) for s in group) * per_image


@pytest.mark.parametrize("kl_mode", ["reward_k1", "loss_k3"])
def test_train_on_packed_equals_one_forward_per_sample(world, tiny_dir, tmp_path, group, kl_mode):
    """The trainer's step with packs (the default) and with one forward per sample: the same metrics and
    the same gradients, the reference's forwards packed too."""
    from paravt.core.config import load_config
    from paravt.rl.config import RLConfig
    from paravt.rl.trainer import RLTrainer

    res = []
    for pack in (0, 32768):
        cfg = load_config(RLConfig, "configs/rl/tiny.yaml", [
            f"model_path={tiny_dir}", f"output_dir={tmp_path}/{pack}", f"train_data=[{world}/local/paravt_rl_synth.parquet]",
            "trainer.strategy=none", "grpo.kl_coef=0.05", f"grpo.kl_mode={kl_mode}", "optim.grad_clip=1e9",
            f"trainer.pack_tokens={pack}", "logging.wandb_project=null", "logging.progress=false"])
        tr = RLTrainer(cfg)
        grads = {}
        tr.optimizer.step = lambda: grads.update({n: p.grad.clone() for n, p in tr.actor.named_parameters()
                                                  if p.grad is not None})
        calls = []
        hook = tr.actor.register_forward_hook(lambda *a: calls.append(1))
        m = tr.train_on(list(group))
        hook.remove()
        res.append((m, grads, len(calls)))
    (m0, g0, c0), (m1, g1, c1) = res
    assert c0 == len(group) and c1 == 1  # one actor forward for the rank's four samples
    for k in ("ppo/loss", "ppo/kl", "ppo/kl_reward", "ppo/entropy", "rollout/logprob_gap", "ppo/clip_ratio",
              "rollout_corr/behav_weight_mean", "rollout_corr/behav_weight_ess"):
        assert m1[k] == pytest.approx(m0[k], rel=1e-4, abs=1e-6), k
    assert g0.keys() == g1.keys() and any("visual" in k for k in g0)
    for n in g0:
        assert torch.allclose(g0[n], g1[n], atol=1e-6, rtol=1e-3), n
