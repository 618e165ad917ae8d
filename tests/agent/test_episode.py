import asyncio
import math

import pytest

from paravt.agent.episode import EpisodeConfig, EpisodeSample, OverviewCache, run_episode
from paravt.agent.tools import CropConfig, validate_window
from paravt.agent.trajectory import SequenceRecord
from paravt.data.schema import load_rl_rows
from tests.helpers import ScriptedEngine, call


@pytest.fixture(scope="module")
def rows(world):
    rows, _ = load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])
    return rows


@pytest.fixture()
def sample(rows):
    return EpisodeSample.from_row(rows[0])


def run(coro):
    return asyncio.run(coro)


def test_multi_call_turn_exact_ids_and_mask(tiny, sample):
    _, proc = tiny
    tok = proc.tokenizer
    turn0 = "I will look at three windows.\n</think>\n" + "\n".join(call(s, s + 10) for s in (0, 10, 20))
    turn1 = "The circle is red.\n</think>\n<answer>B</answer>"
    names = {"00:00": "first window", "00:10": "second window", "00:20": "third window"}
    # sub-agents finish in any order; the response order must still be the call order
    # (a sub-agent generates for 0.5 s: far longer than the prompt encodings, which run one at a time)
    eng = ScriptedEngine(tok, lambda t, p: [turn0, turn1][t], delay_s=0.05, sub_delay_s=0.5,
                         sub=lambda p: names[p.split("segment ", 1)[1][:5]])
    cfg = EpisodeConfig(max_new_tokens=256)
    traj = run(run_episode(sample, eng, proc, cfg, k=4, seed=1))

    assert traj.end_reason == "answer" and len(traj.turns) == 2
    assert eng.max_in_flight == 3  # the three sub-agents ran concurrently
    # Exact ids: the policy segments are byte-for-byte what the engine returned.
    main_calls = [c for c in eng.calls if not c["sub"]]
    policy = [s for s in traj.main.segments if s.role == "policy"]
    assert [s.token_ids for s in policy] == [c["ids"] for c in main_calls]
    assert sum(traj.main.loss_mask) == sum(len(c["ids"]) for c in main_calls)
    lp = traj.main.logprobs
    assert [x for x, m in zip(lp, traj.main.loss_mask) if m] == [l for s in policy for l in s.logprobs]
    assert all(x == 0.0 for x, m in zip(lp, traj.main.loss_mask) if not m)
    # The context between the two turns is the rendered tool-response turn, in call order.
    ctx = [s for s in traj.main.segments if s.role == "context"]
    delta = tok.decode(ctx[1].token_ids)
    assert delta == ("\n<|im_start|>user\n<tool_response>\nfirst window\n</tool_response>\n<tool_response>\n"
                     "second window\n</tool_response>\n<tool_response>\nthird window\n</tool_response><|im_end|>\n"
                     "<|im_start|>assistant\n<think>\n")
    # No re-tokenisation drift: rendering the whole conversation gives the same ids.
    from paravt.models.tokenize import encode_text
    full_text = tok.decode(traj.main.input_ids).replace("<|image_pad|>" * 4, "<|image_pad|>")
    ids, _ = encode_text(proc, full_text, traj.main.images.images)
    assert ids == traj.main.input_ids
    # Records.
    st = traj.stats
    assert st["tool_calls"] == 3 and st["tool_calls_ok"] == 3 and st["tool_turns_used"] == 1
    assert st["calls_per_tool_turn"] == 3 and st["max_parallel_calls"] == 3
    assert [c.window for c in traj.turns[0].calls] == [(0, 10), (10, 20), (20, 30)]
    assert len(traj.subagents) == 3 and all(sum(s.sequence.loss_mask) > 0 for s in traj.subagents)
    assert traj.completion_text.startswith("<think>\nI will look") and "\n<think>\nThe circle is red." in traj.completion_text
    assert all(c["n_images"] > 0 for c in eng.calls if c["sub"])  # sub-agents saw crop frames


