"""PARA-GRPO training, the trainer (its command line: :mod:`paravt.rl.train`, launched by ``bash scripts/run_rl.sh``).

One step, top to bottom (:meth:`RLTrainer.train` → :meth:`RLTrainer.step`)::

    batch = producer.get()              rank 0: RolloutWorker.collect(i) in a background thread
                                        (paravt.rl.rollout: K, episodes, rewards, advantages)
    samples → every rank (paravt.rl.transfer): minibatches of the whole list, each split over the ranks by tokens
    decoupled PPO loss (+ KL) on this rank's part, FSDP2 gradient averaging,      (RLTrainer.train_on,
    optimizer step; [GTR on: + λ · NLL of corrected thoughts from the buffer]      paravt.rl.grpo, paravt.rl.gtr)
    new weights → engine, as the run's WeightUpdate says                  (EngineSync.push → EngineHandle.push_weights)
    lost work counted: a run that keeps losing prompts stops with exit 3         (LostWork.check)
    metrics (JSONL + wandb); checkpoint every ``save_every`` steps

The producer may run ahead of training by at most ``grpo.max_staleness`` policy versions
(0 = synchronous). A crash or kill loses only the step in flight: ``resume=auto`` restarts
from the newest complete checkpoint with the same step counter and data order (prompt order,
K and sampling seeds are functions of the seed and the step). :mod:`paravt.rl.grpo` lists
every departure from plain GRPO.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from paravt.agent.episode import EpisodeSample
from paravt.core.metrics import append_jsonl, trim_jsonl
from paravt.core.seeding import seed_everything
from paravt.data.schema import load_rl_rows
from paravt.models import lora, parallel
from paravt.models.stage_main import RunAborted
from paravt.models.loading import (default_attn_implementation, enable_activation_checkpointing, load_model, load_processor,
                                   resolve_dtype)
from paravt.models.packed_attention import VARLEN_IMPLEMENTATIONS
from paravt.models.tokenize import vision_token_ids
from paravt.models.trainloop import TrainLoop
from paravt.rl.config import RLConfig
from paravt.rl.grpo import StepStats, batch_token_advantages, gtr_objective, policy_tokens, sample_loss, sft_nll
from paravt.rl.logps import forward_logps
from paravt.rl.loss_agg import AGGREGATORS, sample_tokens, step_denominator
from paravt.rl.packing import average_gradients, bins, equalize, packed_logps, padding_sample, split_by_tokens
from paravt.rl.engine_sync import EngineSync
from paravt.rl.lost_work import LostWork
from paravt.rl.rollout import PromptSchedule, RolloutBatch, RolloutProducer, RolloutWorker, Sample
from paravt.rl.transfer import broadcast_step

log = logging.getLogger("paravt.rl")

CURVES = ["reward/total", "reward/acc", "reward/format", "reward/tool", "format/compliance", "tools/call_frequency",
          "tools/calls_per_turn", "tools/failure_frequency", "frac_reward_zero_std", "ppo/kl", "ppo/entropy",
          "completions/mean_length"]
GTR_CURVES = ["gtr/corrected_fraction", "gtr/valid_thought_fraction", "gtr/thought_state_consistency",
              "gtr/distinct_thought_fraction", "gtr/nll", "ppo/entropy_think"]


class RLTrainer:
    def __init__(self, cfg: RLConfig):
        if cfg.lora.enabled and (cfg.ref_model_path or cfg.model_path) != cfg.model_path:
            raise ValueError("lora.enabled: the KL reference is model_path with the adapters off; ref_model_path "
                             f"must be null or model_path, got {cfg.ref_model_path}")
        self.cfg = cfg
        self.dist = parallel.init_distributed()
        cfg.check_world_size(self.dist.world_size)
        seed_everything(cfg.seed + self.dist.rank)
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
            if cfg.lora.enabled:  # peft's adapters on the frozen base: only they train (paravt.models.lora)
                lora.attach(m, cfg.lora)

        ref_path = cfg.ref_model_path or cfg.model_path
        load_ref = cfg.grpo.kl_coef > 0 and not cfg.lora.enabled  # LoRA: no second model (the actor, adapters off)
        if cfg.trainer.strategy == "fsdp2":
            # Sharded start-up: rank 0 reads each checkpoint, every rank keeps its shards (parallel.load_fsdp2).
            actor = parallel.load_fsdp2(cfg.model_path, self.dist, dtype="float32", attn_implementation=attn,
                                        compute_dtype=compute, prepare=prepare_actor, sharded=cfg.trainer.sharded_init)
            ref = parallel.load_fsdp2(ref_path, self.dist, dtype=cfg.trainer.dtype, attn_implementation=attn,
                                      prepare=lambda m: m.requires_grad_(False), sharded=cfg.trainer.sharded_init) \
                if load_ref else None
        else:
            actor = load_model(cfg.model_path, dtype="float32", attn_implementation=attn)
            prepare_actor(actor)
            actor.to(self.dist.device)
            ref = None
            if load_ref:
                ref = load_model(ref_path, dtype=cfg.trainer.dtype, attn_implementation=attn)
                ref.requires_grad_(False)
                ref.to(self.dist.device)
        if ref is not None:
            ref.eval()
        if cfg.lora.enabled and cfg.grpo.kl_coef > 0:
            ref = actor  # scored under lora.reference(actor): the frozen base
        if cfg.lora.enabled and self.dist.is_main:
            log.info("LoRA (rank %d, alpha %g): %d of %d parameters train", cfg.lora.rank, cfg.lora.alpha,
                     *lora.trainable_counts(actor))
        self.image_token_id = actor.config.image_token_id
        self.vision_ids = torch.tensor(vision_token_ids(self.processor.tokenizer), dtype=torch.long)
        self.actor, self.ref = actor, ref
        self.optimizer = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=cfg.optim.lr,
                                           betas=tuple(cfg.optim.betas), eps=cfg.optim.eps,
                                           weight_decay=cfg.optim.weight_decay,
                                           **parallel.adamw_kwargs(self.dist.device))
        self.global_step = 0  # completed steps (= the policy version the engine should hold)
        self.sync = EngineSync(cfg, self.dist, self.out, self.processor, self.save)  # the engine, and pushes to it
        self.lost_work = LostWork(cfg, self.dist, self.ckpt_root, self.save)
        self.gtr = None
        if cfg.gtr.mode != "off":
            from paravt.rl.gtr import GTR  # noqa: PLC0415
            self.gtr = GTR(cfg, self.processor, is_main=self.dist.is_main)
        self.schedule = self.judge = None
        if self.dist.is_main:
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
        samples, index, sft = broadcast_step(batch, sft, self.dist.world_size)  # frames by source, no pixels
        if index != self.global_step:
            raise RuntimeError(f"rollout batch {index} does not match step {self.global_step}")
        t0 = time.perf_counter()
        m = self.train_on(samples, sft or [])
        m["time/train"] = time.perf_counter() - t0
        self.global_step += 1
        m["time/sync"] = self.sync.push(self.actor, self.global_step)
        m.update(self.sync.push_bytes)  # LoRA runs: the push's bytes beside a whole model's
        if batch is not None:
            m.update(batch.metrics)
            m.update({"time/rollout": batch.seconds, "rollout/staleness": self.global_step - 1 - batch.weight_version,
                      "rollout/samples": len(samples)})
        return m

    # ------------------------------------------------------------------ losses
    def train_on(self, samples: list[Sample], sft_samples: list[Sample] = ()) -> dict[str, float]:
        """PPO (+ KL) over the step's ``samples`` and λ·NLL over its ``sft_samples`` (GTR); every rank holds both
        whole lists. ``ppo_minibatches`` optimizer steps on minibatches of the whole list (the same at any world
        size), each split over the ranks by tokens; the objective is normalised by the step's policy tokens
        (``grpo.loss_agg``: token-mean, as released) or its sequences (:mod:`paravt.rl.loss_agg`)."""
        grpo, world = self.cfg.grpo, self.dist.world_size
        n_rl, n_sft = policy_tokens(samples), policy_tokens(sft_samples)
        rl_den = step_denominator(grpo.loss_agg, samples)
        if n_rl == 0 and n_sft == 0:  # nothing to learn from (every prompt of the step was skipped): no step at all
            return {"ppo/optimizer_skipped": 1.0, "ppo/tokens": 0.0}
        self.actor.train()
        pad = padding_sample(list(samples) + list(sft_samples))
        mbs = [split_by_tokens(samples[i::grpo.ppo_minibatches], world) for i in range(grpo.ppo_minibatches)]
        owner = {id(s): r for mb in mbs for r, part in enumerate(mb) for s in part}
        owned = [[s for s in samples if owner[id(s)] == r] for r in range(world)]  # each rank's samples of the step
        prox = self._score(self.actor, owned, pad) if grpo.ppo_minibatches > 1 else {}  # before this step's updates
        token_adv, kl_reward = self._token_advantages(owned, pad)
        stats = StepStats(kl_reward=kl_reward)

        def backward(rl_sum, nll_sum) -> None:  # ×world: FSDP (and average_gradients) average the ranks' gradients
            (world * gtr_objective(rl_sum, rl_den, nll_sum, n_sft, self.cfg.gtr.sft_weight)).backward()

        for i, parts in enumerate(mbs):
            for pack in self._rank_packs(parts, pad):
                backward(self._ppo_loss(pack, prox, token_adv, stats), 0.0)
            if i == 0:  # GTR: λ·NLL joins the first optimizer step
                for pack in self._rank_packs(split_by_tokens(list(sft_samples), world), pad):
                    backward(0.0, self._nll(pack, stats))
            grad_norm = self._optimizer_step()
        stats = stats.reduce(parallel.all_reduce_sum_tensor, parallel.all_reduce_max)
        return stats.metrics(grad_norm, bool(grpo.rollout_is or grpo.rollout_rs),
                             self.gtr is not None and self.cfg.gtr.mode == "train")

    def _ppo_loss(self, pack: list[Sample], prox: dict, token_adv: dict, stats: StepStats) -> torch.Tensor:
        """One pack's PPO (+ k3 KL) loss, aggregated as ``grpo.loss_agg`` says before the step's denominator
        (:mod:`paravt.rl.loss_agg`), its statistics into ``stats`` (:func:`paravt.rl.grpo.sample_loss`)."""
        g = self.cfg.grpo
        loss_kl = g.kl_coef if g.kl_mode == "loss_k3" and self.ref is not None else 0.0
        refs = [None] * len(pack)
        if loss_kl > 0:
            with torch.no_grad(), lora.reference(self.ref):  # LoRA: the actor with its adapters off
                refs = [lp for lp, _ in self._logps(self.ref, pack)]
        think_w = self.cfg.gtr.think_weight if self.gtr is not None else 1.0
        losses = [sample_loss(s, logp, ent, prox.get(id(s), logp.detach()), ref, token_adv.get(id(s)), g, loss_kl,
                              think_w, stats)
                  for s, (logp, ent), ref in zip(pack, self._logps(self.actor, pack, with_entropy=True), refs)]
        norm = g.loss_agg_norm or self.cfg.hierarchical_agent.max_new_tokens
        return AGGREGATORS[g.loss_agg](losses, [sample_tokens(s) for s in pack], norm)

    def _nll(self, pack: list[Sample], stats: StepStats) -> torch.Tensor:
        """One pack's NLL sum of the corrected-thought tokens (at temperature 1), their statistics into ``stats``."""
        total = 0.0
        for s, (logp, _) in zip(pack, self._logps(self.actor, pack, temperature=1.0)):
            nll, n = sft_nll(logp, torch.tensor(s.loss_mask[1:], device=logp.device))
            stats.add_sft(float(nll.detach()), n)
            total = total + nll
        return total

    def _optimizer_step(self) -> float:
        """Gradients averaged over the ranks where FSDP does not (``trainer.strategy=none``), clipped, applied."""
        if self.cfg.trainer.strategy == "none" and self.dist.world_size > 1:
            average_gradients(self.actor.parameters())
        norm = parallel.clip_grad_norm(self.actor.parameters(), self.cfg.optim.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def _token_advantages(self, owned: list[list[Sample]], pad: Sample) -> tuple[dict[int, torch.Tensor], float]:
        """This rank's per-token advantages and KL-reward sum (:func:`paravt.rl.grpo.batch_token_advantages`)."""
        g = self.cfg.grpo
        kl_reward = g.kl_mode == "reward_k1" and g.kl_coef > 0 and self.ref is not None
        with lora.reference(self.ref):  # LoRA: the actor with its adapters off
            refs = self._score(self.ref, owned, pad) if kl_reward else None
        return batch_token_advantages(owned[self.dist.rank], refs, g.kl_coef, g.batch_adv_norm and g.adv_norm_level == "token",
                                      parallel.all_reduce_sum)

    @torch.no_grad()
    def _score(self, model, owned: list[list[Sample]], pad: Sample) -> dict[int, torch.Tensor]:
        """log p of each of this rank's samples under ``model``, by ``id`` (``owned``: every rank's samples)."""
        out = {}
        for pack in self._rank_packs(owned, pad):
            out.update((id(s), lp) for s, (lp, _) in zip(pack, self._logps(model, pack)))
        return out

    def _rank_packs(self, parts: list[list[Sample]], pad: Sample) -> list[list[Sample]]:
        """This rank's ``parts[rank]`` in forwards of at most ``trainer.pack_tokens`` tokens (0, or an attention
        without varlen such as plain ``sdpa``: one per sample), as many as the rank with the most (FSDP's
        collectives): computed from every rank's part, so no rank waits on a collective to know the count."""
        varlen = self.actor.config._attn_implementation in VARLEN_IMPLEMENTATIONS
        budget = self.cfg.trainer.pack_tokens if varlen else 0
        packs = [bins(p, budget) if budget > 0 else [[s] for s in p] for p in parts]
        return equalize(packs[self.dist.rank], max(map(len, packs)), pad)

    def _logps(self, model, pack: list[Sample], with_entropy: bool = False, temperature: float | None = None):
        """[(log p, entropy or None)] of each sample of ``pack`` from one forward (:mod:`paravt.rl.packing`), at the
        rollout temperature unless ``temperature`` is given; logits at the samples' policy tokens only."""
        temp = self.cfg.grpo.temperature if temperature is None else temperature
        pos = [[t for t, m in enumerate(s.loss_mask[1:]) if m] for s in pack]
        if len(pack) == 1:
            return [forward_logps(model, pack[0].input_ids, pack[0].images, self.processor, self.image_token_id,
                                  self.vision_ids, temp, self.dist.device, positions=pos[0], with_entropy=with_entropy)]
        return packed_logps(model, pack, self.processor, self.image_token_id, self.vision_ids, temp, self.dist.device,
                            pos, with_entropy)

    def _forward_logps(self, model, s: Sample, temperature: float | None = None,
                       with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log p of each next token, entropy or None) per position of one sample (0 off its policy tokens)."""
        return self._logps(model, [s], with_entropy, temperature)[0]

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        path = parallel.step_dir(self.ckpt_root, self.global_step)
        state = {"step": self.global_step, "config": asdict(self.cfg)}
        parallel.save_resumable(path, self.actor, self.optimizer, state, self.dist)
        # The HF export in the trainer's dtype (bf16 for the 8B: ~17.5 GB, not fp32's ~35 GB); the fp32 master
        # weights and the optimizer state are in the sharded DCP checkpoint beside it.
        parallel.export_hf(self.actor, self.processor, path / "hf", self.dist,
                           dtype=resolve_dtype(self.cfg.trainer.dtype))
        if self.cfg.lora.enabled:  # beside the merged hf/: the adapter alone, in peft's format
            lora.save_adapter(self.actor, path / "adapter", self.dist.is_main, base_model=self.cfg.model_path)
        if self.gtr is not None and self.dist.is_main:
            self.gtr.save(path)
        parallel.mark_complete(path, self.dist, self.cfg.keep_last)
        return path

    def _resume(self) -> str:
        """The weights the engine should start from (SFT model or the resumed checkpoint)."""
        r = self.cfg.resume
        if r == "never":
            return self.cfg.model_path
        path = parallel.latest_complete(self.ckpt_root) if r == "auto" else Path(r)
        if path is None:
            return self.cfg.model_path
        state, _ = parallel.load_resumable(path, self.actor, self.optimizer, self.dist)
        self.global_step = state["step"]
        if self.gtr is not None:
            self.gtr.load(path)
        if self.dist.is_main:
            log.info("resumed from %s at step %d", path, self.global_step)
        return str(path / "hf")

    # ------------------------------------------------------------------ loop
    def _start_rollouts(self) -> RolloutProducer:
        """Rank 0: the producer thread over the started engine."""
        worker = RolloutWorker(self.cfg, self.sync.handle.engine, self.processor, self.schedule, self.judge, self.gtr)
        if self.gtr is not None:
            self.gtr.attach(worker.overview_images)
        producer = RolloutProducer(worker, self.global_step, self.cfg.max_steps, self.cfg.grpo.max_staleness)
        producer.start()
        return producer

    async def _close_clients(self) -> None:
        await self.sync.handle.aclose()
        if self.gtr is not None:
            await self.gtr.aclose()

    def train(self, until: int | None = None) -> Path:
        """Train to ``max_steps`` (or stop after step ``until``, as a crash would)."""
        cfg = self.cfg
        weights = self._resume()
        self.out.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:  # records of steps after the checkpoint are redone: drop them, never double them
            trim_jsonl(self.out / "trajectories.jsonl", lambda r: r.get("step", 0) < self.global_step)
        producer = None
        r = cfg.rollout
        start_s = max(r.server.startup_timeout_s, r.vllm.startup_timeout_s) * max(1, r.replicas) + 600
        start_s = max(start_s, float(os.environ.get("PARAVT_SERVERS_TIMEOUT") or 0) + 600)  # a layout's discovery
        try:
            if self.dist.is_main:
                try:
                    self.sync.start(weights, self.global_step)
                except Exception as exc:  # the other ranks end with this line, not with a collective's timeout
                    msg = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
                    parallel.announce("engine_start", msg)
                    raise RunAborted(f"the rollout engine did not start: {msg}") from None
                parallel.announce("engine_start")
            else:  # rank 0 may take up to the servers' start-up timeout: wait for it here, not in a collective
                parallel.await_rank0("engine_start", start_s)
            # servers this run did not launch (rollout.urls, a layout's) hold unknown weights, and a LoRA run's
            # servers the base alone: push this run's first
            if cfg.rollout.urls or cfg.rollout.layout or self.sync.update.transport == "adapter":
                self.sync.push(self.actor, self.global_step)
            producer = self._start_rollouts() if self.dist.is_main else None
            para = cfg.paravt.anchoring.weight > 0 or cfg.paravt.gating.nframes_gating  # else vanilla GRPO
            with TrainLoop(self, "para-grpo" if para else "grpo") as loop:
                while self.global_step < cfg.max_steps:
                    t0 = time.perf_counter()
                    batch = producer.get() if producer is not None else None
                    t_wait = time.perf_counter() - t0
                    self.lost_work.check(batch, self.global_step)
                    m = self.step(batch)
                    m.update({"time/wait_rollout": t_wait, "time/step": time.perf_counter() - t0})
                    if batch is not None:
                        producer.set_version(self.global_step)
                        append_jsonl(self.out / "trajectories.jsonl", batch.trajectories)
                    loop.log(m if self.dist.is_main else None, self.global_step, {
                        "R": f"{m.get('reward/total', 0):.2f}", "acc": f"{m.get('reward/acc', 0):.2f}",
                        "fmt": f"{m.get('format/compliance', 0):.2f}",
                        "tools": f"{m.get('tools/call_frequency', 0):.2f}"} if self.dist.is_main else None)
                    if self.global_step % cfg.save_every == 0 or self.global_step == cfg.max_steps:
                        self.save()
                    if until is not None and self.global_step >= until:
                        break
                self.lost_work.check_ended_well(self.global_step)
        finally:
            if producer is not None:
                producer.shutdown(self._close_clients)
            self.sync.stop()
        return loop.finish(CURVES + (GTR_CURVES if self.gtr is not None else []), "curves.png", "PARA-GRPO",
                           smooth=3)

