"""PARA-GRPO training: ``bash scripts/run_rl.sh [RECIPE.yaml] [key=value ...]``.

One step, as a reader can follow it (:meth:`RLTrainer.run_step`)::

    prompts of step i (seeded order) ─► K per prompt (nFrames gating)
      ─► n episodes per prompt on the rollout engine (rank 0 drives them, concurrently)
      ─► rewards (R_acc + w·R_fmt + R_tool) ─► (r + bias)·scale ─► group norm ─► batch norm
      ─► samples (exact ids, main-agent loss mask, engine logprobs, advantage) to every rank
      ─► decoupled PPO loss + KL on each rank's share (FSDP2) ─► optimizer step
      ─► new weights to the engine (state dict in-process, checkpoint dir for a server)
      ─► metrics (JSONL + wandb) ; checkpoint every ``save_every`` steps

Rollouts come from a producer thread that may run ahead of training by at most
``grpo.max_staleness`` policy versions (0 = synchronous). A crash or kill loses only the step
in flight: ``resume=auto`` restarts from the newest complete checkpoint with the same step
counter and the same data order (prompt order, K and sampling seeds are functions of the seed
and the step). See :mod:`paravt.rl.grpo` for every departure from plain GRPO.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from paravt.agent.episode import EpisodeConfig, EpisodeSample, OverviewCache, run_episode
from paravt.agent.tools import build_tools
from paravt.core.metrics import MetricsLogger, plot_curves
from paravt.core.scoring import turn_well_formed
from paravt.core.seeding import rng, seed_everything, stable_hash
from paravt.data.schema import load_rl_rows
from paravt.engines.images import ImageInputs
from paravt.models import parallel
from paravt.models.loading import default_attn_implementation, load_model, load_processor, resolve_dtype
from paravt.rl.config import RLConfig
from paravt.rl.gating import choose_k
from paravt.rl.grpo import (compute_advantages, k1_kl_rewards, masked_moments, normalize_with, ppo_token_loss,
                            token_advantages)
from paravt.rl.rewards.terms import compute_reward

log = logging.getLogger("paravt.rl")


@dataclass
class Sample:
    """One training sequence: exact ids, loss mask, engine logprobs, images, advantage."""

    input_ids: list[int]
    loss_mask: list[int]
    behav_logprobs: list[float]
    images: ImageInputs | None
    advantage: float
    kind: str = "main"  # main | subagent | pad


@dataclass
class RolloutBatch:
    index: int
    samples: list[Sample]
    metrics: dict[str, float]
    trajectories: list[dict[str, Any]]
    seconds: float
    weight_version: int


# ---------------------------------------------------------------------------------------
# Data order
# ---------------------------------------------------------------------------------------

class PromptSchedule:
    """Step i's prompts: positions [i·P, (i+1)·P) of concatenated seeded epoch permutations."""

    def __init__(self, samples: list[EpisodeSample], per_step: int, seed: int):
        if not samples:
            raise ValueError("no RL prompts")
        self.samples, self.per_step, self.seed = samples, per_step, seed

    def batch(self, step: int) -> list[EpisodeSample]:
        n = len(self.samples)
        out = []
        for pos in range(step * self.per_step, (step + 1) * self.per_step):
            epoch, j = divmod(pos, n)
            out.append(self.samples[int(rng(self.seed, "rl-order", epoch).permutation(n)[j])])
        return out


# ---------------------------------------------------------------------------------------
# Rollouts
# ---------------------------------------------------------------------------------------

def episode_config(cfg: RLConfig) -> EpisodeConfig:
    a = cfg.hierarchical_agent
    return EpisodeConfig(prompt_mode=a.prompt_mode, prompt_source=a.prompt_source, max_turns=a.max_turns,
                         max_parallel=a.max_parallel,
                         think_prefix=cfg.paravt.constrained.think_prefix, temperature=cfg.grpo.temperature,
                         top_p=cfg.grpo.top_p, max_new_tokens=a.max_new_tokens,
                         max_context_tokens=a.max_context_tokens, crop=a.crop)