def test_multi_turn_then_max_turns(tiny, sample):
    _, proc = tiny
    eng = ScriptedEngine(proc.tokenizer, lambda t, p: f"round {t}\n</think>\n" + call(t, t + 5))
    traj = run(run_episode(sample, eng, proc, EpisodeConfig(max_turns=2), k=4))
    assert traj.end_reason == "max_turns" and len(traj.turns) == 3
    assert [len(t.calls) for t in traj.turns] == [1, 1, 0]  # last turn's call is not executed
    assert traj.stats["tool_turns_used"] == 2


def test_bad_calls_become_error_responses(tiny, sample):
    _, proc = tiny
    dur = sample.duration
    bad = "\n".join([
        '<tool_call>\n{"name": "crop_video", "arguments": {"start_time": 1,\n</tool_call>',  # malformed JSON
        call(1, 2, name="zoom_in"),  # unknown tool
        '<tool_call>{"name": "crop_video", "arguments": {"video_path": "v"}}</tool_call>',  # missing times
        '<tool_call>{"name": "crop_video", "arguments": {"start_time": "soon", "end_time": 3}}</tool_call>',
        call(9, 3),  # start >= end
        call(dur + 5, dur + 9),  # past the end
        '<tool_call>{"name": "crop_video", "arguments": {"start_time": NaN, "end_time": 3}}</tool_call>',
        call(-4, 6),  # negative start: clamped
        call(dur - 2, dur + 50),  # end clamped
    ])
    turns = [bad, "done\n</think>\n<answer>A</answer>"]
    eng = ScriptedEngine(proc.tokenizer, lambda t, p: turns[t])
    traj = run(run_episode(sample, eng, proc, EpisodeConfig(max_parallel=10), k=4))
    assert traj.end_reason == "answer"
    t0 = traj.turns[0]
    errors = [c.error for c in t0.calls if not c.ok]
    assert len(t0.parse_errors) == 1  # the malformed JSON block
    assert any("unknown tool" in e for e in errors)
    assert any("required" in e for e in errors)
    assert any("must be a number" in e for e in errors)
    assert any("before end_time" in e for e in errors)
    assert any("past the end" in e for e in errors)
    ok = [c for c in t0.calls if c.ok]
    assert [c.window for c in ok] == [(0.0, 6.0), (dur - 2, dur)] and all(c.clamped for c in ok)
    delta = proc.tokenizer.decode([s for s in traj.main.segments if s.role == "context"][1].token_ids)
    assert delta.count("<tool_response>") == 9 and delta.count("[Error: crop_video failed:") == 5
    assert delta.count("[Error: the tool call could not be parsed:") == 1  # no tool ran: none is named
    assert "[Error: unknown tool 'zoom_in'" in delta
    st = traj.stats
    assert st["parse_errors"] == 1 and st["tool_errors"] == 6 and st["clamped_calls"] == 2
    assert sum("must be a number" in e for e in errors) == 2  # "soon" and NaN


def test_fifty_calls_are_capped(tiny, sample):
    _, proc = tiny
    many = "\n".join(call(i, i + 1) for i in range(50))
    eng = ScriptedEngine(proc.tokenizer, lambda t, p: [many, "<answer>A</answer>"][t])
    traj = run(run_episode(sample, eng, proc, EpisodeConfig(max_parallel=5, max_new_tokens=8192), k=4))
    assert len(traj.turns[0].calls) == 5 and traj.turns[0].dropped_calls == 45
    assert sum(c["sub"] for c in eng.calls) == 5
    # RL as released: no cap (max_parallel=None), every call of the turn runs
    many = "\n".join(call(i, i + 1) for i in range(12))
    eng = ScriptedEngine(proc.tokenizer, lambda t, p: [many, "<answer>A</answer>"][t])
    traj = run(run_episode(sample, eng, proc, EpisodeConfig(max_parallel=None, max_new_tokens=8192), k=4))
    assert len(traj.turns[0].calls) == 12 and traj.turns[0].dropped_calls == 0


