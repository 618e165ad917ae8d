"""The rollout side of one PARA-GRPO step: :meth:`RolloutWorker.collect` turns a step index into
a :class:`RolloutBatch` (rank 0 only; the trainer ranks never touch the engine)::

    step i ─► prompts (seeded order) ─► K per prompt (nFrames gating)
          ─► n episodes per prompt on the engine, concurrently
          ─► rewards R_acc + w·R_fmt + R_tool ─► advantages ─► samples (exact ids, loss mask,
             engine logprobs, advantage) + metrics + a seeded sample of trajectories

With ``grpo.dynamic_sampling`` (off as released) the groups whose rewards have no spread are dropped
and more prompts drawn before the advantages (:mod:`paravt.rl.dynamic_sampling`).

:class:`RolloutProducer` runs ``collect`` in a background thread, at most
``grpo.max_staleness`` policy versions ahead of the trainer (0 = synchronous).
"""

from __future__ import annotations

import asyncio
import queue
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
import logging

import torch

from paravt.agent.episode import EpisodeConfig, EpisodeSample, OverviewCache, run_episode
from paravt.agent.tools import build_tools, call_parser
from paravt.agent.trajectory import SequenceRecord, Trajectory
from paravt.core.scoring import episode_well_formed, turn_well_formed
from paravt.core.seeding import rng, stable_hash
from paravt.models.images import ImageInputs
from paravt.rl.config import RLConfig
from paravt.rl.dynamic_sampling import DrawnGroups, dynamic_sample, max_prompts
from paravt.rl.gating import choose_k
from paravt.rl.grpo import compute_advantages, shape_rewards
from paravt.rl.rewards.terms import compute_reward

log = logging.getLogger(__name__)


@dataclass
class Sample:
    """One training sequence: exact ids, loss mask, engine logprobs, images, advantage."""

    input_ids: list[int]
    loss_mask: list[int]
    behav_logprobs: list[float]
    images: ImageInputs | None
    advantage: float
    kind: str = "main"  # main | subagent | pad | sft (a corrected thought: NLL only, see paravt.rl.gtr)
    think_mask: list[int] | None = None  # 1 on policy tokens inside <think>…</think> (GTR metrics / weights)


@dataclass
class RolloutBatch:
    index: int
    samples: list[Sample]
    metrics: dict[str, float]
    trajectories: list[dict[str, Any]]
    seconds: float
    weight_version: int
    corrections: list[Any] = field(default_factory=list)  # GTR: this step's corrected thoughts (paravt.rl.gtr)
    skipped_fraction: float = 0.0  # prompts skipped because their episodes lost work
    first_error: str | None = None  # the first lost work's error (one line)


class PromptSchedule:
    """Step i's prompts: positions [i·P, (i+1)·P) of concatenated seeded epoch permutations."""

    def __init__(self, samples: list[EpisodeSample], per_step: int, seed: int):
        if not samples:
            raise ValueError("no RL prompts")
        self.samples, self.per_step, self.seed = samples, per_step, seed

    def indices(self, step: int) -> list[int]:
        n = len(self.samples)
        out = []
        for pos in range(step * self.per_step, (step + 1) * self.per_step):
            epoch, j = divmod(pos, n)
            out.append(int(rng(self.seed, "rl-order", epoch).permutation(n)[j]))
        return out

    def batch(self, step: int) -> list[EpisodeSample]:
        return [self.samples[i] for i in self.indices(step)]

    def extra(self, step: int, start: int, count: int) -> list[EpisodeSample]:
        """Positions [start, start + count) of step ``step``'s extra stream (dynamic sampling): seeded
        permutations, one per pass, of the prompts outside the step's batch (of every prompt when the batch holds
        them all)."""
        base = set(self.indices(step))
        pool = [i for i in range(len(self.samples)) if i not in base] or list(range(len(self.samples)))
        out = []
        for pos in range(start, start + count):
            rnd, j = divmod(pos, len(pool))
            out.append(self.samples[pool[int(rng(self.seed, "rl-extra", step, rnd).permutation(len(pool))[j])]])
        return out


def episode_config(cfg: RLConfig) -> EpisodeConfig:
    """The episodes' runtime config: here the recipe's ``hierarchical_agent`` section
    (:class:`~paravt.rl.config.HierarchicalAgentConfig`) becomes the episode's
    :class:`~paravt.agent.episode.EpisodeConfig`, with the sampling settings of ``grpo`` and the
    think prefix of ``paravt.constrained``."""
    a = cfg.hierarchical_agent
    return EpisodeConfig(prompt_mode=a.prompt_mode, prompt_source=a.prompt_source, max_turns=a.max_turns,
                         max_parallel=a.max_parallel,
                         think_prefix=cfg.paravt.constrained.think_prefix, temperature=cfg.grpo.temperature,
                         top_p=cfg.grpo.top_p, max_new_tokens=a.max_new_tokens,
                         max_context_tokens=a.max_context_tokens, crop=a.crop, tools=a.tools)


