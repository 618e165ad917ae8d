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


def test_reward_clip_before_normalisation():
    from paravt.rl.grpo import shape_rewards
    r = torch.tensor([3.0, 0.0, -5.0])
    assert shape_rewards(r, -0.2, 10.0, 20.0).tolist() == pytest.approx([20.0, -2.0, -20.0])
    assert shape_rewards(r, -0.2, 10.0, None).tolist() == pytest.approx([28.0, -2.0, -52.0])


def test_k1_reward_return_to_go_and_token_normalisation():
    """The release's KL: a per-token reward -beta*(behav - ref) on policy tokens; each token's
    advantage adds the sum of those rewards from it to the end (gamma = lambda = 1)."""
    from paravt.rl.grpo import k1_kl_rewards, masked_moments, normalize_with, token_advantages
    mask = torch.tensor([0, 1, 1, 0, 1.0])  # a tool response (0) between two policy spans
    behav = torch.tensor([0.0, -1.0, -2.0, 0.0, -0.5], dtype=torch.float64)
    ref = torch.tensor([0.0, -1.5, -1.0, -9.0, -0.5], dtype=torch.float64)
    klr = k1_kl_rewards(behav, ref, mask, 0.1)
    assert klr.tolist() == pytest.approx([0.0, -0.05, 0.1, 0.0, 0.0])
    adv = token_advantages(2.0, mask, klr)
    assert adv.tolist() == pytest.approx([0.0, 2.05, 2.1, 0.0, 2.0])
    assert token_advantages(2.0, mask).tolist() == pytest.approx([0, 2.0, 2.0, 0, 2.0])
    other = token_advantages(-1.0, torch.ones(2))
    tot, sq, n = masked_moments([adv, other], [mask, torch.ones(2)])
    assert n == 5
    normed = [normalize_with(a, m, tot, sq, n) for a, m in ((adv, mask), (other, torch.ones(2)))]
    vals = torch.cat([normed[0][mask.bool()], normed[1]])
    assert float(vals.mean()) == pytest.approx(0.0, abs=1e-9)
    assert float(vals.std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)
    assert normed[0][0] == 0 and normed[0][3] == 0  # masked positions stay 0
    # token-level normalisation weighs sequences by length: a long sequence moves the mean
    long_ = token_advantages(1.0, torch.ones(8))
    t2 = masked_moments([long_, token_advantages(-1.0, torch.ones(2))], [torch.ones(8), torch.ones(2)])
    assert t2[0] / t2[2] == pytest.approx(0.6)
