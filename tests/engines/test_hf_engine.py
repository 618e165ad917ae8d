import asyncio

import pytest
import torch

from paravt.models.tokenize import encode_prompt
from paravt.core.prompts import THINK_PREFIX, build_messages
from paravt.core.video import sample_overview
from paravt.data.schema import load_rl_rows
from paravt.engines.base import SamplingParams
from paravt.engines.hf import HFEngine
from paravt.data.tool_specs import DATA_TOOL_SCHEMAS


@pytest.fixture(scope="module")
def prompt(tiny, world):
    _, proc = tiny
    rows, _ = load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])
    frames = sample_overview(rows[0].video, 4)
    return encode_prompt(proc, build_messages("agentic_minimal", rows[0].question, frames, "v.mp4", 60.0, tool_schemas=DATA_TOOL_SCHEMAS), THINK_PREFIX)


@pytest.fixture()
def engine(tiny):
    model, proc = tiny
    return HFEngine(model, proc, batch_wait_s=0.02)


def test_logprobs_match_a_forward_rescore(engine, prompt):
    ids, imgs = prompt
    out = asyncio.run(engine.generate(ids, imgs, SamplingParams(temperature=0.8, max_new_tokens=24, seed=3)))
    assert len(out.token_ids) == len(out.logprobs) > 0 and out.finish_reason in ("stop", "length")
    full = torch.tensor([ids + out.token_ids])
    pv, grid = imgs.tensors(engine.processor)
    mm = (full == engine.image_token_id).long()
    with torch.no_grad():
        logits = engine.model(input_ids=full, attention_mask=torch.ones_like(full), mm_token_type_ids=mm,
                              pixel_values=pv, image_grid_thw=grid).logits[0, len(ids) - 1:-1]
    # the distribution sampled from: vision placeholders banned (the trainer scores the same one)
    logits = logits.index_fill(1, torch.tensor(engine.banned_ids), float("-inf"))
    ref = torch.log_softmax(logits / 0.8, -1).gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(ref, torch.tensor(out.logprobs), atol=1e-4)


def test_concurrent_requests_are_batched_and_seeded(engine, prompt):
    ids, imgs = prompt

    async def go(seeds, **kw):
        return await asyncio.gather(*[engine.generate(ids, imgs, SamplingParams(temperature=1.0, max_new_tokens=16,
                                                                                seed=s, **kw)) for s in seeds])
    a = asyncio.run(go([1, 2, 3, 4]))
    assert engine.stats["batch_sizes"][-1] == 4
    b = asyncio.run(go([1, 2, 3, 4]))
    assert [o.token_ids for o in a] == [o.token_ids for o in b]  # same seeds, same tokens
    assert len({tuple(o.token_ids) for o in a}) > 1  # different seeds differ
    # a request's tokens do not depend on its batch mates (same batch size here)
    c = asyncio.run(go([1, 9, 8, 7]))
    assert c[0].token_ids == a[0].token_ids


def test_mixed_max_new_tokens_and_stop_strings(engine, prompt):
    ids, imgs = prompt

    async def go():
        return await asyncio.gather(
            engine.generate(ids, imgs, SamplingParams(temperature=0, max_new_tokens=3)),
            engine.generate(ids, imgs, SamplingParams(temperature=0, max_new_tokens=12)))
    short, long = asyncio.run(go())
    assert len(short.token_ids) == 3 and short.finish_reason == "length"
    assert long.token_ids[:3] == short.token_ids  # greedy: same prefix
    # stop string: stop right after the first token whose text contains the decoded 2nd token
    stop_text = engine.tokenizer.decode(long.token_ids[1:2])
    if stop_text.strip():
        s = asyncio.run(engine.generate(ids, imgs, SamplingParams(temperature=0, max_new_tokens=12, stop=[stop_text])))
        assert len(s.token_ids) <= 2 + 1 and s.finish_reason == "stop"


def test_a_bad_request_does_not_fail_its_batch(engine, prompt):
    ids, imgs = prompt

    async def go():
        return await asyncio.gather(engine.generate(ids, imgs, SamplingParams(temperature=0, max_new_tokens=4)),
                                    engine.generate(ids, None, SamplingParams(temperature=0, max_new_tokens=4)),
                                    engine.generate([], None, SamplingParams(max_new_tokens=4)))
    ok, no_images, empty = asyncio.run(go())
    assert ok.error is None and len(ok.token_ids) == 4
    assert no_images.finish_reason == "error" and "image tokens but no images" in no_images.error
    assert empty.finish_reason == "error" and "empty prompt" in empty.error


