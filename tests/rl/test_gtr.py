"""GTR (paravt.rl.gtr): the oracle corrector, SFT samples, the loss, the buffer across a resume, and
the LLM corrector against the project's own OpenAI-compatible server."""

import asyncio
import json
import re
from collections import Counter

import pytest
import torch

from paravt.core.config import load_config
from paravt.core.video import overview_timestamps
from paravt.data.synthetic.traces import expert_trajectory
from paravt.data.synthetic.world import WorldConfig, make_question
from paravt.rl.config import RLConfig
from paravt.rl.grpo import gtr_objective
from paravt.rl.gtr import CorrectionBuffer, build_correction, collapse_metrics, correction_text, thought_answer_consistent
from paravt.rl.gtr_correctors import LLMCorrector, OracleCorrector, TurnState, first_thought, parse_verdict


def _expert_states(oracle, limit=40):
    """(TurnState, expert thought) for every main-agent turn of the expert on the world's questions."""
    from paravt.core.seeding import py_rng

    out = []
    for vid, spec in sorted(oracle.specs.items()):
        r = py_rng(0, "gtr-test", vid)
        for ei, ev in enumerate(spec.events):
            for qtype in ("mcq", "oe", "tvg"):
                q = make_question(spec, ev, qtype, r)
                k = r.choice((4, 64))
                traj = expert_trajectory(spec, q, k, oracle.cfg)
                ov = overview_timestamps(spec.num_frames, spec.fps, k)
                windows, turn_i = [], 0
                for i, t in enumerate(traj["turns"]):
                    if not isinstance(t, str):
                        continue
                    thought = first_thought(t)
                    st = TurnState(f"{vid}_e{ei}_{qtype}", q["question"], qtype, q["answer"], spec.rel_path, turn_i,
                                   thought, t, ov, list(windows), [], [])
                    out.append((st, thought))
                    windows += [(float(a), float(b)) for a, b in re.findall(
                        r'"start_time": ([\d.]+), "end_time": ([\d.]+)', t)]
                    turn_i += 1
                if len(out) >= limit:
                    return out
    return out


@pytest.fixture(scope="module")
def oracle(world):
    return OracleCorrector(world)


def test_oracle_judges_expert_thoughts_correct_and_swapped_ones_wrong(oracle):
    states = _expert_states(oracle)
    assert len(states) >= 30
    n_colour = n_shape = 0
    for st, thought in states:
        assert thought is not None
        assert oracle.errors(st) == [], (st.sample_id, st.turn_index, thought)
        v = asyncio.run(oracle.judge(st))
        assert v.correct is True and v.correction is None
        spec, ev = oracle.target(st)
        claims = [f"It is {ev.colour}", f"{ev.colour} {ev.shape}"]
        if any(c in thought for c in claims):  # a colour claim swapped -> wrong; the correction is right
            other = next(c for c in oracle.colours if c != ev.colour)
            swapped = thought
            for c in claims:
                swapped = swapped.replace(c, c.replace(ev.colour, other))
            v = asyncio.run(oracle.judge(TurnState(**{**st.__dict__, "thought": swapped})))
            assert v.correct is False and other in v.reason, (swapped, v)
            assert oracle.errors(TurnState(**{**st.__dict__, "thought": v.correction})) == []
            n_colour += 1
        if st.turn_index == 0 and f"the {ev.shape}" in thought:  # shape swap in the restated question -> wrong
            other = next(s for s in oracle.shapes if s != ev.shape)
            bad = TurnState(**{**st.__dict__, "thought": thought.replace(f"the {ev.shape}", f"the {other}", 1)})
            v = asyncio.run(oracle.judge(bad))
            assert v.correct is False and "restates" in v.reason
            assert v.correction == thought  # turn 0: the correction is the expert's own thought, word for word
            n_shape += 1
    assert n_colour >= 5 and n_shape >= 5
    # (e) a thought about another shape is state-irrelevant, even when what it says is true
    st, thought = states[0]
    spec, ev = oracle.target(st)
    other = next(e for e in spec.events if e.shape != ev.shape) if len(spec.events) > 1 else None
    shape = other.shape if other else next(s for s in oracle.shapes if s != ev.shape)
    v = asyncio.run(oracle.judge(TurnState(**{**st.__dict__, "thought": f"The {shape} is visible in the overview frames."})))
    assert v.correct is False and f"talks about the {shape}" in v.reason


