"""grpo.dynamic_sampling (DAPO): a step drops the groups whose rewards have no spread and draws more
prompts until it holds prompts_per_step groups with spread, within dynamic_sampling_max_prompts.

The episodes and rewards are stubs (no model, no engine): a prompt named ``const*`` gets reward 1 on
every rollout, any other prompt reward 1 on its first rollout and 0 on the rest."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

import paravt.rl.rollout as rollout
from paravt.agent.episode import EpisodeSample
from paravt.rl.config import GRPOConfig, RLConfig
from paravt.rl.rollout import PromptSchedule, RolloutWorker

N = 4  # rollouts per prompt


class FakeEpisodes:
    """Stands in for ``run_episode`` and ``compute_reward``; records the prompts (and K) each step drew."""

    def __init__(self):
        self.calls = 0
        self.drawn: list[tuple[str, int]] = []

    def run_episode(self, s, engine, processor, cfg, k, seed, cache, tools):
        j = self.calls % N  # the rollout's index in its group (a group's n rollouts are made in order)
        self.calls += 1
        if j == 0:
            self.drawn.append((s.sample_id, k))
        turn = SimpleNamespace(text="<answer>x</answer>", calls=[], weight_version=0)
        main = SimpleNamespace(input_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.5], images=None,
                               think_mask=lambda: None)
        traj = SimpleNamespace(faults=[], turns=[turn], end_reason="answer", main=main, subagents=[],
                               completion_text=f"{s.sample_id}|{j}",
                               stats={"tool_calls": 0, "parse_errors": 0, "tool_turns_used": 0, "generated_tokens": 2},
                               redacted=lambda thumbnails=0: {})

        async def done():
            return traj
        return done()

    @staticmethod
    def compute_reward(text, answer, question_type, knobs, judge, executed, parser=None):
        sid, j = text.split("|")
        total = 1.0 if sid.startswith("const") or j == "0" else 0.0
        return SimpleNamespace(total=total, acc=total, format=0.0, tool=0.0, guarded=0.0, to_dict=lambda: {})


def _worker(monkeypatch, names: list[str], per_step: int = 3, seed: int = 0, **grpo) -> tuple[RolloutWorker, FakeEpisodes]:
    fake = FakeEpisodes()
    monkeypatch.setattr(rollout, "run_episode", fake.run_episode)
    monkeypatch.setattr(rollout, "compute_reward", fake.compute_reward)
    cfg = RLConfig(model_path="unused", train_data=["unused.parquet"], seed=seed,
                   grpo=GRPOConfig(n_samples=N, prompts_per_step=per_step, **grpo))
    schedule = PromptSchedule([EpisodeSample(n, "q", "v.mp4") for n in names], per_step, seed)
    return RolloutWorker(cfg, engine=None, processor=None, schedule=schedule), fake


NAMES = [f"const{i}" for i in range(6)] + [f"signal{i}" for i in range(6)]


def _has_spread(batch) -> None:
    """Every trained group holds rewards 1, 0, 0, 0: after group normalisation no advantage is 0."""
    assert batch.samples and all(abs(s.advantage) > 0.1 for s in batch.samples)


def test_off_by_default_trains_every_group(monkeypatch):
    worker, fake = _worker(monkeypatch, NAMES)
    batch = asyncio.run(worker.collect(0))
    assert len(fake.drawn) == 3 and len(batch.samples) == 3 * N
    assert not any(k.startswith("dynamic_sampling/") for k in batch.metrics)


def test_only_groups_with_spread_are_trained_and_counted(monkeypatch):
    worker, fake = _worker(monkeypatch, NAMES, dynamic_sampling=True, dynamic_sampling_max_prompts=12)
    for step in range(3):
        fake.drawn.clear()
        batch = asyncio.run(worker.collect(step))
        m = batch.metrics
        drawn = [sid for sid, _ in fake.drawn]
        const = sum(sid.startswith("const") for sid in drawn)
        assert len(batch.samples) == 3 * N  # the recipe's 3 prompts, each with spread
        _has_spread(batch)
        assert m["dynamic_sampling/groups_drawn"] == len(drawn) == const + 3
        assert m["dynamic_sampling/groups_dropped"] == const
        assert m["dynamic_sampling/groups_kept"] == 3
        assert m["dynamic_sampling/extra_generation_share"] == pytest.approx((len(drawn) - 3) / len(drawn))
        assert m["dynamic_sampling/capped"] == 0.0
        assert m["frac_reward_zero_std"] == pytest.approx(const / len(drawn))
        assert len(set(drawn)) == len(drawn)  # no prompt drawn twice in a step
        assert drawn[:3] == [s.sample_id for s in worker.schedule.batch(step)]  # the schedule's prompts first


def test_the_schedule_is_the_same_under_one_seed(monkeypatch):
    runs = []
    for _ in range(2):
        worker, fake = _worker(monkeypatch, NAMES, seed=7, dynamic_sampling=True, dynamic_sampling_max_prompts=12)
        for step in range(4):
            asyncio.run(worker.collect(step))
        runs.append(list(fake.drawn))  # (prompt, K) in draw order
    assert runs[0] == runs[1]
    assert len({k for _, k in runs[0]}) > 1  # nFrames gating still draws K per prompt
    other, fake = _worker(monkeypatch, NAMES, seed=8, dynamic_sampling=True, dynamic_sampling_max_prompts=12)
    for step in range(4):
        asyncio.run(other.collect(step))
    assert fake.drawn != runs[0]


def test_the_cap_is_respected_and_reported(monkeypatch):
    names = [f"const{i}" for i in range(10)] + ["signal0"]
    worker, fake = _worker(monkeypatch, names, dynamic_sampling=True, dynamic_sampling_max_prompts=5)
    batch = asyncio.run(worker.collect(0))
    m = batch.metrics
    assert len(fake.drawn) == 5 and m["dynamic_sampling/groups_drawn"] == 5
    assert m["dynamic_sampling/capped"] == 1.0
    assert m["dynamic_sampling/groups_kept"] + m["dynamic_sampling/groups_dropped"] == 5
    assert len(batch.samples) == N * m["dynamic_sampling/groups_kept"]
    if batch.samples:
        _has_spread(batch)


def test_through_the_async_producer(monkeypatch):
    """The producer collects steps ahead of training (max_staleness 2): the same prompts as step by step."""
    worker, fake = _worker(monkeypatch, NAMES, seed=3, dynamic_sampling=True, dynamic_sampling_max_prompts=12)
    producer = rollout.RolloutProducer(worker, 0, 3, max_staleness=2)
    producer.start()
    batches = [producer.get() for _ in range(3)]
    for v in range(1, 4):
        producer.set_version(v)
    producer.shutdown()
    assert [b.index for b in batches] == [0, 1, 2] and all(len(b.samples) == 3 * N for b in batches)
    ref, ref_fake = _worker(monkeypatch, NAMES, seed=3, dynamic_sampling=True, dynamic_sampling_max_prompts=12)
    for step in range(3):
        asyncio.run(ref.collect(step))
    assert fake.drawn == ref_fake.drawn


def test_the_cap_is_checked():
    with pytest.raises(ValueError, match="dynamic_sampling_max_prompts"):
        GRPOConfig(prompts_per_step=4, dynamic_sampling=True, dynamic_sampling_max_prompts=3)


def test_a_step_whose_groups_all_lack_spread_is_not_lost_work(monkeypatch):
    """Capped with no group kept: nothing to train on, yet no work was lost, so the run goes on."""
    from paravt.rl.lost_work import LostWork

    worker, _ = _worker(monkeypatch, [f"const{i}" for i in range(6)], dynamic_sampling=True,
                        dynamic_sampling_max_prompts=4)
    batch = asyncio.run(worker.collect(0))
    assert not batch.samples and batch.metrics["dynamic_sampling/capped"] == 1.0
    assert batch.metrics["dynamic_sampling/groups_dropped"] == 4
    lost = LostWork(worker.cfg, SimpleNamespace(rank=0, is_main=True, world_size=1), "unused", lambda: None)
    for step in range(worker.cfg.rollout.max_bad_steps + 1):
        lost.check(batch, step)
    assert lost.bad_steps == 0


@pytest.mark.launcher
def test_through_run_rl_sh_on_two_ranks(world, tiny_dir, tmp_path):
    """The knob as users launch it: two gloo trainer ranks, the real episodes of the tiny model at a sampling
    temperature; every step logs its counts, the kept groups are the trained ones, and the run exits 0."""
    import json
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "rl"
    cmd = ["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={out}",
           f"train_data=[{world}/local/paravt_rl_synth.parquet]", "hierarchical_agent.max_new_tokens=16",
           "hierarchical_agent.crop.subagent_max_tokens=8", "grpo.prompts_per_step=2", "grpo.n_samples=4",
           "grpo.dynamic_sampling=true", "grpo.dynamic_sampling_max_prompts=4", "logging.wandb_project=null",
           "logging.progress=false", "max_steps=2", "save_every=2"]
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "NPROC": "2", "MAX_RESTARTS": "0", "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [s for s in steps if "step" in s]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        drawn, kept, dropped = (s[f"dynamic_sampling/groups_{k}"] for k in ("drawn", "kept", "dropped"))
        assert drawn == kept + dropped and 2 <= drawn <= 4 and kept <= 2, s
        assert s["dynamic_sampling/extra_generation_share"] == pytest.approx(max(drawn - 2, 0) / drawn)
        assert s["rollout/samples"] == 4 * kept  # only the kept groups train
    assert (out / "final/config.json").is_file()
