import subprocess
import sys

import pytest
import torch

from paravt.rl.gating import choose_k
from paravt.rl.grpo import batch_normalize, compute_advantages, group_normalize, ppo_token_loss, shape_rewards


def test_shaping_and_group_normalisation_by_hand():
    r = torch.tensor([1.2, 0.2, 2.2, 0.2, 0.7, 0.7])
    s = shape_rewards(r)  # (r - 0.2) * 10
    assert s.tolist() == pytest.approx([10.0, 0.0, 20.0, 0.0, 5.0, 5.0])
    adv, zero = group_normalize(s, [0, 0, 0, 1, 1, 1])
    # group 0: mean 10, population std sqrt(200/3); group 1: mean 10/3, std sqrt(50/9)
    sd0, sd1 = (200 / 3) ** 0.5, (50 / 9) ** 0.5
    assert adv.tolist() == pytest.approx([0.0, -10 / sd0, 10 / sd0, -(10 / 3) / sd1, (5 / 3) / sd1, (5 / 3) / sd1], rel=1e-5)
    assert not zero.any()
    adv, zero = group_normalize(torch.tensor([3.0, 3.0, 1.0, 2.0]), [0, 0, 1, 1])
    assert adv[:2].tolist() == [0.0, 0.0] and zero.tolist() == [True, True, False, False]
    b = batch_normalize(torch.tensor([1.0, 2.0, 3.0]))
    assert b.mean().abs() < 1e-6 and b.std(unbiased=False) == pytest.approx(1.0, rel=1e-4)


def test_compute_advantages_reports_zero_std_fraction():
    adv, m = compute_advantages([1, 1, 0, 2], [0, 0, 1, 1])
    assert m["frac_reward_zero_std"] == 0.5 and adv[:2].tolist() == pytest.approx([adv[0].item()] * 2)
    assert adv[3] > adv[2]


def test_ppo_loss_on_small_tensors():
    logp = torch.tensor([-1.0, -2.0, -0.5, -0.1], requires_grad=True)
    mask = torch.tensor([1, 1, 1, 0])
    adv = torch.tensor([1.0, 1.0, -1.0, 1.0])
    # on-policy (ratio 1), behaviour == proximal: loss = -sum(A) over masked tokens
    out = ppo_token_loss(logp, logp.detach(), logp.detach(), None, adv, mask, kl_coef=0.0)
    assert out.loss_sum.item() == pytest.approx(-1.0) and out.n_tokens == 3 and out.clipped == 0
    out.loss_sum.backward()
    assert logp.grad.tolist() == pytest.approx([-1.0, -1.0, 1.0, 0.0])  # raise good tokens, lower bad, ignore masked
    # clipping: ratio e^{0.5} > 1.2 with A > 0 -> clipped surrogate (no gradient through it)
    lp = torch.tensor([-0.5], requires_grad=True)
    out = ppo_token_loss(lp, torch.tensor([-1.0]), torch.tensor([-1.0]), None, torch.tensor([2.0]), torch.tensor([1]),
                         kl_coef=0.0)
    assert out.clipped == 1 and out.loss_sum.item() == pytest.approx(-2.4)
    out.loss_sum.backward()
    assert lp.grad.item() == 0.0
    # behaviour weight exp(prox - behav): 2.0 kept and multiplies the token; e^3 > cap 5 -> dropped
    lp = torch.tensor([-1.0, -1.0], requires_grad=True)
    behav = torch.tensor([-1.0 - 0.6931472, -4.0])
    out = ppo_token_loss(lp, lp.detach(), behav, None, torch.tensor([1.0, 1.0]), torch.tensor([1, 1]), kl_coef=0.0,
                         behav_cap=5.0)
    assert out.dropped == 1 and out.n_tokens == 1 and out.loss_sum.item() == pytest.approx(-2.0, rel=1e-5)
    # k3 KL: exp(d) - d - 1 with d = ref - logp
    lp = torch.tensor([-1.0])
    out = ppo_token_loss(lp, lp, lp, torch.tensor([-1.5]), torch.tensor([0.0]), torch.tensor([1]), kl_coef=0.1)
    k3 = torch.exp(torch.tensor(-0.5)) + 0.5 - 1
    assert out.kl_sum == pytest.approx(k3.item()) and out.loss_sum.item() == pytest.approx(0.1 * k3.item())


def test_gating_is_deterministic_across_processes_and_runs():
    ids = [f"q{i}" for i in range(200)]
    ks = [choose_k(i, seed=3) for i in ids]
    assert set(ks) == {4, 8, 16, 32, 64}
    assert ks == [choose_k(i, seed=3) for i in ids]
    assert ks != [choose_k(i, seed=4) for i in ids]
    code = "from paravt.rl.gating import choose_k; print([choose_k(f'q{i}', seed=3) for i in range(200)])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONHASHSEED": "123"})
    assert other.returncode == 0 and eval(other.stdout) == ks
    assert choose_k("q1", 3, enabled=False) == 64 and choose_k("q1", 3, enabled=False, default_k=32) == 32