def test_oracle_leaves_malformed_turns_uncorrected(oracle):
    st, _ = _expert_states(oracle, 1)[0]
    v = asyncio.run(oracle.judge(TurnState(**{**st.__dict__, "thought": None})))
    assert v.correct is None and v.correction is None and "malformed" in v.reason
    assert first_thought("<think>short</think><answer>A</answer>") is None
    assert first_thought("<think>\nThe circle is red and visible.") is None  # unclosed


def test_sft_sample_mask_covers_exactly_the_corrected_thought(world, tiny_dir):
    from paravt.agent.episode import EpisodeConfig, EpisodeSample, run_episode
    from paravt.data.schema import load_rl_rows
    from paravt.engines.hf import HFEngine

    eng = HFEngine.from_pretrained(tiny_dir)
    row = load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])[0][0]
    cfg = EpisodeConfig(prompt_mode="agentic_general", prompt_source="mode", max_turns=2, max_new_tokens=24,
                        temperature=1.0, think_prefix=True)
    traj = asyncio.run(run_episode(EpisodeSample.from_row(row), eng, eng.processor, cfg, 4, seed=3))
    turn = traj.turns[0]
    assert turn.prefix == "<think>\n" and turn.context_len > 0
    assert traj.main.loss_mask[turn.context_len] == 1 and traj.main.loss_mask[turn.context_len - 1] == 0
    fixed = "The question asks the colour of the circle in one word. It is red."
    c = build_correction(traj, turn, fixed, eng.processor, step=0)
    n = turn.context_len
    assert c.input_ids[:n] == traj.main.input_ids[:n] and c.loss_mask[:n] == [0] * n
    labelled = [t for t, m in zip(c.input_ids, c.loss_mask) if m]
    assert c.loss_mask[n:] == [1] * (len(c.input_ids) - n)
    assert eng.processor.tokenizer.decode(labelled) == correction_text(fixed, turn.prefix) == fixed + "\n</think>"
    assert c.n_images == 4 and len(c.images) == 4
    # without a forced prefix the model writes "<think>\n" itself, so it is part of the labels
    assert correction_text(fixed, "") == "<think>\n" + fixed + "\n</think>"
    # the episode's think mask: policy tokens inside <think>...</think> of every turn
    tm = traj.main.think_mask()
    assert len(tm) == len(traj.main.input_ids) and all(m <= l for m, l in zip(tm, traj.main.loss_mask))


def test_loss_is_rl_loss_plus_lambda_nll(world, tiny_dir, tmp_path):
    """train_on with SFT samples applies exactly grad(L_RL/N_rl + λ·NLL/N_sft) (checked on the tiny model)."""
    from paravt.rl.grpo import ppo_token_loss
    from paravt.rl.rollout import Sample
    from paravt.rl.trainer import RLTrainer

    lam = 0.7
    cfg = load_config(RLConfig, "configs/rl/tiny_gtr.yaml", [
        f"model_path={tiny_dir}", f"output_dir={tmp_path}", f"train_data=[{world}/local/paravt_rl_synth.parquet]",
        "trainer.strategy=none", "grpo.kl_coef=0", f"gtr.sft_weight={lam}", "optim.grad_clip=1e9",
        "logging.wandb_project=null", "logging.progress=false", "grpo.behav_imp_weight_cap=null"])
    tr = RLTrainer(cfg)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 300, (40,), generator=g).tolist()
    rl = Sample(ids, [0] * 20 + [1] * 20, [-3.0] * 40, None, 0.8)
    sft = Sample(ids[:30] + [11, 12, 13], [0] * 30 + [1] * 3, [0.0] * 33, None, 0.0, "sft")
    grads = {}
    tr.optimizer.step = lambda: grads.update({n: p.grad.clone() for n, p in tr.actor.named_parameters()
                                              if p.grad is not None})
    tr.train_on([rl], [sft])

    tr.optimizer.zero_grad(set_to_none=True)
    logp, _ = tr._forward_logps(tr.actor, rl)
    mask = torch.tensor(rl.loss_mask[1:], dtype=torch.bool)
    out = ppo_token_loss(logp, logp.detach(), torch.tensor(rl.behav_logprobs[1:]), None, torch.full_like(logp, 0.8),
                         mask, cfg.grpo.clip_eps, 0.0, None)
    lp_sft, _ = tr._forward_logps(tr.actor, sft, temperature=1.0)
    nll = -(lp_sft * torch.tensor(sft.loss_mask[1:], dtype=torch.bool)).sum()
    gtr_objective(out.loss_sum, 20, nll, 3, lam).backward()
    for n, p in tr.actor.named_parameters():
        if p.grad is not None:
            assert torch.allclose(grads[n], p.grad, atol=1e-6, rtol=1e-4), n
    assert torch.isclose(gtr_objective(torch.tensor(2.0), 4, torch.tensor(3.0), 2, 0.5), torch.tensor(0.5 + 0.75))


