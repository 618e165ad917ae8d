"""The SFT step's fast paths on the tiny model: a pack's text attention per sequence with its bounds
computed once (no host read inside a decoder layer or vision block, no (L × L) mask), logits at the
supervised positions only; the same loss and gradients as the full-logits path, less memory kept. The
equalities run on both tiny models, the 8B-structured one also in bf16 (:mod:`tests.models.tiny_cases`)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from paravt.data.schema import load_sft_rows
from paravt.models.losses import supervised_ce_sum
from paravt.models.packed_attention import packed_call, varlen_kwargs
from paravt.sft.data import IGNORE, ExampleBuilder, VideoSamplingConfig, collate_packed, collate_padded
from tests.models.tiny_cases import CASE_IDS, CASES, assert_close, case_for


class HostReads(TorchDispatchMode):
    """Host reads of tensor values (``.item()``, ``int(t)``, ``bool(t)`` dispatch ``_local_scalar_dense``;
    ``.tolist()`` is spied on) while a decoder layer or vision block runs, forward or recompute."""

    def __init__(self, model, monkeypatch):
        super().__init__()
        self.inside, self.reads = 0, []
        inner = model.model
        self.hooks = []
        for blk in list(inner.language_model.layers) + list(inner.visual.blocks):
            self.hooks.append(blk.register_forward_pre_hook(lambda *a: self._enter()))
            self.hooks.append(blk.register_forward_hook(lambda *a: self._leave()))
        real = torch.Tensor.tolist

        def tolist(t, *a, **k):
            if self.inside:
                self.reads.append("tolist")
            return real(t, *a, **k)
        monkeypatch.setattr(torch.Tensor, "tolist", tolist)

    def _enter(self):
        self.inside += 1

    def _leave(self):
        self.inside -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.inside and "_local_scalar_dense" in str(func):
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))

    def close(self):
        for h in self.hooks:
            h.remove()


@pytest.fixture(scope="module")
def examples(tiny, world):
    _, proc = tiny
    rows = load_sft_rows([world / "local" / "paravt_sft_synth.parquet"])[0]
    b = ExampleBuilder(proc, VideoSamplingConfig(), 8192)
    return [b(r) for r in rows[:4]]


@pytest.fixture(scope="module", params=CASES, ids=CASE_IDS)
def case(request, world):
    return case_for(request, *request.param, world)


def _train_model(path, dtype="float32"):
    from paravt.models.loading import enable_activation_checkpointing, load_model

    m = load_model(path, dtype=dtype).train()
    enable_activation_checkpointing(m)
    m.config.use_cache = False
    return m


@pytest.fixture()
def model(tiny_dir):
    return _train_model(tiny_dir)


def _packed(model, examples, proc):
    return collate_packed(examples, proc, model.config.image_token_id, model.model.get_rope_index)


def _full_logits_ce(model, batch):
    """The loss as computed before: every position's logits, all cast to fp32."""
    labels = batch.pop("labels")
    logits = model(**batch, use_cache=False).logits[:, :-1].float()
    target = labels[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                           ignore_index=IGNORE, reduction="sum")
    return ce, int((target != IGNORE).sum())


def test_varlen_kwargs_carry_the_bounds_once():
    pos = torch.tensor([0, 1, 2, 0, 1, 0, 1, 2, 3])
    kw = varlen_kwargs(torch.stack([pos] * 4)[:, None, :])
    assert kw["packed_bounds"] == (0, 3, 5, 9) and kw["max_length_q"] == 4
    assert kw["cu_seq_lens_q"].dtype == torch.int32 and kw["cu_seq_lens_q"].tolist() == [0, 3, 5, 9]