def rollout_metrics(trajs, rewards, ks, zero_std: float, parser) -> dict[str, float]:
    """The step's rollout metrics under their conventional names."""
    n = max(len(trajs), 1)
    formed = [episode_well_formed([x.text for x in t.turns], parser) for t in trajs]
    turns = [turn_well_formed(x.text, parser) for t in trajs for x in t.turns]
    calls = [c for t in trajs for turn in t.turns for c in turn.calls]
    tool_turns = [turn for t in trajs for turn in t.turns if turn.calls]
    m = {
        "reward/total": sum(r.total for r in rewards) / n,
        "reward/acc": sum(r.acc for r in rewards) / n,
        "reward/format": sum(r.format for r in rewards) / n,
        "reward/tool": sum(r.tool for r in rewards) / n,
        "reward/guarded": sum(r.guarded for r in rewards) / n,
        "format/compliance": sum(formed) / n,
        # per turn: an episode of several turns fails if any turn does; this separates "longer episodes"
        # (tool calls at small K) from "a weaker format"
        "format/turn_compliance": (sum(turns) / len(turns)) if turns else 0.0,
        "tools/call_frequency": sum(t.stats["tool_calls"] > 0 for t in trajs) / n,
        "tools/calls_per_turn": (len(calls) / len(tool_turns)) if tool_turns else 0.0,
        "tools/parallel_turn_ratio": (sum(len(x.calls) >= 2 for x in tool_turns) / len(tool_turns)) if tool_turns else 0.0,
        "tools/failure_frequency": (sum(not c.ok for c in calls) / len(calls)) if calls else 0.0,
        "tools/parse_errors": sum(t.stats["parse_errors"] for t in trajs) / n,
        "tools/turns_used": sum(t.stats["tool_turns_used"] for t in trajs) / n,
        "frac_reward_zero_std": zero_std,
        "completions/clipped_ratio": sum(t.end_reason in ("length", "context") for t in trajs) / n,
        "completions/mean_length": sum(t.stats["generated_tokens"] for t in trajs) / n,
        "completions/errors": sum(t.end_reason == "error" for t in trajs) / n,
    }
    for k, c in Counter(ks).items():
        m[f"nframes/K{k}"] = c / n
    for k in sorted(set(ks)):
        idx = [i for i, kk in enumerate(ks) if kk == k]
        m[f"reward_by_K/acc_K{k}"] = sum(rewards[i].acc for i in idx) / len(idx)
        m[f"tools_by_K/call_frequency_K{k}"] = sum(trajs[i].stats["tool_calls"] > 0 for i in idx) / len(idx)
        m[f"format_by_K/compliance_K{k}"] = sum(formed[i] for i in idx) / len(idx)
        # what calling earned at this K: mean reward of the episodes that called minus those that did not
        # (logged only when the step sampled both; the signal RL follows to make calling depend on K)
        called = [rewards[i].total for i in idx if trajs[i].stats["tool_calls"] > 0]
        skipped = [rewards[i].total for i in idx if trajs[i].stats["tool_calls"] == 0]
        if called and skipped:
            m[f"tools_by_K/call_payoff_K{k}"] = sum(called) / len(called) - sum(skipped) / len(skipped)
    return m