def test_subagent_timeout_and_engine_errors(tiny, sample):
    _, proc = tiny
    eng = ScriptedEngine(proc.tokenizer, lambda t, p: [call(0, 5), "<answer>A</answer>"][t], sub_delay_s=2.0)
    cfg = EpisodeConfig(crop=CropConfig(subagent_timeout_s=0.2))
    traj = run(run_episode(sample, eng, proc, cfg, k=4))
    assert traj.end_reason == "answer" and "timed out" in traj.turns[0].calls[0].error
    eng = ScriptedEngine(proc.tokenizer, lambda t, p: "x", fail_main_turn=0)
    traj = run(run_episode(sample, eng, proc, EpisodeConfig(), k=4))
    assert traj.end_reason == "error" and "exploded" in traj.error and traj.turns == []


def test_missing_video_is_an_error_response_for_the_crop(tiny, sample, tmp_path):
    _, proc = tiny
    from paravt.agent.tools import CropVideo, ToolContext, call_parser
    crop = call_parser([CropVideo]).parse(call(1, 3)).calls[0]
    res = run(CropVideo().execute(crop, ToolContext(str(tmp_path / "gone.mp4"), 60.0)))
    assert not res.ok and "gone.mp4" in res.text and res.text.startswith("[Error: crop_video failed:")


def test_frames_mode_returns_frames_to_the_main_agent(tiny, sample):
    _, proc = tiny
    eng = ScriptedEngine(proc.tokenizer, lambda t, p: [call(0, 6) + call(10, 13), "<answer>A</answer>"][t])
    cfg = EpisodeConfig(crop=CropConfig(mode="frames"), final_turn_prompt=None)
    traj = run(run_episode(sample, eng, proc, cfg, k=4))
    assert traj.subagents == [] and not any(c["sub"] for c in eng.calls)
    assert len(traj.main.images) == 4 + 6 + 3  # overview + 6 + 3 crop frames
    n_img_tokens = sum(t == proc.image_token_id for t in traj.main.input_ids)
    assert n_img_tokens == 4 * len(traj.main.images)
    assert eng.calls[1]["n_images"] == 13
    assert "6 frame(s) from 0.0 to 6.0 seconds." in proc.tokenizer.decode(traj.main.input_ids)


def test_forced_final_answer(tiny, sample):
    _, proc = tiny
    eng = ScriptedEngine(proc.tokenizer, lambda t, p: call(t, t + 2) if t < 1 else "B")
    cfg = EpisodeConfig(max_turns=1, final_turn_prompt="Answer with the option letter only.", final_turn_max_tokens=64)
    traj = run(run_episode(sample, eng, proc, cfg, k=4))
    assert traj.end_reason == "answer" and eng.calls[-1]["max_new_tokens"] == 64
    text = proc.tokenizer.decode(traj.main.input_ids)
    assert "</tool_response><|im_end|>\n<|im_start|>user\nAnswer with the option letter only.<|im_end|>" in text


def test_overview_cache_per_sample_and_k(tiny, rows):
    _, proc = tiny
    eng = ScriptedEngine(proc.tokenizer, lambda t, p: "<answer>A</answer>")
    cache = OverviewCache()
    same_video = [r for r in rows if r.video == rows[0].video][:2]
    assert len(same_video) == 2
    s1, s2 = (EpisodeSample.from_row(r) for r in same_video)

    async def group():
        return await asyncio.gather(*[run_episode(s1, eng, proc, EpisodeConfig(), 8, seed=i, cache=cache)
                                      for i in range(8)])
    trajs = run(group())
    assert (cache.misses, cache.hits) == (1, 7)
    assert len({tuple(t.main.input_ids) for t in trajs}) == 1
    t2 = run(run_episode(s2, eng, proc, EpisodeConfig(), 8, cache=cache))
    assert cache.misses == 2  # another question on the same video is another prompt
    assert t2.main.input_ids != trajs[0].main.input_ids
    run(run_episode(s1, eng, proc, EpisodeConfig(), 4, cache=cache))
    assert cache.misses == 3


