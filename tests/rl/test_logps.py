"""The trainer's log-probabilities: the same values and gradients as a plain log-softmax, with one fp32
copy of the logits kept for backward (the RL step's memory at 8B width rests on it)."""

from __future__ import annotations

import torch

from paravt.rl.logps import entropy, forward_logps


class _Head(torch.nn.Module):
    """A model whose logits are a linear map of an embedding: enough to run forward_logps's path."""

    def __init__(self, vocab: int, dim: int = 16, dtype=torch.float32):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Parameter(torch.randn(vocab, dim, generator=g, dtype=dtype))
        self.out = torch.nn.Parameter(torch.randn(dim, vocab, generator=g, dtype=dtype) * 2)

    def forward(self, input_ids, logits_to_keep=None, **_):
        h = self.emb[input_ids]
        if logits_to_keep is not None:  # transformers' slice before lm_head: a 1-D tensor of positions
            h = h[:, logits_to_keep]
        return type("O", (), {"logits": h @ self.out})()


def _plain(model, ids, vision, temp):
    x = torch.tensor([ids])
    logits = model(x).logits[0, :-1].float() / temp
    logits = logits.index_fill(1, vision, float("-inf"))
    lp_all = torch.log_softmax(logits, -1)
    target = x[0, 1:]
    lp = lp_all.gather(1, target[:, None]).squeeze(1)
    lp = torch.where(torch.isin(target, vision), torch.zeros_like(lp), lp)
    p = lp_all.exp()
    return lp, -torch.where(p > 0, p * lp_all, torch.zeros_like(p)).sum(-1)


def test_values_and_gradients_equal_a_plain_log_softmax():
    vocab, vision = 300, torch.tensor([7, 8])
    ids = torch.randint(10, vocab, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    ids[5] = 7  # an image placeholder in the context: its predicting position gets log p = 0
    m1, m2 = _Head(vocab), _Head(vocab)
    lp, ent = forward_logps(m1, ids, None, None, 7, vision, 0.7, torch.device("cpu"))
    ref_lp, ref_ent = _plain(m2, ids, vision, 0.7)
    assert torch.allclose(lp, ref_lp, atol=1e-5) and torch.allclose(ent, ref_ent, atol=1e-5)
    assert lp[4] == 0 and torch.isfinite(lp).all() and not ent.requires_grad
    w = torch.linspace(-1, 1, lp.numel())
    (lp * w).sum().backward()
    (ref_lp * w).sum().backward()
    for a, b in ((m1.emb, m2.emb), (m1.out, m2.out)):
        assert torch.allclose(a.grad, b.grad, atol=1e-4)


def test_backward_keeps_one_fp32_copy_of_the_logits():
    """Bytes autograd saves beyond the model's own tensors, counted with saved-tensor hooks, for bf16
    logits: the plain log-softmax + exp path keeps >= 2 fp32 copies, this one ~1."""
    vocab, n, vision = 4096, 64, torch.tensor([7])
    ids = list(range(10, 10 + n))

    def saved_bytes(fn):
        model = _Head(vocab, dtype=torch.bfloat16)
        params = {p.data_ptr() for p in model.parameters()}
        seen = {}

        def pack(t):
            if t.data_ptr() not in params and t.numel() > vocab:  # [T, V]-sized tensors only
                seen[t.data_ptr()] = t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(model)
        return sum(seen.values())

    logits_fp32 = (n - 1) * vocab * 4
    mine = saved_bytes(lambda m: forward_logps(m, ids, None, None, 7, vision, 1.0, torch.device("cpu")))
    plain = saved_bytes(lambda m: _plain(m, ids, vision, 1.0))
    assert mine <= 1.2 * logits_fp32 < 2 * logits_fp32 <= plain


def test_entropy_in_chunks_equals_one_pass():
    x = torch.randn(50, 30, generator=torch.Generator().manual_seed(2))
    x[:, 3] = float("-inf")
    lse = torch.logsumexp(x, -1)
    one = entropy(x, lse, chunk=1000)
    assert torch.allclose(entropy(x, lse, chunk=7), one) and torch.isfinite(one).all()


def test_positions_give_the_same_logps_and_gradients_there_and_zero_elsewhere():
    """Logits only at the policy tokens (the RL loss's positions): equal values and gradients there."""
    vocab, vision = 300, torch.tensor([7, 8])
    ids = torch.randint(10, vocab, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    pos = list(range(20, 39))
    m1, m2 = _Head(vocab), _Head(vocab)
    lp, ent = forward_logps(m1, ids, None, None, 7, vision, 0.7, torch.device("cpu"), positions=pos)
    ref_lp, ref_ent = forward_logps(m2, ids, None, None, 7, vision, 0.7, torch.device("cpu"))
    sel = torch.zeros(39, dtype=torch.bool)
    sel[pos] = True
    assert torch.allclose(lp[sel], ref_lp[sel], atol=1e-6) and torch.allclose(ent[sel], ref_ent[sel], atol=1e-6)
    assert (lp[~sel] == 0).all() and (ent[~sel] == 0).all()
    w = torch.linspace(-1, 1, lp.numel()) * sel
    (lp * w).sum().backward()
    (ref_lp * w).sum().backward()
    for a, b in ((m1.emb, m2.emb), (m1.out, m2.out)):
        assert torch.allclose(a.grad, b.grad, atol=1e-5)
    none_lp, none_ent = forward_logps(_Head(vocab), ids, None, None, 7, vision, 0.7, torch.device("cpu"), positions=[],
                                      with_entropy=False)
    assert none_ent is None and (none_lp == 0).all()


def test_positions_keep_logits_for_those_positions_only():
    vocab, n, vision = 4096, 64, torch.tensor([7])
    ids = list(range(10, 10 + n))
    pos = list(range(48, n - 1))  # a response of 15 tokens after a 48-token prompt

    def saved(fn):
        model = _Head(vocab, dtype=torch.bfloat16)
        params = {p.data_ptr() for p in model.parameters()}
        seen = {}

        def pack(t):
            if t.data_ptr() not in params and t.numel() >= vocab:
                seen[t.data_ptr()] = t.numel() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(model)
        return sum(seen.values())

    every = saved(lambda m: forward_logps(m, ids, None, None, 7, vision, 1.0, torch.device("cpu")))
    some = saved(lambda m: forward_logps(m, ids, None, None, 7, vision, 1.0, torch.device("cpu"), positions=pos))
    assert some <= 1.2 * len(pos) * vocab * 4 < every