class RolloutWorker:
    """Rank 0's rollout side: engine, processor, prompt schedule, overview cache, optional judge
    and GTR corrector."""

    def __init__(self, cfg: RLConfig, engine, processor, schedule: PromptSchedule, judge=None, gtr=None):
        self.cfg, self.engine, self.processor, self.schedule = cfg, engine, processor, schedule
        self.judge, self.gtr = judge, gtr
        self.cache = OverviewCache(max_items=4 * cfg.grpo.prompts_per_step)
        self.episode_cfg = episode_config(cfg)
        self.tools = build_tools(self.episode_cfg.tools, crop=self.episode_cfg.crop)
        self.parser = call_parser(self.tools.values())  # the rewards and metrics read calls as the episodes do

    def overview_images(self, sample_id: str, k: int) -> ImageInputs | None:
        """The K-frame overview the episodes of prompt ``sample_id`` saw (None: not a prompt of the schedule)."""
        s = next((x for x in self.schedule.samples if x.sample_id == sample_id), None)
        return None if s is None else self.cache.get(s, k, self.episode_cfg, self.processor,
                                                     [t.schema for t in self.tools.values()]).images

    async def collect(self, step: int) -> RolloutBatch:
        cfg, grpo = self.cfg, self.cfg.grpo
        t0 = time.perf_counter()
        prompts = self.schedule.batch(step)
        drawn = await self._draw(step, prompts, 0)
        every, ds_metrics, zero_std = drawn, {}, None
        if grpo.dynamic_sampling:  # DAPO: zero-spread groups out, more prompts in (paravt.rl.dynamic_sampling)
            def shape(totals):
                return shape_rewards(torch.tensor(totals, dtype=torch.float64), grpo.reward_bias, grpo.reward_scale,
                                     grpo.reward_clip)

            async def draw(start: int, count: int) -> DrawnGroups:
                return await self._draw(step, self.schedule.extra(step, start, count), len(every.prompts))

            drawn, ds_metrics = await dynamic_sample(every, draw, shape, grpo.prompts_per_step, max_prompts(grpo))
            zero_std = ds_metrics["dynamic_sampling/groups_dropped"] / max(1, len(set(every.groups)))
        prompts, trajs, groups, episode_ks, rewards = drawn.prompts, drawn.trajs, drawn.groups, drawn.ks, drawn.rewards
        lost, first = every.lost, every.first_error
        # 4. Advantages: (r + bias)·scale, clipped, group-normalised (batch norm here or per token later).
        adv, extra = compute_advantages([r.total for r in rewards], groups, grpo.reward_bias, grpo.reward_scale,
                                        grpo.group_norm, grpo.batch_adv_norm and grpo.adv_norm_level == "sequence",
                                        grpo.reward_clip)
        # 5. Samples: the engine's exact ids, main-agent mask, engine logprobs. Errors are never trained on.
        samples: list[Sample] = []
        for t, a in zip(trajs, adv.tolist()):
            if t.end_reason == "error" or not t.turns:
                continue
            samples.append(Sample(t.main.input_ids, t.main.loss_mask, t.main.logprobs, t.main.images, a,
                                  think_mask=t.main.think_mask()))
            if cfg.hierarchical_agent.include_subagent_in_loss:
                for sub in t.subagents:
                    seq = sub.sequence
                    samples.append(Sample(seq.input_ids, seq.loss_mask, seq.logprobs, seq.images, a, "subagent"))
        # metrics of every episode drawn (the policy, not the filter); the zero-std share over the drawn groups
        metrics = rollout_metrics(every.trajs, every.rewards, every.ks, extra["frac_reward_zero_std"] if zero_std is None
                                  else zero_std, self.parser) if every.trajs else {}
        metrics.update({"rollout/skipped_prompts": len(lost), "rollout/skipped_fraction": len(lost) / max(1, len(prompts))})
        metrics.update(ds_metrics)
        # 6. GTR (off by default): judge each turn's thought, correct the wrong ones, collapse metrics.
        corrections: list[Any] = []
        if self.gtr is not None:
            gtr_metrics, corrections = await self.gtr.process(step, trajs, [prompts[gi] for gi in groups])
            metrics.update(gtr_metrics)
        versions = [turn.weight_version for t in trajs for turn in t.turns]
        if versions:  # the policy versions that generated this batch, as the engine(s) reported them
            metrics.update({"rollout/version_min": min(versions), "rollout/version_max": max(versions)})
        if hasattr(self.engine, "take_served"):  # several servers: requests sent to each in this step (failed ones too)
            for i, n in enumerate(self.engine.take_served()):
                metrics[f"rollout/requests_server{i}"] = n
        return RolloutBatch(step, samples, metrics,
                            self._trajectory_records(step, every.trajs, every.rewards, prompts, every.groups),
                            time.perf_counter() - t0, min(versions) if versions else 0, corrections,
                            len(lost) / max(1, len(prompts)), first)

    async def _draw(self, step: int, prompts: list[EpisodeSample], first: int) -> DrawnGroups:
        """The episodes and rewards of ``prompts``, groups numbered from ``first`` (their index in the step)."""
        cfg, grpo = self.cfg, self.cfg.grpo
        # 1. nFrames gating: one K per prompt, a pure function of (seed, sample id).
        ks = [choose_k(s.sample_id, cfg.seed, cfg.paravt.gating.nframes_gating, cfg.paravt.gating.choices,
                       cfg.hierarchical_agent.nframes) for s in prompts]
        # 2. n episodes per prompt, all in flight at once (the engine batches them).
        jobs, groups, episode_ks = [], [], []
        for gi, (s, k) in enumerate(zip(prompts, ks), start=first):
            for j in range(grpo.n_samples):
                jobs.append(run_episode(s, self.engine, self.processor, self.episode_cfg, k,
                                        seed=stable_hash(cfg.seed, "rollout", step, gi, j), cache=self.cache,
                                        tools=self.tools))
                groups.append(gi)
                episode_ks.append(k)
        trajs = list(await asyncio.gather(*jobs, return_exceptions=True))
        # 2b. A prompt whose episodes lost work (its video does not decode, the engine or a sub-agent's
        # server failed) is skipped whole: its group's rewards would be biased. Counted and logged,
        # never the end of training.
        for i, t in enumerate(trajs):
            if isinstance(t, BaseException):
                if not isinstance(t, Exception):
                    raise t
                trajs[i] = Trajectory(prompts[groups[i] - first].sample_id, episode_ks[i], SequenceRecord(),
                                      end_reason="error", error=f"{type(t).__name__}: {t}")
        lost = sorted({gi for t, gi in zip(trajs, groups) if t.faults})
        err = None
        if lost:
            err = next(f"{prompts[gi - first].sample_id}: {t.faults[0]}" for t, gi in zip(trajs, groups) if t.faults)
            err = " ".join(err.split())[:500]
            log.warning("rollout step %d: skipped %d of %d prompt(s) that lost work (first: %s)", step, len(lost),
                        len(prompts), err)
            keep = [i for i, gi in enumerate(groups) if gi not in lost]
            trajs, groups = [trajs[i] for i in keep], [groups[i] for i in keep]
            episode_ks = [episode_ks[i] for i in keep]
        # 3. Rewards on the main agent's text as written (pure functions of paravt.rl.rewards.terms).
        knobs = cfg.paravt.knobs()
        rewards = []
        for t, gi in zip(trajs, groups):
            s = prompts[gi - first]
            executed = any(c.ok for turn in t.turns for c in turn.calls)
            rewards.append(compute_reward(t.completion_text, s.answer, s.question_type, knobs, self.judge, executed,
                                          parser=self.parser))
        return DrawnGroups(list(prompts), trajs, groups, episode_ks, rewards, lost, err)

    def _trajectory_records(self, step, trajs, rewards, prompts, groups) -> list[dict[str, Any]]:
        """A seeded random sample of the batch's episodes (not just the first group) for the viewer."""
        log_cfg = self.cfg.logging
        picked = sorted(random.Random(stable_hash(self.cfg.seed, "trajectories", step)).sample(
            range(len(trajs)), min(log_cfg.save_trajectories, len(trajs))))
        recs = []
        for i in picked:
            t, r, s = trajs[i], rewards[i], prompts[groups[i]]
            rec = t.redacted(thumbnails=log_cfg.trajectory_thumbnails)
            rec.update({"step": step, "reward": r.to_dict(), "score": r.acc, "answer": s.answer,
                        "question": s.question, "question_type": s.question_type, "span": s.extra.get("span")})
            recs.append(rec)
        return recs