def rollout_metrics(trajs, rewards, ks, zero_std: float) -> dict[str, float]:
    n = max(len(trajs), 1)
    calls = [c for t in trajs for turn in t.turns for c in turn.calls]
    tool_turns = [turn for t in trajs for turn in t.turns if turn.calls]
    m = {
        "reward/total": sum(r.total for r in rewards) / n,
        "reward/acc": sum(r.acc for r in rewards) / n,
        "reward/format": sum(r.format for r in rewards) / n,
        "reward/tool": sum(r.tool for r in rewards) / n,
        "reward/guarded": sum(r.guarded for r in rewards) / n,
        "format/compliance": sum(bool(t.turns) and all(turn_well_formed(x.text) for x in t.turns) for t in trajs) / n,
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
    return m


async def generate_rollouts(step: int, prompts: list[EpisodeSample], engine, processor, cfg: RLConfig,
                            cache: OverviewCache, judge=None) -> RolloutBatch:
    t0 = time.perf_counter()
    ecfg = episode_config(cfg)
    tools = build_tools(ecfg.tools, crop=ecfg.crop)
    a, g = cfg.hierarchical_agent, cfg.grpo
    ks = [choose_k(s.sample_id, cfg.seed, cfg.paravt.gating.nframes_gating, cfg.paravt.gating.choices, a.nframes)
          for s in prompts]
    jobs, groups, kk = [], [], []
    for gi, (s, k) in enumerate(zip(prompts, ks)):
        for j in range(g.n_samples):
            jobs.append(run_episode(s, engine, processor, ecfg, k, seed=stable_hash(cfg.seed, "rollout", step, gi, j),
                                    cache=cache, tools=tools))
            groups.append(gi)
            kk.append(k)
    trajs = await asyncio.gather(*jobs)
    knobs = cfg.paravt.knobs()
    rewards = []
    for t, gi in zip(trajs, groups):
        s = prompts[gi]
        executed = any(c.ok for turn in t.turns for c in turn.calls)
        rewards.append(compute_reward(t.completion_text, s.answer, s.question_type, knobs, judge, executed))
    adv, extra = compute_advantages([r.total for r in rewards], groups, g.reward_bias, g.reward_scale,
                                    g.group_norm, g.batch_adv_norm and g.adv_norm_level == "sequence", g.reward_clip)
    samples: list[Sample] = []
    for t, a_ in zip(trajs, adv.tolist()):
        if t.end_reason == "error" or not t.turns:
            continue
        samples.append(Sample(t.main.input_ids, t.main.loss_mask, t.main.logprobs, t.main.images, a_))
        if cfg.hierarchical_agent.include_subagent_in_loss:
            for sub in t.subagents:
                seq = sub.sequence
                samples.append(Sample(seq.input_ids, seq.loss_mask, seq.logprobs, seq.images, a_, "subagent"))
    metrics = rollout_metrics(trajs, rewards, kk, extra["frac_reward_zero_std"])
    versions = [turn.weight_version for t in trajs for turn in t.turns]
    # A seeded random sample of the batch's episodes (not just the first group) for the viewer.
    import random  # noqa: PLC0415
    picked = sorted(random.Random(stable_hash(cfg.seed, "trajectories", step)).sample(
        range(len(trajs)), min(cfg.logging.save_trajectories, len(trajs))))
    recs = []
    for i in picked:
        t, r, s = trajs[i], rewards[i], prompts[groups[i]]
        rec = t.redacted(thumbnails=cfg.logging.trajectory_thumbnails)
        rec.update({"step": step, "reward": r.to_dict(), "score": r.acc, "answer": s.answer,
                    "question": s.question, "question_type": s.question_type, "span": s.extra.get("span")})
        recs.append(rec)
    return RolloutBatch(step, samples, metrics, recs, time.perf_counter() - t0, min(versions) if versions else 0)


class RolloutProducer(threading.Thread):
    """Generates batch i once the engine holds weights of version >= i - max_staleness."""

    def __init__(self, trainer: "RLTrainer", start: int):
        super().__init__(daemon=True, name="rollout-producer")
        self.t = trainer
        self.next = start
        self.out: queue.Queue = queue.Queue(maxsize=max(1, trainer.cfg.grpo.max_staleness))
        self.version = start  # weights version in the engine
        self.cond = threading.Condition()
        self.stop = False
        self.loop = asyncio.new_event_loop()

    def set_version(self, v: int) -> None:
        with self.cond:
            self.version = v
            self.cond.notify_all()

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        cfg = self.t.cfg
        try:
            while not self.stop and self.next < cfg.max_steps:
                with self.cond:
                    self.cond.wait_for(lambda: self.stop or self.next - self.version <= cfg.grpo.max_staleness)
                if self.stop:
                    break
                prompts = self.t.schedule.batch(self.next)
                batch = self.loop.run_until_complete(generate_rollouts(
                    self.next, prompts, self.t.engine, self.t.processor, cfg, self.t.cache, self.t.judge))
                self.out.put(batch)
                self.next += 1
        except BaseException as exc:  # noqa: BLE001 - hand the failure to the trainer thread
            self.out.put(exc)


# ---------------------------------------------------------------------------------------
# Trainer
# ---------------------------------------------------------------------------------------

def prune_weight_dirs(root: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest ``vNNNNNN`` weight exports (8B: 16 GB each in bf16).
    The server has loaded a version once ``update_weights`` returned; rollouts in flight use the
    weights in GPU memory, not the files. Returns the deleted directories."""
    import shutil  # noqa: PLC0415

    dirs = sorted(p for p in Path(root).glob("v[0-9]*") if p.is_dir())
    gone = dirs[: max(0, len(dirs) - max(1, keep))]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


class RLTrainer:
    def __init__(self, cfg: RLConfig):
        self.cfg = cfg
        self.d = parallel.init_distributed()
        cfg.check_world_size(self.d.world_size)
        seed_everything(cfg.seed + self.d.rank)
        self.out = Path(cfg.output_dir)
        self.ckpt_root = self.out / "checkpoints"
        self.processor = load_processor(cfg.model_path, cfg.hierarchical_agent.crop.min_pixels,
                                        cfg.hierarchical_agent.crop.max_pixels)
        self.tokenizer = self.processor.tokenizer
        compute = resolve_dtype(cfg.trainer.dtype)
        attn = cfg.trainer.attn_implementation or default_attn_implementation()
        actor = load_model(cfg.model_path, dtype="float32", attn_implementation=attn)
        if cfg.trainer.gradient_checkpointing:
            actor.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        actor.config.use_cache = False
        actor.to(self.d.device)
        self.image_token_id = actor.config.image_token_id
        ref = None
        if cfg.grpo.kl_coef > 0:
            ref = load_model(cfg.ref_model_path or cfg.model_path, dtype=cfg.trainer.dtype, attn_implementation=attn)
            ref.requires_grad_(False)
            ref.eval().to(self.d.device)
        if cfg.trainer.strategy == "fsdp2":
            actor = parallel.wrap_fsdp2(actor, self.d, compute)
            if ref is not None:
                ref = parallel.wrap_fsdp2(ref, self.d, None)
        self.actor, self.ref = actor, ref
        self.optimizer = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=cfg.optim.lr,
                                           betas=tuple(cfg.optim.betas), eps=cfg.optim.eps,
                                           weight_decay=cfg.optim.weight_decay)
        self.step = 0
        self.engine = self.control = self.server = None
        self.cache = OverviewCache(max_items=4 * cfg.grpo.prompts_per_step)
        self.judge = None
        if self.d.is_main:
            rows, report = load_rl_rows(cfg.train_data)
            log.info("RL data: %s", report.summary())
            self.data_report = report.to_dict()
            self.schedule = PromptSchedule([EpisodeSample.from_row(r) for r in rows], cfg.grpo.prompts_per_step, cfg.seed)
            if cfg.paravt.reward.mode == "llm":
                from paravt.rl.rewards.judge import LLMJudge  # noqa: PLC0415
                self.judge = LLMJudge(cfg.judge)

    # ------------------------------------------------------------------ engine
    def _start_engine(self, weights: str) -> None:
        """Rank 0 only: the rollout engine, loaded with the weights at ``weights``."""
        r = self.cfg.rollout
        if r.engine == "hf":
            from paravt.engines.hf import HFEngine  # noqa: PLC0415
            self.engine = HFEngine.from_pretrained(weights, dtype=r.dtype, batch_wait_s=r.batch_wait_s,
                                                   seed=self.cfg.seed)
            return
        from paravt.engines.sglang import SGLangEngine, SGLangServer  # noqa: PLC0415
        if r.engine == "hf_server":
            port = parallel._free_port()
            self.server = subprocess.Popen([sys.executable, "-m", "paravt.engines.hf_server", "--model", weights,
                                            "--port", str(port), "--dtype", r.dtype],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            url = f"http://127.0.0.1:{port}"
            _wait_http(url + "/health", self.server)
        else:
            scfg = r.server
            scfg.model_path = weights
            self.server = SGLangServer(scfg).start()
            url = scfg.url
        from paravt.engines.hf import vision_token_ids  # noqa: PLC0415
        self.engine = SGLangEngine(url, server=self.server if isinstance(self.server, SGLangServer) else None,
                                   banned_token_ids=vision_token_ids(self.tokenizer),
                                   image_token_id=self.tokenizer.convert_tokens_to_ids("<|image_pad|>"))
        self.control = SGLangEngine(url)

    def _sync_weights(self, version: int) -> float:
        """Push the actor's weights to the engine. Collective: every rank calls it."""
        t0 = time.perf_counter()
        if self.cfg.rollout.engine == "hf":
            sd = parallel.full_state_dict(self.actor)
            if self.d.is_main:
                self.engine._load_state({k: v for k, v in sd.items()})
                self.engine.weight_version = version
        else:
            # In the trainer's dtype (bf16 for the 8B: half the bytes of fp32 to write and load).
            path = parallel.export_hf(self.actor, self.processor, self.out / "weights" / f"v{version:06d}", self.d,
                                      dtype=resolve_dtype(self.cfg.trainer.dtype))
            if self.d.is_main:
                asyncio.run(self.control.update_weights(str(path), version))
                asyncio.run(self.control.close())
                prune_weight_dirs(self.out / "weights", keep=self.cfg.grpo.max_staleness + 1)
        parallel.barrier()
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ losses
    def _forward_logps(self, model, s: Sample) -> tuple[torch.Tensor, torch.Tensor]:
        """(log p of each next token, entropy) at the positions that predict policy tokens."""
        ids = torch.tensor([s.input_ids], device=self.d.device)
        kw: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                              "mm_token_type_ids": (ids == self.image_token_id).long(), "use_cache": False}
        if s.images is not None and len(s.images):
            pv, grid = s.images.tensors(self.processor)
            kw["pixel_values"], kw["image_grid_thw"] = pv.to(self.d.device), grid.to(self.d.device)
        logits = model(**kw).logits[0, :-1].float() / max(self.cfg.grpo.temperature, 1e-6)
        target = ids[0, 1:]
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(1, target[:, None]).squeeze(1)
        ent = -(logp_all.exp() * logp_all).sum(-1)
        return logp, ent

    def train_on(self, samples: list[Sample]) -> dict[str, float]:
        cfg = self.cfg
        n_local = sum(sum(s.loss_mask[1:]) for s in samples)
        n_global = parallel.all_reduce_sum(n_local)
        scale = self.d.world_size / max(n_global, 1.0)
        self.actor.train()
        tot = Counter()
        mbs = [samples[i::cfg.grpo.ppo_minibatches] for i in range(cfg.grpo.ppo_minibatches)]
        prox_cache: dict[int, torch.Tensor] = {}
        if cfg.grpo.ppo_minibatches > 1:  # proximal logprobs before any update of this step
            with torch.no_grad():
                for i, s in enumerate(samples):
                    prox_cache[id(s)] = self._forward_logps(self.actor, s)[0]
        token_adv = self._token_advantages(samples)
        loss_kl = cfg.grpo.kl_coef if cfg.grpo.kl_mode == "loss_k3" else 0.0
        grad_norm = 0.0
        for mb in mbs:
            for s in mb:
                mask = torch.tensor(s.loss_mask[1:], device=self.d.device, dtype=torch.bool)
                behav = torch.tensor(s.behav_logprobs[1:], device=self.d.device)
                logp, ent = self._forward_logps(self.actor, s)
                prox = prox_cache.get(id(s), logp.detach())
                ref = None
                if self.ref is not None and loss_kl > 0:
                    with torch.no_grad():
                        ref = self._forward_logps(self.ref, s)[0]
                adv = token_adv[id(s)].to(logp) if id(s) in token_adv else torch.full_like(logp, s.advantage)
                out = ppo_token_loss(logp, prox, behav, ref, adv, mask, cfg.grpo.clip_eps, loss_kl,
                                     cfg.grpo.behav_imp_weight_cap)
                (out.loss_sum * scale).backward()
                tot["loss"] += float(out.loss_sum.detach())
                tot["tokens"] += out.n_tokens
                tot["clipped"] += out.clipped
                tot["dropped"] += out.dropped
                tot["kl"] += out.kl_sum
                tot["entropy"] += float((ent.detach() * mask).sum())
                tot["gap"] += float(((prox - behav).abs() * mask).sum())
                tot["mask"] += int(mask.sum())
            grad_norm = parallel.clip_grad_norm(self.actor.parameters(), cfg.optim.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        g = {k: parallel.all_reduce_sum(v) for k, v in tot.items()}
        m = max(g["mask"], 1.0)
        return {"ppo/loss": g["loss"] / max(n_global, 1.0), "ppo/clip_ratio": g["clipped"] / m,
                "ppo/behav_dropped_ratio": g["dropped"] / m, "ppo/kl": g["kl"] / m,
                "ppo/kl_reward": parallel.all_reduce_sum(self.kl_reward_sum) / m, "ppo/entropy": g["entropy"] / m,
                "rollout/logprob_gap": g["gap"] / m, "ppo/grad_norm": grad_norm, "ppo/tokens": n_global}

    def _token_advantages(self, samples: list[Sample]) -> dict[int, torch.Tensor]:
        """Per-token advantages when they differ from the sequence's scalar: the release's k1 KL
        reward (return-to-go added per token) and/or batch normalisation over the policy tokens of
        every rank. Empty when ``kl_mode=loss_k3`` and ``adv_norm_level=sequence``."""
        g = self.cfg.grpo
        kl_reward = g.kl_mode == "reward_k1" and g.kl_coef > 0 and self.ref is not None
        token_norm = g.batch_adv_norm and g.adv_norm_level == "token"
        self.kl_reward_sum = 0.0
        if not (kl_reward or token_norm):
            return {}
        advs, masks = {}, {}
        for s in samples:
            mask = torch.tensor(s.loss_mask[1:], dtype=torch.float64)
            klr = None
            if kl_reward:
                with torch.no_grad():
                    ref = self._forward_logps(self.ref, s)[0].double().cpu()
                klr = k1_kl_rewards(torch.tensor(s.behav_logprobs[1:], dtype=torch.float64), ref, mask, g.kl_coef)
                self.kl_reward_sum += float(klr.sum())
            advs[id(s)], masks[id(s)] = token_advantages(s.advantage, mask, klr), mask
        if token_norm:
            tot, sq, n = masked_moments(list(advs.values()), list(masks.values()))
            tot, sq, n = (parallel.all_reduce_sum(x) for x in (tot, sq, n))
            advs = {k: normalize_with(a, masks[k], tot, sq, n) for k, a in advs.items()}
        return advs

    def _shard(self, samples: list[Sample]) -> list[Sample]:
        """This rank's share; every rank gets the same count (FSDP collectives), padding with
        zero-mask copies when sub-agent samples make the count uneven."""
        w = self.d.world_size
        per = -(-len(samples) // w) if samples else 1
        mine = samples[self.d.rank::w]
        while len(mine) < per:
            src = samples[0] if samples else None
            if src is None:
                break
            mine.append(Sample(src.input_ids, [0] * len(src.loss_mask), src.behav_logprobs, src.images, 0.0, "pad"))
        return mine

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        path = parallel.step_dir(self.ckpt_root, self.step)
        state = {"step": self.step, "config": asdict(self.cfg)}
        parallel.save_resumable(path, self.actor, self.optimizer, state, self.d)
        parallel.export_hf(self.actor, self.processor, path / "hf", self.d)
        parallel.mark_complete(path, self.d, self.cfg.keep_last)
        return path

    def _resume(self) -> str:
        """The weights the engine should start from (SFT model or the resumed checkpoint)."""
        r = self.cfg.resume
        if r == "never":
            return self.cfg.model_path
        path = parallel.latest_complete(self.ckpt_root) if r == "auto" else Path(r)
        if path is None:
            return self.cfg.model_path
        state, _ = parallel.load_resumable(path, self.actor, self.optimizer, self.d)
        self.step = state["step"]
        if self.d.is_main:
            log.info("resumed from %s at step %d", path, self.step)
        return str(path / "hf")

    # ------------------------------------------------------------------ loop
    def train(self, until: int | None = None) -> Path:
        cfg = self.cfg
        weights = self._resume()
        logger = MetricsLogger(self.out / "metrics.jsonl", enabled=self.d.is_main,
                               wandb_project=cfg.logging.wandb_project, wandb_mode=cfg.logging.wandb_mode,
                               run_name=self.out.name, config=asdict(cfg), resume_step=self.step + 1)
        producer = None
        bar = None
        if self.d.is_main:
            self._start_engine(weights)
            producer = RolloutProducer(self, self.step)
            producer.start()
            if cfg.logging.progress:
                from tqdm import tqdm  # noqa: PLC0415
                bar = tqdm(total=cfg.max_steps, initial=self.step, desc="para-grpo", dynamic_ncols=True)
        try:
            while self.step < cfg.max_steps:
                t0 = time.perf_counter()
                batch = None
                if self.d.is_main:
                    batch = producer.out.get()
                    if isinstance(batch, BaseException):
                        raise RuntimeError("rollout producer failed") from batch
                t_wait = time.perf_counter() - t0
                payload = parallel.broadcast_object(
                    (batch.samples, batch.index) if batch is not None else None)
                samples, index = payload
                if index != self.step:
                    raise RuntimeError(f"rollout batch {index} does not match step {self.step}")
                t1 = time.perf_counter()
                m = self.train_on(self._shard(samples))
                t_train = time.perf_counter() - t1
                self.step += 1
                t_sync = self._sync_weights(self.step)
                if producer is not None:
                    producer.set_version(self.step)
                if self.d.is_main:
                    m.update(batch.metrics)
                    m.update({"time/rollout": batch.seconds, "time/wait_rollout": t_wait, "time/train": t_train,
                              "time/sync": t_sync, "time/step": time.perf_counter() - t0,
                              "rollout/staleness": self.step - 1 - batch.weight_version,
                              "rollout/samples": len(samples)})
                    logger.log(m, self.step)
                    with open(self.out / "trajectories.jsonl", "a") as f:
                        for rec in batch.trajectories:
                            f.write(json.dumps(rec) + "\n")
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(R=f"{m['reward/total']:.2f}", acc=f"{m['reward/acc']:.2f}",
                                        fmt=f"{m['format/compliance']:.2f}", tools=f"{m['tools/call_frequency']:.2f}")
                if self.step % cfg.save_every == 0 or self.step == cfg.max_steps:
                    self.save()
                if until is not None and self.step >= until:
                    break
        finally:
            if producer is not None:
                producer.stop = True
                producer.set_version(10**9)
                while producer.is_alive():  # let an in-flight batch finish; drain so it never blocks
                    try:
                        producer.out.get(timeout=0.2)
                    except queue.Empty:
                        pass
            if bar is not None:
                bar.close()
            logger.close()
            self._stop_engine(producer)
        last = parallel.step_dir(self.ckpt_root, self.step) / "hf"
        if self.d.is_main:
            final = self.out / "final"
            if final.is_symlink():
                final.unlink()
            if not final.exists() and last.exists():
                final.symlink_to(last.resolve(), target_is_directory=True)
            plot_curves(self.out / "metrics.jsonl",
                        ["reward/total", "reward/acc", "reward/format", "reward/tool", "format/compliance",
                         "tools/call_frequency", "tools/calls_per_turn", "tools/failure_frequency",
                         "frac_reward_zero_std", "ppo/kl", "ppo/entropy", "completions/mean_length"],
                        self.out / "curves.png", title="PARA-GRPO", smooth=3)
        parallel.barrier()
        return last

    def _stop_engine(self, producer: "RolloutProducer | None" = None) -> None:
        if self.engine is not None and producer is not None:
            try:
                producer.loop.run_until_complete(self.engine.close())
            except Exception:  # noqa: BLE001
                pass
            producer.loop.close()
        if self.server is not None:
            if isinstance(self.server, subprocess.Popen):
                self.server.terminate()
                self.server.wait(timeout=30)
            else:
                self.server.stop()


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    import requests  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rollout server exited with code {proc.returncode}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            time.sleep(0.5)
    raise RuntimeError(f"rollout server at {url} not healthy after {timeout:.0f} s")


def main(argv: list[str] | None = None) -> int:
    return parallel.run_trainer(RLTrainer, RLConfig, argv, "python -m paravt.rl.train", "RL")


if __name__ == "__main__":
    sys.exit(main())