def test_update_weights_changes_outputs_and_version(prompt, tiny_dir, tmp_path):
    from paravt.models.tiny import build_tiny
    engine = HFEngine.from_pretrained(tiny_dir)  # its own copy: the session model stays untouched
    ids, imgs = prompt
    p = SamplingParams(temperature=0, max_new_tokens=8)
    before = asyncio.run(engine.generate(ids, imgs, p))
    build_tiny(tmp_path / "other", seed=7)
    asyncio.run(engine.update_weights(str(tmp_path / "other"), version=5))
    after = asyncio.run(engine.generate(ids, imgs, p))
    # random-init models can share a greedy argmax; their logprobs cannot coincide
    assert engine.weight_version == 5 and after.weight_version == 5
    assert (after.token_ids, after.logprobs) != (before.token_ids, before.logprobs)
    asyncio.run(engine.update_weights(str(tiny_dir)))
    back = asyncio.run(engine.generate(ids, imgs, p))
    assert back.token_ids == before.token_ids and back.logprobs == pytest.approx(before.logprobs, abs=1e-5)
    assert engine.weight_version == 6


def test_sampling_params_validation():
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="frequency_penalty"):
        SamplingParams(frequency_penalty=2.5)
    with pytest.raises(ValueError, match="presence_penalty"):
        SamplingParams(presence_penalty=-3)


def test_vision_placeholders_are_never_sampled(tiny):
    import torch
    from paravt.engines.hf import _Request, _RowSampler
    from paravt.models.tokenize import vision_token_ids
    _, proc = tiny
    banned = vision_token_ids(proc.tokenizer)
    assert proc.image_token_id in banned and len(banned) == 4
    scores = torch.zeros(2, 50)
    scores[:, banned[0]] = 100.0  # the model's favourite is a vision placeholder
    reqs = [_Request([1], None, SamplingParams(temperature=0), torch.Generator().manual_seed(0)),
            _Request([1], None, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))]
    out = _RowSampler(reqs, banned)(torch.zeros(2, 1, dtype=torch.long), scores)
    chosen = out.argmax(-1).tolist()
    assert not set(chosen) & set(banned)


def test_penalties_count_generated_tokens_only():
    """_RowSampler: a token already generated loses frequency x count + presence; prompt tokens are not counted."""
    from paravt.engines.hf import _RowSampler, _Request

    def pick(params, ids, prompt_len):
        req = _Request([], None, params, torch.Generator().manual_seed(0))
        scores = torch.tensor([[0.0, 3.0, 2.5, 1.0]])
        return int(_RowSampler([req], prompt_len=prompt_len)(torch.tensor([ids]), scores).argmax())

    greedy = dict(temperature=0, max_new_tokens=8)
    assert pick(SamplingParams(**greedy), [9, 1, 1], 1) == 1  # no penalty: the best logit
    assert pick(SamplingParams(**greedy, frequency_penalty=0.3), [9, 1], 1) == 1  # 3.0 - 0.3 > 2.5
    assert pick(SamplingParams(**greedy, frequency_penalty=0.3), [9, 1, 1], 1) == 2  # 3.0 - 0.6 < 2.5
    assert pick(SamplingParams(**greedy, presence_penalty=0.6), [9, 1], 1) == 2
    assert pick(SamplingParams(**greedy, frequency_penalty=1.0), [1, 1, 1, 9], 3) == 1  # 1s are prompt
    assert pick(SamplingParams(**greedy, frequency_penalty=1.0), [1, 1], 2) == 1  # nothing generated yet