def test_validate_window():
    assert validate_window({"start": 1.0, "end": 3.0}, 10) == (1.0, 3.0, False)
    assert validate_window({"start_time": -1.0, "end_time": 30.0}, 10) == (0.0, 10.0, True)
    for args, msg in [({"start_time": 5.0}, "required"), ({"start_time": math.inf, "end_time": 3.0}, "number"),
                      ({"start_time": True, "end_time": 3.0}, "number"), ({"start_time": -5.0, "end_time": -1.0}, "empty")]:
        with pytest.raises(ValueError, match=msg):
            validate_window(args, 10)


@pytest.mark.parametrize("make, message", [
    (lambda: EpisodeConfig(prompt_source="file"), "prompt_source must be one of mode | row, got 'file'"),
    (lambda: CropConfig(mode="zoom"), "crop.mode must be one of subagent | frames, got 'zoom'"),
    (lambda: CropConfig(decoder="ffmpeg"), "crop.decoder must be one of pyav | decord, got 'ffmpeg'"),
    (lambda: SequenceRecord().add([1], "user"), "role must be one of policy | context, got 'user'"),
], ids=["prompt_source", "crop.mode", "crop.decoder", "role"])
def test_a_bad_choice_is_one_line_naming_the_options(make, message):
    with pytest.raises(ValueError) as e:
        make()
    assert str(e.value) == message


def test_real_tiny_model_full_episodes(tiny, rows):
    """The random-init tiny model through the real HF engine: invariants hold on any output."""
    from paravt.engines.hf import HFEngine
    model, proc = tiny
    eng = HFEngine(model, proc)
    cfg = EpisodeConfig(max_new_tokens=48, temperature=1.0)

    async def go():
        cache = OverviewCache()
        return await asyncio.gather(*[run_episode(EpisodeSample.from_row(rows[i % 3]), eng, proc, cfg, 8, seed=i,
                                                  cache=cache) for i in range(6)])
    trajs = run(go())
    for t in trajs:
        assert t.end_reason in ("answer", "length", "max_turns")
        m = t.main
        assert len(m.input_ids) == len(m.loss_mask) == len(m.logprobs)
        assert sum(m.loss_mask) == t.stats["generated_tokens"] > 0
        assert all(x <= 0 and math.isfinite(x) for x, k in zip(m.logprobs, m.loss_mask) if k)
    assert max(eng.stats["batch_sizes"]) > 1  # concurrent rollouts were batched


def test_generated_vision_placeholder_ends_the_episode(tiny, sample):
    _, proc = tiny
    eng = ScriptedEngine(proc.tokenizer, lambda t, p: "look <|image_pad|> here")
    traj = run(run_episode(sample, eng, proc, EpisodeConfig(), k=4))
    assert traj.end_reason == "error" and "vision placeholder" in traj.error


def test_a_subagent_that_generates_a_vision_placeholder_is_caught_like_the_main_agent(tiny, sample):
    """Sub-agents generate through the episode's own conversation path: the text the main agent's
    turn is refused for fails the crop call with the same message, a fault, never a summary."""
    _, proc = tiny
    bad = "look <|image_pad|> here"
    main = run(run_episode(sample, ScriptedEngine(proc.tokenizer, lambda t, p: bad), proc, EpisodeConfig(), k=4))
    eng = ScriptedEngine(proc.tokenizer, lambda t, p: [call(0, 5), "<answer>A</answer>"][t], sub=lambda p: bad)
    traj = run(run_episode(sample, eng, proc, EpisodeConfig(), k=4))
    crop = traj.turns[0].calls[0]
    assert not crop.ok and crop.fault and crop.error == f"sub-agent engine error: {main.error}"
    assert traj.subagents == [] and traj.faults  # nothing of it is trained on; the sample counts as lost