def test_no_host_read_inside_decoder_layers_or_vision_blocks(model, examples, tiny, monkeypatch):
    _, proc = tiny
    spy = HostReads(model, monkeypatch)
    try:
        with spy:  # the pack passed directly: the attention detects the sequences in every layer
            model(**{k: v for k, v in _packed(model, examples, proc).items() if k != "labels"}).logits.sum().backward()
        before = len(spy.reads)
        spy.reads.clear()
        with spy:  # the trainers' path: bounds once per batch, frame layout once per vision forward
            ce, _ = supervised_ce_sum(model, _packed(model, examples, proc), IGNORE)
            ce.backward()
    finally:
        spy.close()
    n_layers = model.config.text_config.num_hidden_layers
    assert before >= n_layers  # the detection is a host read per layer: the spy sees it
    assert spy.reads == []


def test_packed_call_runs_one_sdpa_per_sequence_without_a_mask(case, monkeypatch):
    model, examples, proc = _train_model(case.path, case.dtype), case.examples, case.processor
    import transformers.integrations.sdpa_attention as sdpa_mod
    import transformers.masking_utils as mu

    masks, lengths_seen = [], []
    real_mask, real_sdpa = mu.sdpa_mask, sdpa_mod.sdpa_attention_forward
    monkeypatch.setattr(mu, "sdpa_mask", lambda *a, **k: masks.append(1) or real_mask(*a, **k))

    def spy(module, query, *a, **k):
        lengths_seen.append(query.shape[2])
        return real_sdpa(module, query, *a, **k)
    monkeypatch.setattr(sdpa_mod, "sdpa_attention_forward", spy)
    batch = _packed(model, examples, proc)
    batch.pop("labels")
    with torch.no_grad():
        got = packed_call(model, **batch).logits
    assert masks == []  # no (L x L) mask built for the pack
    lengths = [len(e) for e in examples]
    assert lengths_seen == lengths * model.config.text_config.num_hidden_layers
    monkeypatch.undo()
    with torch.no_grad():
        want = model(**batch).logits  # the mask path
    assert_close(got, want, case.dtype, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_loss_and_gradients_equal_the_full_logits_path(case, layout):
    model, examples, proc = _train_model(case.path, case.dtype), case.examples, case.processor

    def batch():
        if layout == "packed":
            return _packed(model, examples, proc)
        return collate_padded(examples[:3], proc, proc.tokenizer.pad_token_id, model.config.image_token_id)

    res = []
    for fn in (_full_logits_ce, lambda m, b: supervised_ce_sum(m, b, IGNORE)):
        model.zero_grad(set_to_none=True)
        ce, n = fn(model, batch())
        ce.backward()
        res.append((float(ce.detach()), n, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}))
    (ce0, n0, g0), (ce1, n1, g1) = res
    assert n0 == n1 > 0
    assert_close(torch.tensor(ce1), torch.tensor(ce0), case.dtype, atol=0, rtol=1e-4, what="loss")
    assert g0.keys() == g1.keys() and any("visual" in k for k in g0)
    for k in g0:
        assert_close(g1[k], g0[k], case.dtype, atol=1e-6, rtol=1e-3, what=k)


def _kept_bytes(fn):
    """Bytes of the distinct storages autograd keeps for backward while ``fn`` builds the graph, plus
    the loss: what the step holds at its peak, between forward and backward."""
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def test_the_loss_keeps_less_memory_than_full_logits(model, examples, tiny):
    _, proc = tiny
    b = _packed(model, examples, proc)
    full = _kept_bytes(lambda: _full_logits_ce(model, dict(b)))
    mine = _kept_bytes(lambda: supervised_ce_sum(model, dict(b), IGNORE))
    n_pos = b["input_ids"].shape[1]
    n_sup = int((b["labels"][:, 1:] != IGNORE).sum())
    vocab = model.config.text_config.vocab_size
    # the full path keeps [L, V] logits (and their fp32 copy); this one [supervised, V]
    assert full - mine >= (n_pos - n_sup) * vocab * 4
    print(f"\nkept for backward at tiny width: {full / 2**20:.1f} MiB full logits, {mine / 2**20:.1f} MiB "
          f"supervised positions only ({n_sup} of {n_pos} positions)")