def test_frequency_penalty_breaks_greedy_repetition_and_keeps_raw_logprobs(engine, prompt):
    ids, imgs = prompt
    base = asyncio.run(engine.generate(ids, imgs, SamplingParams(temperature=0, max_new_tokens=32)))
    pen = asyncio.run(engine.generate(ids, imgs, SamplingParams(temperature=0, max_new_tokens=32, frequency_penalty=2.0)))
    assert len(set(base.token_ids)) < len(base.token_ids)  # the random tiny model repeats itself greedily
    assert pen.token_ids != base.token_ids
    assert max(pen.token_ids.count(t) for t in set(pen.token_ids)) < max(base.token_ids.count(t) for t in set(base.token_ids))
    full = torch.tensor([ids + pen.token_ids])  # logprobs are the model's, not the penalised sampler's
    pv, grid = imgs.tensors(engine.processor)
    with torch.no_grad():
        logits = engine.model(input_ids=full, attention_mask=torch.ones_like(full), mm_token_type_ids=(full == engine.image_token_id).long(),
                              pixel_values=pv, image_grid_thw=grid).logits[0, len(ids) - 1:-1]
    logits = logits.index_fill(1, torch.tensor(engine.banned_ids), float("-inf"))  # vision placeholders banned
    ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(pen.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(ref, torch.tensor(pen.logprobs), atol=1e-4)


def test_greedy_tokens_are_the_same_alone_and_in_a_left_padded_batch(engine, tiny, world):
    """Why the eval's samples in flight do not change its answers: a greedy request yields the same tokens
    alone and batched with prompts of other lengths and other frames (left padding, per-row positions)."""
    _, proc = tiny
    rows, _ = load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])
    prompts = [encode_prompt(proc, build_messages(mode, r.question, sample_overview(r.video, k), "v.mp4", 60.0, tool_schemas=DATA_TOOL_SCHEMAS), THINK_PREFIX)
               for r, k, mode in [(rows[0], 4, "agentic_minimal"), (rows[1], 8, "agentic_general"), (rows[2], 2, "direct")]]
    assert len({len(ids) for ids, _ in prompts}) == 3  # three lengths: the batch is padded
    sp = SamplingParams(temperature=0, max_new_tokens=20)

    async def batch():
        return await asyncio.gather(*[engine.generate(ids, imgs, sp) for ids, imgs in prompts])
    together = asyncio.run(batch())
    assert engine.stats["batch_sizes"][-1] == 3
    alone = [asyncio.run(engine.generate(ids, imgs, sp)) for ids, imgs in prompts]
    assert engine.stats["batch_sizes"][-1] == 1
    assert [o.token_ids for o in alone] == [o.token_ids for o in together]
    assert all(len(o.token_ids) > 0 for o in alone)


def test_rows_still_running_when_half_have_stopped_continue_alone_with_the_same_tokens(tiny, world):
    """A batch whose rows stop at different steps (their own max_new_tokens, a stop string, penalties, sampled and
    greedy): continued as a smaller batch once half have stopped, every row gets the tokens it gets when the
    whole batch runs to its longest row, and its logprobs within float noise."""
    model, proc = tiny
    rows, _ = load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])
    prompts = [encode_prompt(proc, build_messages("agentic_general", r.question, sample_overview(r.video, k), "v.mp4",
                                                  60.0, tool_schemas=DATA_TOOL_SCHEMAS), THINK_PREFIX)
               for r, k in [(rows[0], 4), (rows[1], 8), (rows[2], 2), (rows[3], 4)]]
    params = [SamplingParams(temperature=0, max_new_tokens=6), SamplingParams(temperature=1.0, max_new_tokens=9, seed=5),
              SamplingParams(temperature=0.8, max_new_tokens=48, seed=2, frequency_penalty=0.5, stop=["</think>"]),
              SamplingParams(temperature=0, max_new_tokens=48)]

    def run(shrink):
        engine = HFEngine(model, proc, batch_wait_s=0.05, shrink=shrink)

        async def batch():
            return await asyncio.gather(*[engine.generate(ids, imgs, p) for (ids, imgs), p in zip(prompts, params)])
        outs = asyncio.run(batch())
        assert engine.stats["batch_sizes"] == [4]
        return outs, engine.stats["continued_rows"]

    whole, n_whole = run(False)
    shrunk, n_shrunk = run(True)
    assert n_whole == 0 and n_shrunk == 2  # rows 0 and 1 stop at 6 and 9 tokens: rows 2 and 3 go on alone
    assert [len(o.token_ids) for o in whole][:2] == [6, 9] and max(len(o.token_ids) for o in whole) > 9
    for a, b in zip(whole, shrunk):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
