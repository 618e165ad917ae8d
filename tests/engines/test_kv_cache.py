"""The engine's reserved KV cache: the same keys, values and generations as transformers' DynamicCache, without
a copy of the cache per decoded token."""

import asyncio

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from paravt.core.prompts import THINK_PREFIX, build_messages
from paravt.core.video import sample_overview
from paravt.data.schema import load_rl_rows
from paravt.data.tool_specs import DATA_TOOL_SCHEMAS
from paravt.engines import hf
from paravt.engines.base import SamplingParams
from paravt.engines.hf import HFEngine
from paravt.engines.kv_cache import CHUNK, ReservedCache, ReservedLayer
from paravt.models.tokenize import encode_prompt


def _states(gen, b, q):
    return torch.randn(b, 2, q, 8, generator=gen), torch.randn(b, 2, q, 8, generator=gen)


def _update_both(ours, ref, gen, b, q):
    """The same new states into both layers; what each holds must be equal. Ours's keys."""
    k, v = _states(gen, b, q)
    ko, vo = ours.update(k, v)
    kr, vr = ref.update(k, v)
    assert torch.equal(ko, kr) and torch.equal(vo, vr)
    return ko


def test_a_reserved_layer_holds_what_concatenation_holds_in_one_buffer():
    gen = torch.Generator().manual_seed(0)
    ours, ref = ReservedLayer(reserve=5), DynamicLayer()
    ptrs = set()
    for q in (7, 1, 1, 1, 1, 1):  # a prefill, then five decode steps: exactly the room reserved
        ptrs.add(_update_both(ours, ref, gen, 3, q).untyped_storage().data_ptr())
    assert len(ptrs) == 1 and ours.capacity == 12 and ours.get_seq_length() == 12  # never copied into new room
    _update_both(ours, ref, gen, 3, 1)  # past the room: CHUNK more, keeping what it holds
    assert ours.capacity == 13 + CHUNK
    big = ReservedLayer(reserve=10_000)  # a large max_new_tokens: room for CHUNK at first, not the whole budget
    big.update(*_states(gen, 2, 9))
    assert big.capacity == 9 + CHUNK


def test_keeping_some_rows_cuts_the_buffer_down_and_needs_no_new_room():
    gen = torch.Generator().manual_seed(2)
    ours, ref = ReservedLayer(reserve=8), DynamicLayer()
    for q in (5, 1):
        _update_both(ours, ref, gen, 4, q)
    keep = torch.tensor([1, 3])
    ours.batch_select_indices(keep)
    ref.batch_select_indices(keep)
    assert ours._kbuf.shape[0] == 2 and ours.capacity == 13  # the rows let go are not held any more
    ptr = ours._kbuf.untyped_storage().data_ptr()
    for _ in range(3):
        _update_both(ours, ref, gen, 2, 1)
    assert ours._kbuf.untyped_storage().data_ptr() == ptr


def test_what_transformers_does_to_a_layers_tensors_is_taken_over():
    gen = torch.Generator().manual_seed(1)
    ours, ref = ReservedLayer(reserve=4), DynamicLayer()
    for q in (6, 1):
        _update_both(ours, ref, gen, 4, q)
    for layer in (ours, ref):  # transformers' own methods, written for concatenated tensors
        layer.batch_select_indices(torch.tensor([0, 2]))
        layer.crop(-2)
    assert _update_both(ours, ref, gen, 2, 1).shape == (2, 2, 6, 8)
    ours.reset()
    k, v = _states(gen, 2, 3)
    assert torch.equal(ours.update(k, v)[0], k)


def test_the_engine_generates_the_same_tokens_and_logprobs_as_with_a_dynamic_cache(tiny, world, monkeypatch):
    """A left-padded batch of three video prompts, sampled (each row its own seed) and greedy: tokens and logprobs
    equal bit for bit to the same engine on transformers' DynamicCache."""
    model, proc = tiny
    rows, _ = load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])
    prompts = [encode_prompt(proc, build_messages(mode, r.question, sample_overview(r.video, k), "v.mp4", 60.0,
                                                  tool_schemas=DATA_TOOL_SCHEMAS), THINK_PREFIX)
               for r, k, mode in [(rows[0], 4, "agentic_minimal"), (rows[1], 8, "agentic_general"),
                                  (rows[2], 2, "direct")]]
    params = [SamplingParams(temperature=1.0, max_new_tokens=40, seed=7), SamplingParams(temperature=0, max_new_tokens=24),
              SamplingParams(temperature=0.7, max_new_tokens=40, seed=3)]

    def run():
        engine = HFEngine(model, proc, batch_wait_s=0.05)

        async def batch():
            return await asyncio.gather(*[engine.generate(ids, imgs, p) for (ids, imgs), p in zip(prompts, params)])
        outs = asyncio.run(batch())
        assert engine.stats["batch_sizes"] == [3]
        return [(o.token_ids, o.logprobs, o.finish_reason) for o in outs]

    made = []
    monkeypatch.setattr(hf, "ReservedCache", lambda n, reserve: made.append(ReservedCache(n, reserve)) or made[-1])
    reserved = run()
    assert made and all(layer.capacity > 0 for layer in made[0].layers)
    monkeypatch.setattr(hf, "ReservedCache", lambda n, reserve: DynamicCache())
    assert run() == reserved
    assert all(len(toks) > 0 for toks, _, _ in reserved)