def test_resume_restores_the_buffer(world, tiny_dir, tmp_path):
    from paravt.rl.trainer import RLTrainer

    over = [f"model_path={tiny_dir}", f"output_dir={tmp_path}", f"train_data=[{world}/local/paravt_rl_synth.parquet]",
            "max_steps=2", "save_every=1", "grpo.prompts_per_step=2", "grpo.n_samples=2",
            "hierarchical_agent.max_new_tokens=40", "hierarchical_agent.crop.subagent_max_tokens=16",
            "logging.wandb_project=null", "logging.progress=false", "gtr.max_judged_turns=8"]
    cfg = load_config(RLConfig, "configs/rl/tiny_gtr.yaml", over)
    tr = RLTrainer(cfg)
    tr.train(until=1)
    saved = json.loads((tmp_path / "checkpoints/step_000001/gtr_buffer.json").read_text())
    rec = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for k in ("gtr/corrected_fraction", "gtr/valid_thought_fraction", "gtr/thought_state_consistency",
              "gtr/distinct_thought_fraction", "gtr/cross_question_duplicates", "gtr/repeated_thought_turns",
              "gtr/nll", "ppo/entropy_think", "ppo/entropy_action"):
        assert k in rec[0], k
    assert rec[0]["gtr/judged_turns"] > 0
    # the random-init tiny model writes no valid thought, so its buffer may be empty: add one by hand
    # to prove that what is saved is what comes back (ids, masks) and that images are re-decoded.
    tr2 = RLTrainer(load_config(RLConfig, "configs/rl/tiny_gtr.yaml", over))
    tr2._resume()
    assert [c.input_ids for c in tr2.gtr.buffer.items] == [r["input_ids"] for r in saved["items"]]
    assert [c.loss_mask for c in tr2.gtr.buffer.items] == [r["loss_mask"] for r in saved["items"]]
    buf = CorrectionBuffer(8, seed=0)
    from paravt.rl.gtr import Correction
    buf.add([Correction("x_e0_mcq", 4, 0, 0, [1, 2, 3], [0, 1, 1], 0, "thought")])
    buf.save(tmp_path / "b.json")
    buf2 = CorrectionBuffer(8, seed=0)
    buf2.load(tmp_path / "b.json")
    assert buf2.items == buf.items and buf2.draw(1, 5) == buf.draw(1, 5)


