"""PARA-GRPO training, the trainer (its command line: :mod:`paravt.rl.train`, launched by ``bash scripts/run_rl.sh``).

One step, top to bottom (:meth:`RLTrainer.train` → :meth:`RLTrainer.step`)::

    batch = producer.get()              rank 0: RolloutWorker.collect(i) in a background thread
                                        (paravt.rl.rollout: K, episodes, rewards, advantages)
    samples → every rank (broadcast) → this rank's share
    decoupled PPO loss (+ KL) on the share, FSDP2 all-reduce, optimizer step     (RLTrainer.step)
    [GTR on: + λ · NLL of corrected thoughts from the buffer]                     (paravt.rl.gtr)
    new weights → engine through its public update_weights                       (EngineHandle.push_weights)
    metrics (JSONL + wandb); checkpoint every ``save_every`` steps

The producer may run ahead of training by at most ``grpo.max_staleness`` policy versions
(0 = synchronous). A crash or kill loses only the step in flight: ``resume=auto`` restarts
from the newest complete checkpoint with the same step counter and data order (prompt order,
K and sampling seeds are functions of the seed and the step). :mod:`paravt.rl.grpo` lists
every departure from plain GRPO.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import torch

from paravt.agent.episode import EpisodeSample
from paravt.core.metrics import append_jsonl, trim_jsonl
from paravt.core.seeding import seed_everything
from paravt.data.schema import load_rl_rows
from paravt.engines.factory import EngineHandle
from paravt.models import parallel
from paravt.models.stage_main import RunAborted
from paravt.models.loading import (default_attn_implementation, enable_activation_checkpointing, load_model, load_processor,
                                   resolve_dtype)
from paravt.models.packed_attention import VARLEN_IMPLEMENTATIONS
from paravt.models.tokenize import vision_token_ids
from paravt.models.trainloop import TrainLoop
from paravt.rl.config import RLConfig
from paravt.rl.grpo import WeightStats, k1_kl_rewards, masked_moments, normalize_with, ppo_token_loss, token_advantages
from paravt.rl.logps import forward_logps
from paravt.rl.packing import bins, equalize, packed_logps
from paravt.rl.engine_sync import RolloutEngineMixin
from paravt.rl.lost_work import LostWorkMixin
from paravt.rl.rollout import PromptSchedule, RolloutBatch, RolloutProducer, RolloutWorker, Sample

log = logging.getLogger("paravt.rl")

CURVES = ["reward/total", "reward/acc", "reward/format", "reward/tool", "format/compliance", "tools/call_frequency",
          "tools/calls_per_turn", "tools/failure_frequency", "frac_reward_zero_std", "ppo/kl", "ppo/entropy",
          "completions/mean_length"]
GTR_CURVES = ["gtr/corrected_fraction", "gtr/valid_thought_fraction", "gtr/thought_state_consistency",
              "gtr/distinct_thought_fraction", "gtr/nll", "ppo/entropy_think"]


class RLTrainer(RolloutEngineMixin, LostWorkMixin):
    def __init__(self, cfg: RLConfig):
        self.cfg = cfg
        self.d = parallel.init_distributed()
        cfg.check_world_size(self.d.world_size)
        seed_everything(cfg.seed + self.d.rank)
        self.out = Path(cfg.output_dir)
        self.ckpt_root = self.out / "checkpoints"
        self.processor = load_processor(cfg.model_path, cfg.hierarchical_agent.crop.min_pixels,
                                        cfg.hierarchical_agent.crop.max_pixels)
        compute = resolve_dtype(cfg.trainer.dtype)
        attn = cfg.trainer.attn_implementation or default_attn_implementation()
        def prepare_actor(m) -> None:
            if cfg.trainer.gradient_checkpointing:
                enable_activation_checkpointing(m)
            m.config.use_cache = False

        ref_path = cfg.ref_model_path or cfg.model_path
        if cfg.trainer.strategy == "fsdp2":
            # Sharded start-up: rank 0 reads each checkpoint, every rank keeps its shards (parallel.load_fsdp2).
            actor = parallel.load_fsdp2(cfg.model_path, self.d, dtype="float32", attn_implementation=attn,
                                        compute_dtype=compute, prepare=prepare_actor, sharded=cfg.trainer.sharded_init)
            ref = parallel.load_fsdp2(ref_path, self.d, dtype=cfg.trainer.dtype, attn_implementation=attn,
                                      prepare=lambda m: m.requires_grad_(False), sharded=cfg.trainer.sharded_init) \
                if cfg.grpo.kl_coef > 0 else None
        else:
            actor = load_model(cfg.model_path, dtype="float32", attn_implementation=attn)
            prepare_actor(actor)
            actor.to(self.d.device)
            ref = None
            if cfg.grpo.kl_coef > 0:
                ref = load_model(ref_path, dtype=cfg.trainer.dtype, attn_implementation=attn)
                ref.requires_grad_(False)
                ref.to(self.d.device)
        if ref is not None:
            ref.eval()
        self.image_token_id = actor.config.image_token_id
        self.vision_ids = torch.tensor(vision_token_ids(self.processor.tokenizer), dtype=torch.long)
        self.actor, self.ref = actor, ref
        self.optimizer = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=cfg.optim.lr,
                                           betas=tuple(cfg.optim.betas), eps=cfg.optim.eps,
                                           weight_decay=cfg.optim.weight_decay, **parallel.adamw_kwargs(self.d.device))
        self.global_step = 0  # completed steps (= the policy version the engine should hold)
        self.bad_steps = 0  # rank 0: consecutive steps that lost more than rollout.max_skipped_fraction
        self.first_bad_error: str | None = None
        self.handle: EngineHandle | None = None
        self.gtr = None
        if cfg.gtr.mode != "off":
            from paravt.rl.gtr import GTR  # noqa: PLC0415
            self.gtr = GTR(cfg, self.processor, is_main=self.d.is_main)
        self.kl_reward_sum = 0.0
        self.schedule = self.judge = None
        if self.d.is_main:
            rows, report = load_rl_rows(cfg.train_data)
            log.info("RL data: %s", report.summary())
            self.data_report = report.to_dict()
            self.schedule = PromptSchedule([EpisodeSample.from_row(r) for r in rows], cfg.grpo.prompts_per_step,
                                           cfg.seed)
            if cfg.paravt.reward.mode == "llm":
                from paravt.rl.rewards.judge import LLMJudge  # noqa: PLC0415
                self.judge = LLMJudge(cfg.judge)

    # ------------------------------------------------------------------ one step
    def step(self, batch: RolloutBatch | None) -> dict[str, float]:
        """One optimizer step on rank 0's ``batch`` (None on the other ranks), then the weight push.
        Collective: every rank calls it. Returns the training metrics (rank 0 adds the batch's)."""
        sft = None
        if batch is not None and self.gtr is not None:  # GTR: buffer this step's corrections, draw SFT samples
            sft = self.gtr.draw(batch.corrections, self.global_step, len(batch.samples))
        samples, index, sft = parallel.broadcast_object(
            (batch.samples, batch.index, sft) if batch is not None else None)
        if index != self.global_step:
            raise RuntimeError(f"rollout batch {index} does not match step {self.global_step}")
        t0 = time.perf_counter()
        m = self.train_on(self._shard(samples), self._shard(sft) if sft else [])
        m["time/train"] = time.perf_counter() - t0
        self.global_step += 1
        m["time/sync"] = self._push_weights(self.global_step)
        if batch is not None:
            m.update(batch.metrics)
            m.update({"time/rollout": batch.seconds, "rollout/staleness": self.global_step - 1 - batch.weight_version,
                      "rollout/samples": len(samples)})
        return m

    # ------------------------------------------------------------------ losses
    def _forward_logps(self, model, s: Sample, temperature: float | None = None,
                       with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log p of each next token, entropy or None) per position (position t predicts token t+1), at the
        rollout temperature unless ``temperature`` is given (1.0 for the GTR NLL). Logits only at the
        sample's policy tokens (the positions the loss reads); 0 elsewhere."""
        temp = self.cfg.grpo.temperature if temperature is None else temperature
        positions = [t for t, m in enumerate(s.loss_mask[1:]) if m]
        return forward_logps(model, s.input_ids, s.images, self.processor, self.image_token_id, self.vision_ids, temp,
                             self.d.device, positions=positions, with_entropy=with_entropy)

    def _packs(self, samples: list[Sample]) -> list[list[Sample]]:
        """This rank's samples in forwards of at most ``trainer.pack_tokens`` tokens (0, or an attention without
        varlen such as plain ``sdpa``: one per sample), as many on every rank (FSDP's collectives)."""
        varlen = self.actor.config._attn_implementation in VARLEN_IMPLEMENTATIONS
        budget = self.cfg.trainer.pack_tokens if varlen else 0
        packs = bins(samples, budget) if budget > 0 else [[s] for s in samples]
        return equalize(packs, int(parallel.all_reduce_max(len(packs))))

    def _logps(self, model, pack: list[Sample], with_entropy: bool = False):
        """[(log p, entropy or None)] of each sample of ``pack`` from one forward (:mod:`paravt.rl.packing`)."""
        if len(pack) == 1:
            return [self._forward_logps(model, pack[0], with_entropy=with_entropy)]
        return packed_logps(model, pack, self.processor, self.image_token_id, self.vision_ids, self.cfg.grpo.temperature,
                            self.d.device, [[t for t, m in enumerate(s.loss_mask[1:]) if m] for s in pack], with_entropy)

    def train_on(self, samples: list[Sample], sft_samples: list[Sample] = ()) -> dict[str, float]:
        """PPO (+ KL) over this rank's ``samples``, plus λ·NLL over ``sft_samples`` (GTR), normalised
        over the policy tokens of all ranks; ``ppo_minibatches`` optimizer steps."""
        cfg = self.cfg
        n_local = sum(sum(s.loss_mask[1:]) for s in samples)
        n_global = parallel.all_reduce_sum(n_local)
        if n_global == 0 and parallel.all_reduce_sum(len(sft_samples)) == 0:
            # Nothing to learn from (every prompt of the step was skipped): no optimizer step at all.
            return {"ppo/optimizer_skipped": 1.0, "ppo/tokens": 0.0}
        scale = self.d.world_size / max(n_global, 1.0)
        self.actor.train()
        tot = Counter()
        mbs = [samples[i::cfg.grpo.ppo_minibatches] for i in range(cfg.grpo.ppo_minibatches)]
        prox_cache: dict[int, torch.Tensor] = {}
        if cfg.grpo.ppo_minibatches > 1:  # proximal logprobs before any update of this step
            with torch.no_grad():
                for pack in self._packs(samples):
                    prox_cache.update((id(s), lp) for s, (lp, _) in zip(pack, self._logps(self.actor, pack)))
        token_adv = self._token_advantages(samples)
        loss_kl = cfg.grpo.kl_coef if cfg.grpo.kl_mode == "loss_k3" else 0.0
        think_w = cfg.gtr.think_weight if self.gtr is not None else 1.0
        n_sft = parallel.all_reduce_sum(sum(sum(s.loss_mask[1:]) for s in sft_samples))
        grad_norm = 0.0
        gap_max = 0.0  # largest |trainer logprob - engine logprob| over this step's policy tokens
        wstats = WeightStats()  # the behaviour weight the loss applies: what the numerics gate reads
        for mi, mb in enumerate(mbs):
            for pack in self._packs(mb):
                refs = [None] * len(pack)
                if self.ref is not None and loss_kl > 0:
                    with torch.no_grad():
                        refs = [lp for lp, _ in self._logps(self.ref, pack)]
                pack_loss = 0.0
                for s, (logp, ent), ref in zip(pack, self._logps(self.actor, pack, with_entropy=True), refs):
                    loss_sum, gap = self._sample_loss(s, logp, ent, ref, prox_cache.get(id(s), logp.detach()),
                                                      token_adv, loss_kl, think_w, tot, wstats)
                    pack_loss = pack_loss + loss_sum
                    gap_max = max(gap_max, gap)
                (pack_loss * scale).backward()
            if mi == 0 and sft_samples:  # GTR: λ·NLL joins the first optimizer step (same count on every rank)
                nll_sum, n_tok = self.gtr.nll_backward(self, sft_samples, n_sft)
                tot["sft_nll"] += nll_sum
                tot["sft_tokens"] += n_tok
            grad_norm = parallel.clip_grad_norm(self.actor.parameters(), cfg.optim.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        g = {k: parallel.all_reduce_sum(tot.get(k, 0.0)) for k in
             ("loss", "clipped", "dropped", "kl", "entropy", "gap", "mask", "ent_think", "n_think", "ent_action",
              "n_action", "sft_nll", "sft_tokens", "truncated", "rejected")}
        m = max(g["mask"], 1.0)
        out = {"ppo/loss": g["loss"] / max(n_global, 1.0), "ppo/clip_ratio": g["clipped"] / m,
               "ppo/behav_dropped_ratio": g["dropped"] / m, "ppo/kl": g["kl"] / m,
               "ppo/kl_reward": parallel.all_reduce_sum(self.kl_reward_sum) / m, "ppo/entropy": g["entropy"] / m,
               "rollout/logprob_gap": g["gap"] / m, "rollout/logprob_gap_max": parallel.all_reduce_max(gap_max),
               "ppo/grad_norm": grad_norm, "ppo/tokens": n_global}
        out.update(wstats.metrics(parallel.all_reduce_sum_tensor(wstats.vector())))
        if cfg.grpo.rollout_is or cfg.grpo.rollout_rs:
            out["rollout_corr/truncated_ratio"] = g["truncated"] / m
            out["rollout_corr/rejected_ratio"] = g["rejected"] / m
        if g["n_think"]:
            out["ppo/entropy_think"] = g["ent_think"] / g["n_think"]
        if g["n_action"]:
            out["ppo/entropy_action"] = g["ent_action"] / g["n_action"]
        if self.gtr is not None and cfg.gtr.mode == "train":  # observe mode has no NLL term
            out["gtr/nll"] = g["sft_nll"] / g["sft_tokens"] if g["sft_tokens"] else 0.0
            out["gtr/sft_tokens"] = g["sft_tokens"]
        return out

    def _sample_loss(self, s: Sample, logp, ent, ref, prox, token_adv, loss_kl: float, think_w: float, tot: Counter,
                     wstats: WeightStats) -> tuple[torch.Tensor, float]:
        """One sample's PPO loss sum (+ its metrics into ``tot`` and ``wstats``); its largest logprob gap."""
        cfg = self.cfg
        mask = torch.tensor(s.loss_mask[1:], device=self.d.device, dtype=torch.bool)
        behav = torch.tensor(s.behav_logprobs[1:], device=self.d.device)
        adv = token_adv[id(s)].to(logp) if id(s) in token_adv else torch.full_like(logp, s.advantage)
        weight = None
        think = torch.tensor(s.think_mask[1:], device=self.d.device, dtype=torch.bool) \
            if s.think_mask is not None else None
        if think is not None and think_w != 1.0:
            weight = torch.where(think, torch.full_like(logp, think_w), torch.ones_like(logp))
        out = ppo_token_loss(logp, prox, behav, ref, adv, mask, cfg.grpo.clip_eps, loss_kl, cfg.grpo.behav_imp_weight_cap,
                             token_weight=weight, is_level=cfg.grpo.rollout_is, rs_level=cfg.grpo.rollout_rs,
                             corr_cap=cfg.grpo.rollout_corr_cap)
        wstats.add(out.log_w, cfg.grpo.behav_imp_weight_cap)
        ent_d = ent.detach()
        gap = (prox - behav).abs() * mask
        tot.update({"loss": float(out.loss_sum.detach()), "tokens": out.n_tokens, "clipped": out.clipped,
                    "dropped": out.dropped, "kl": out.kl_sum, "entropy": float((ent_d * mask).sum()),
                    "gap": float(gap.sum()), "mask": int(mask.sum()), "truncated": out.truncated,
                    "rejected": out.rejected})
        if think is not None:
            tot.update({"ent_think": float((ent_d * (mask & think)).sum()), "n_think": int((mask & think).sum()),
                        "ent_action": float((ent_d * (mask & ~think)).sum()), "n_action": int((mask & ~think).sum())})
        return out.loss_sum, float(gap.max()) if gap.numel() else 0.0

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
        refs = {}
        if kl_reward:
            with torch.no_grad():
                for pack in self._packs(samples):
                    refs.update((id(s), lp.double().cpu()) for s, (lp, _) in zip(pack, self._logps(self.ref, pack)))
        for s in samples:
            mask = torch.tensor(s.loss_mask[1:], dtype=torch.float64)
            klr = None
            if kl_reward:
                ref = refs[id(s)]
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
        while len(mine) < per and samples:
            src = samples[0]
            mine.append(Sample(src.input_ids, [0] * len(src.loss_mask), src.behav_logprobs, src.images, 0.0, "pad"))
        return mine

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        path = parallel.step_dir(self.ckpt_root, self.global_step)
        state = {"step": self.global_step, "config": asdict(self.cfg)}
        parallel.save_resumable(path, self.actor, self.optimizer, state, self.d)
        # The HF export in the trainer's dtype (bf16 for the 8B: ~17.5 GB, not fp32's ~35 GB); the fp32 master
        # weights and the optimizer state are in the sharded DCP checkpoint beside it.
        parallel.export_hf(self.actor, self.processor, path / "hf", self.d, dtype=resolve_dtype(self.cfg.trainer.dtype))
        if self.gtr is not None and self.d.is_main:
            self.gtr.save(path)
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
        self.global_step = state["step"]
        if self.gtr is not None:
            self.gtr.load(path)
        if self.d.is_main:
            log.info("resumed from %s at step %d", path, self.global_step)
        return str(path / "hf")

    # ------------------------------------------------------------------ loop
    def _start_rollouts(self) -> RolloutProducer:
        """Rank 0: the producer thread over the started engine."""
        worker = RolloutWorker(self.cfg, self.handle.engine, self.processor, self.schedule, self.judge, self.gtr)
        if self.gtr is not None:
            self.gtr.attach(worker)
        producer = RolloutProducer(worker, self.global_step, self.cfg.max_steps, self.cfg.grpo.max_staleness)
        producer.start()
        return producer

    async def _close_clients(self) -> None:
        await self.handle.aclose()
        if self.gtr is not None:
            await self.gtr.aclose()

    def train(self, until: int | None = None) -> Path:
        """Train to ``max_steps`` (or stop after step ``until``, as a crash would)."""
        cfg = self.cfg
        weights = self._resume()
        self.out.mkdir(parents=True, exist_ok=True)
        if self.d.is_main:  # records of steps after the checkpoint are redone: drop them, never double them
            trim_jsonl(self.out / "trajectories.jsonl", lambda r: r.get("step", 0) < self.global_step)
        producer = None
        r = cfg.rollout
        start_s = max(r.server.startup_timeout_s, r.vllm.startup_timeout_s) * max(1, r.replicas) + 600
        try:
            if self.d.is_main:
                try:
                    self._start_engine(weights)
                except Exception as exc:  # the other ranks end with this line, not with a collective's timeout
                    msg = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
                    parallel.announce("engine_start", msg)
                    raise RunAborted(f"the rollout engine did not start: {msg}") from None
                parallel.announce("engine_start")
            else:  # rank 0 may take up to the servers' start-up timeout: wait for it here, not in a collective
                parallel.await_rank0("engine_start", start_s)
            if cfg.rollout.urls:  # servers this run did not launch hold unknown weights: push this run's first
                self._push_weights(self.global_step)
            producer = self._start_rollouts() if self.d.is_main else None
            para = cfg.paravt.anchoring.weight > 0 or cfg.paravt.gating.nframes_gating  # else vanilla GRPO
            with TrainLoop(self, "para-grpo" if para else "grpo") as loop:
                while self.global_step < cfg.max_steps:
                    t0 = time.perf_counter()
                    batch = producer.get() if producer is not None else None
                    t_wait = time.perf_counter() - t0
                    self._check_lost_work(batch)
                    m = self.step(batch)
                    m.update({"time/wait_rollout": t_wait, "time/step": time.perf_counter() - t0})
                    if batch is not None:
                        producer.set_version(self.global_step)
                        append_jsonl(self.out / "trajectories.jsonl", batch.trajectories)
                    loop.log(m if self.d.is_main else None, self.global_step, {
                        "R": f"{m.get('reward/total', 0):.2f}", "acc": f"{m.get('reward/acc', 0):.2f}",
                        "fmt": f"{m.get('format/compliance', 0):.2f}",
                        "tools": f"{m.get('tools/call_frequency', 0):.2f}"} if self.d.is_main else None)
                    if self.global_step % cfg.save_every == 0 or self.global_step == cfg.max_steps:
                        self.save()
                    if until is not None and self.global_step >= until:
                        break
                self._check_ended_well()
        finally:
            if producer is not None:
                producer.shutdown(self._close_clients)
            if self.handle is not None:
                self.handle.stop()
        return loop.finish(CURVES + (GTR_CURVES if self.gtr is not None else []), "curves.png", "PARA-GRPO",
                           smooth=3)