class RolloutProducer(threading.Thread):
    """Collects batch i once the engine holds weights of version >= i - max_staleness."""

    def __init__(self, worker: RolloutWorker, start: int, max_steps: int, max_staleness: int):
        super().__init__(daemon=True, name="rollout-producer")
        self.worker, self.next, self.max_steps, self.max_staleness = worker, start, max_steps, max_staleness
        self.out: queue.Queue = queue.Queue(maxsize=max(1, max_staleness))
        self.version = start  # weights version in the engine
        self.cond = threading.Condition()
        self.stopping = False
        self.loop = asyncio.new_event_loop()

    def set_version(self, v: int) -> None:
        with self.cond:
            self.version = v
            self.cond.notify_all()

    def get(self) -> RolloutBatch:
        item = self.out.get()
        if isinstance(item, BaseException):
            raise RuntimeError("rollout producer failed") from item
        return item

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            while not self.stopping and self.next < self.max_steps:
                with self.cond:
                    self.cond.wait_for(lambda: self.stopping or self.next - self.version <= self.max_staleness)
                if self.stopping:
                    break
                self.out.put(self.loop.run_until_complete(self.worker.collect(self.next)))
                self.next += 1
        except BaseException as exc:  # noqa: BLE001 - hand the failure to the trainer thread
            self.out.put(exc)

    def shutdown(self, close_engine=None) -> None:
        """Stop after the batch in flight (draining the queue so it never blocks), then run
        ``close_engine()`` (a coroutine factory) on the producer's loop and close the loop."""
        self.stopping = True
        self.set_version(10**9)
        while self.is_alive():
            try:
                self.out.get(timeout=0.2)
            except queue.Empty:
                pass
        if close_engine is not None:
            try:
                self.loop.run_until_complete(close_engine())
            except Exception:  # noqa: BLE001 - closing is best-effort
                pass
        self.loop.close()