def test_collapse_metrics_on_shaped_outputs():
    eps = [("q1", "oe", ["<think>\nThe circle is visible at 12.0 seconds. It is red.\n</think>\n<answer>red</answer>"]),
           ("q2", "oe", ["<think>\nThe circle is visible at 30.0 seconds. It is red.\n</think>\n<answer>blue</answer>"]),
           ("q3", "mcq", ["<think>\nI will check 4 windows of the video in parallel.\n</think>\n<tool_call>x</tool_call>",
                          "<think>\nI will check 4 windows of the video in parallel.\n</think>\n<answer>B</answer>"]),
           ("q4", "oe", ["no thought at all"])]
    m = collapse_metrics(eps)
    assert m["gtr/valid_thought_fraction"] == 4 / 5
    assert m["gtr/distinct_thought_fraction"] == 2 / 4  # numbers are masked: q1 and q2 think alike
    assert m["gtr/cross_question_duplicates"] == 2 / 4
    assert m["gtr/repeated_thought_turns"] == 1.0  # q3 repeats its thought
    assert m["gtr/thought_answer_consistency"] == 1 / 3  # q1 states its answer; q2, q3 do not
    assert thought_answer_consistent("<think>\nVisible from 10.0 to 14.0 seconds.\n</think><answer>[10.5, 14.0]</answer>",
                                     "tvg") is True


def test_parse_verdict_on_corrector_replies():
    f = Counter()
    assert parse_verdict('{"evaluation": "Yes", "reason": "fine", "correction": null}', f).correct is True
    v = parse_verdict('Sure.\n```json\n{"evaluation": "no", "correction": "The triangle is blue, option C."}\n```', f)
    assert v.correct is False and v.correction == "The triangle is blue, option C."
    assert parse_verdict('{"evaluation": "no", "correction": null}', f).correct is None
    assert parse_verdict("I think it is wrong", f).correct is None
    assert parse_verdict('{"evaluation": "no", "correction": {"thought": "The square is green here."}}', f).correction \
        == "The square is green here."
    assert f == {"no_correction": 1, "unparseable": 1}


def test_llm_corrector_against_our_server_never_blocks(world, tiny_dir):
    """The tiny model's reply is not JSON and a dead endpoint fails: both are 'no correction'."""
    from paravt.engines.backends import start_hf_server
    from paravt.models.parallel import free_port

    oracle = OracleCorrector(world)
    st, _ = _expert_states(oracle, 1)[0]
    from PIL import Image
    st = TurnState(**{**st.__dict__, "frames": [Image.new("RGB", (64, 64), (200, 30, 30))] * len(st.overview_times)})
    proc, url = start_hf_server(str(tiny_dir))
    try:
        # the reply's content is what is tested, not the machine's speed: a bound no slow machine reaches
        c = LLMCorrector(url, max_retries=0, timeout_s=900, max_frames=2)
        assert sum(1 for it in c.messages(st)[0]["content"] if it["type"] == "image") == 2
        v = asyncio.run(c.judge(st))
        assert v.correct is None and v.correction is None and c.failures["unparseable"] == 1
    finally:
        proc.terminate()
        proc.wait(timeout=300)
    dead = LLMCorrector(f"http://127.0.0.1:{free_port()}", model="m", max_retries=0, timeout_s=5)
    v = asyncio.run(dead.judge(st))
    assert v.correct is None and "request failed" in v.reason and dead.failures["request"] == 1


def test_gtr_config_is_checked():
    with pytest.raises(ValueError, match="gtr.mode"):
        load_config(RLConfig, "configs/rl/tiny.yaml", ["gtr.mode=always"])
    with pytest.raises(ValueError, match="base_url"):
        load_config(RLConfig, "configs/rl/tiny.yaml", ["gtr.mode=train", "gtr.corrector=llm"])
    assert load_config(RLConfig, "configs/rl/tiny.yaml").gtr.mode == "off"  # PARA-GRPO unchanged by default


def test_world_config_roundtrip_for_the_oracle(world):
    # world.json carries the config the oracle rebuilds (crop_max_frames, coarse windows)
    cfg = json.loads((world / "world.json").read_text())["config"]
    assert WorldConfig(**cfg).crop_max_frames == 16


def test_oracle_refuses_a_world_in_another_wording(world, tmp_path):
    """The oracle writes colour_first thoughts; on a shape_first world it would judge and correct in
    words the world never uses, so it stops naming the file and the knob."""
    data = json.loads((world / "world.json").read_text())
    data["config"]["report_wording"] = "shape_first"
    (tmp_path / "world.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"world\.json was built with report_wording=shape_first"):
        OracleCorrector(tmp_path)
    assert OracleCorrector(world).cfg.report_wording == "colour_first"
