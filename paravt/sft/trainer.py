"""Cold-start SFT, the trainer (its command line: :mod:`paravt.sft.train`, launched by ``bash scripts/run_sft.sh``).

One trainer for CPU and GPU. FSDP2 by default (``fully_shard`` per decoder layer and vision
block; bf16 compute over fp32 master weights on GPU), DeepSpeed ZeRO-3 as an option, DDP or
a plain module for debugging. Launched by torchrun across the node's devices (and across
nodes with the usual rendezvous variables) or as a plain process (a group of one).

A step trains ``global_batch_size`` packs (rows) over all ranks, whatever the world size
(:class:`paravt.sft.config.StepSplit`: each rank's share and the passes a step, derived at start-up).
Loss: token-level cross entropy over assistant tokens only, normalised by the number of
supervised tokens in the whole optimizer step across all ranks and micro-batches, so packed
and padded batches, any world size and any accumulation give the same gradient. A rank with
fewer micro-batches than the others that step (a global batch that is not a multiple of the
world size) runs zero-weight passes over a pack it has, so every rank joins each FSDP/DDP
gather and reduce.

A step's batches come from :class:`paravt.sft.feed.StepFeed`: on CUDA prepared one step ahead on a
background thread (``prefetch``) and copied to the device from pinned memory without blocking the host.

Every ``save_every`` steps: ``<output_dir>/checkpoints/step_N/`` holds the resumable state
(model + optimizer through torch.distributed.checkpoint, scheduler, step, each rank's data
cursor and RNG) and ``hf/`` (``save_pretrained`` model + processor that RL and eval load; with
``lora.enabled`` the merged model, and ``adapter/`` beside it: :mod:`paravt.models.lora`).
``resume=auto`` continues from the newest complete checkpoint: same step counter, same data
order. Metrics go to ``metrics.jsonl`` and wandb (offline by default); ``loss_curve.png`` at the end.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from paravt.core.seeding import seed_everything, stable_hash
from paravt.core.video import keep_open_videos
from paravt.models import lora, parallel, vision_join
from paravt.models.loading import (default_attn_implementation, enable_activation_checkpointing, load_model, load_processor,
                                   resolve_dtype)
from paravt.models.losses import supervised_ce_sum
from paravt.models.trainloop import TrainLoop
from paravt.sft.config import SFTConfig
from paravt.sft.data import (IGNORE, ExampleBuilder, PackedStream, StreamState, collate_packed, collate_padded,
                             load_manifest, padding_stats)
from paravt.sft.example_cache import CachedBuilder
from paravt.sft.feed import StepFeed, to_device

log = logging.getLogger("paravt.sft")


def lr_lambda(cfg: SFTConfig):
    """Linear warm-up then cosine over ``optim.schedule_steps`` (default ``max_steps``); training
    may stop before the schedule ends (the authors' step-500-of-1500 checkpoint)."""
    total = cfg.optim.schedule_steps or cfg.max_steps
    warm = int(round(cfg.optim.warmup_ratio * total))
    floor = cfg.optim.min_lr_ratio

    def f(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if cfg.optim.scheduler == "constant":
            return 1.0
        prog = (step - warm) / max(1, total - warm)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, prog)))
    return f


def param_groups(model, weight_decay: float, vision_lr_scale: float = 1.0, lr: float = 1.0):
    """AdamW groups: no decay on norms/biases; the vision tower's lr scaled (0 = frozen)."""
    groups: dict[tuple[bool, bool], list] = {}
    for n, p in model.named_parameters():
        vision = ".visual." in f".{n}"
        if vision and vision_lr_scale == 0:
            p.requires_grad_(False)
        if not p.requires_grad:
            continue
        decay = p.ndim >= 2 and "norm" not in n.lower()
        groups.setdefault((vision, decay), []).append(p)
    return [{"params": ps, "weight_decay": weight_decay if decay else 0.0,
             "lr": lr * (vision_lr_scale if vision else 1.0)} for (vision, decay), ps in sorted(groups.items())]


def freeze_lm_head(model) -> None:
    """``optim.freeze_lm_head``: the output embeddings stop training (refused on a tied model, where they
    are the input embeddings too)."""
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or head.weight is emb.weight or (not head.weight.is_meta and head.weight.data_ptr() == emb.weight.data_ptr()):
        raise ValueError("optim.freeze_lm_head needs a model whose lm_head is not tied to its input embeddings "
                         "(build the tiny base with python -m paravt.models.tiny --no-tie-embeddings)")
    head.weight.requires_grad_(False)


def token_ce_sum(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Sum of next-token cross entropy over supervised positions, and their count: logits at those
    positions only, a packed row with its sequence bounds (:func:`paravt.models.losses.supervised_ce_sum`)."""
    return supervised_ce_sum(model, batch, IGNORE)


class SFTTrainer:
    def __init__(self, cfg: SFTConfig):
        self.cfg = cfg
        self.dist = parallel.init_distributed()
        self.split = cfg.step_split(self.dist.world_size)  # a combination it cannot run: one line, nothing loaded
        if self.dist.is_main:
            (log.warning if self.split.fillers else log.info)("SFT step: %s", self.split.describe())
        self._filler = None  # a collated micro-batch of this rank for zero-weight passes (uneven splits only)
        seed_everything(cfg.seed + self.dist.rank)
        self.out = Path(cfg.output_dir)
        self.ckpt_root = self.out / "checkpoints"
        self.processor = load_processor(cfg.model_path, cfg.video.min_pixels, cfg.video.max_pixels)
        self.tokenizer = self.processor.tokenizer
        compute = resolve_dtype(cfg.dtype)
        if self.dist.device.type == "cpu" and compute == torch.bfloat16:
            log.warning("bf16 on CPU is ~2x slower than fp32 (measured on our 2-core CPUs); consider dtype=float32")
        attn = cfg.attn_implementation or default_attn_implementation()
        def prepare(m) -> None:
            if cfg.gradient_checkpointing:
                enable_activation_checkpointing(m)
            m.config.use_cache = False
            if cfg.optim.freeze_lm_head:
                freeze_lm_head(m)
            if cfg.lora.enabled:  # peft's adapters on the frozen base: only they train (paravt.models.lora)
                lora.attach(m, cfg.lora)

        strategy = cfg.dist.strategy
        self.ds_engine = None
        if strategy == "fsdp2":  # sharded start-up: rank 0 reads the checkpoint, each rank keeps its shards
            model = parallel.load_fsdp2(cfg.model_path, self.dist, dtype="float32", attn_implementation=attn,
                                        compute_dtype=compute, reshard_after_forward=cfg.dist.reshard_after_forward,
                                        prepare=prepare)
        else:
            model = load_model(cfg.model_path, dtype="float32", attn_implementation=attn)
            prepare(model)
            model.to(self.dist.device)
            if strategy == "ddp" and self.dist.world_size > 1:
                vision_join.install(model)  # a text-only batch still gives the tower's parameters a gradient
                model = torch.nn.parallel.DistributedDataParallel(model)
        inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
        self.rope_index = inner.model.get_rope_index
        self.image_token_id = inner.config.image_token_id
        self.model = model
        if cfg.lora.enabled and self.dist.is_main:
            log.info("LoRA (rank %d, alpha %g): %d of %d parameters train", cfg.lora.rank, cfg.lora.alpha,
                     *lora.trainable_counts(model))
        self.optimizer = torch.optim.AdamW(param_groups(model, cfg.optim.weight_decay, cfg.optim.vision_lr_scale,
                                                        cfg.optim.lr), lr=cfg.optim.lr,
                                           betas=tuple(cfg.optim.betas), eps=cfg.optim.eps,
                                           **(parallel.adamw_kwargs(self.dist.device) if strategy != "deepspeed" else {}))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        if strategy == "deepspeed":
            self._init_deepspeed(compute)
        self.global_step = 0
        self._copy = None  # (vocabulary, batch spec) of copy_aux, when on
        if cfg.copy_aux.weight:
            from paravt.models.tiny import CopyWarmup, copy_vocab  # noqa: PLC0415
            a = cfg.copy_aux
            self._copy = (copy_vocab(self.tokenizer), CopyWarmup(batch=a.batch, min_len=a.min_len, max_len=a.max_len,
                                                                 max_prefix=a.max_prefix,
                                                                 small_alphabet_frac=a.small_alphabet_frac))

        rows, report, missing = load_manifest(cfg.data)
        self.data_report = {"rows": report.to_dict(), "missing_shards": missing}
        if not rows:
            raise RuntimeError(f"no SFT rows: {report.summary()}; missing shards: {missing}")
        keep_open_videos(cfg.video.open_videos)  # a data set that fits decodes each frame once per run
        self.builder = ExampleBuilder(self.processor, cfg.video, cfg.max_length)
        build = CachedBuilder(self.builder, cfg.example_cache_mb) if cfg.example_cache_mb else self.builder
        self.stream = PackedStream(rows, build, cfg.seed, cfg.max_length, cfg.packing, self.split.micro,
                                   self.dist.rank, self.dist.world_size)
        cuda = self.dist.device.type == "cuda"
        # pixels cast on the host only where the model casts them to that dtype anyway (FSDP2 mixed precision)
        pixel_dtype = compute if strategy == "fsdp2" and compute in (torch.bfloat16, torch.float16) else None
        self.feed = StepFeed(self.stream, self.builder, self._collate,
                             lambda step: self.split.micro_sizes(self.dist.rank, step), self.split.passes,
                             prefetch=cuda if cfg.prefetch is None else cfg.prefetch, pin=cuda,
                             pixel_dtype=pixel_dtype, last_step=cfg.max_steps)
        if self.dist.is_main:
            log.info("SFT data: %s; missing shards: %s", report.summary(), missing or "none")

    def _init_deepspeed(self, compute: torch.dtype) -> None:
        import deepspeed  # noqa: PLC0415

        ds_cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                  "zero_optimization": {"stage": self.cfg.dist.zero_stage},
                  "bf16": {"enabled": compute == torch.bfloat16}, "gradient_clipping": self.cfg.optim.grad_clip,
                  "steps_per_print": 10**9}
        self.ds_engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=self.model, optimizer=self.optimizer, lr_scheduler=self.scheduler, config=ds_cfg)
        self.model = self.ds_engine

    # ------------------------------------------------------------------ checkpoints
    def _resume(self) -> None:
        r = self.cfg.resume
        if r == "never":
            return
        path = parallel.latest_complete(self.ckpt_root) if r == "auto" else Path(r)
        if path is None:
            return
        self.feed.reset()
        if self.ds_engine is not None:
            self.ds_engine.load_checkpoint(str(path / "deepspeed"))
            import json  # noqa: PLC0415
            state = json.loads((path / "trainer_state.json").read_text())
            rank_state = torch.load(path / f"rank{self.dist.rank}.pt", weights_only=False)
            torch.set_rng_state(rank_state["torch_rng"])
        else:
            state, rank_state = parallel.load_resumable(path, self.model, self.optimizer, self.dist)
            self.scheduler.load_state_dict(state["scheduler"])
        self.global_step = state["step"]
        self.stream.state = StreamState(**rank_state["stream"])
        if self.dist.is_main:
            log.info("resumed from %s at step %d", path, self.global_step)

    def save(self) -> Path:
        path = parallel.step_dir(self.ckpt_root, self.global_step)
        state = {"step": self.global_step, "scheduler": self.scheduler.state_dict(), "config": asdict(self.cfg),
                 "data_report": self.data_report}
        rank_extra = {"stream": self.feed.state.to_dict()}  # the data of the steps trained, not of one prefetched
        if self.ds_engine is not None:
            path.mkdir(parents=True, exist_ok=True)
            self.ds_engine.save_checkpoint(str(path / "deepspeed"))
            torch.save({"torch_rng": torch.get_rng_state(), **rank_extra}, path / f"rank{self.dist.rank}.pt")
            if self.dist.is_main:
                import json  # noqa: PLC0415
                (path / "trainer_state.json").write_text(json.dumps(state, indent=2, default=str))
            self._export_ds(path / "hf")
        else:
            parallel.save_resumable(path, self.model, self.optimizer, state, self.dist, rank_extra)
            parallel.export_hf(self.model, self.processor, path / "hf", self.dist)  # LoRA: the merged model
            if self.cfg.lora.enabled:  # and the adapter alone, in peft's format
                lora.save_adapter(self.model, path / "adapter", self.dist.is_main, base_model=self.cfg.model_path)
        parallel.mark_complete(path, self.dist, self.cfg.keep_last)
        return path

    def _export_ds(self, out: Path) -> None:
        sd = self.ds_engine._zero3_consolidated_16bit_state_dict() if self.cfg.dist.zero_stage == 3 else \
            self.ds_engine.module.state_dict()
        if self.dist.is_main:
            out.mkdir(parents=True, exist_ok=True)
            self.ds_engine.module.save_pretrained(out, state_dict=dict(sd))
            self.processor.save_pretrained(out)
        parallel.barrier()

    # ------------------------------------------------------------------ training
    def _collate(self, examples):
        if self.cfg.packing:
            return collate_packed(examples, self.processor, self.image_token_id, self.rope_index)
        return collate_padded(examples, self.processor, self.tokenizer.pad_token_id, self.image_token_id)

    def _pass(self, batch: dict[str, torch.Tensor], scale: float) -> float:
        """Forward and backward of one micro-batch, its loss ``scale`` x its cross-entropy sum; that sum."""
        b = to_device(batch, self.dist.device)
        ce, _ = token_ce_sum(self.model, b)
        loss = ce * scale
        if self.ds_engine is not None:
            self.ds_engine.backward(loss)
        else:
            loss.backward()
        return float(ce.detach())

    def _fillers(self, batches: list[dict[str, torch.Tensor]], n: int,
                 peek: dict[str, torch.Tensor] | None) -> list[dict[str, torch.Tensor]]:
        """``n`` micro-batches for zero-weight passes: the last this rank trained, else (no step has given it
        one yet) ``peek``, its next pack, which the feed prepared with the stream put back so it trains in its turn."""
        if batches and self.split.fillers:
            self._filler = batches[-1]
        if n <= 0:
            return []
        if self._filler is None:
            self._filler = peek
        return [self._filler] * n

    def train_step(self) -> dict[str, Any]:
        cfg, split = self.cfg, self.split
        t0 = time.perf_counter()
        prepared = self.feed.get(self.global_step, trained=self._filler is not None)
        micro, batches = prepared.micro, prepared.batches
        n_local = sum(int((b["labels"][:, 1:] != IGNORE).sum()) for b in batches)
        copy_ce = self._copy_aux_step()
        n_global = parallel.all_reduce_sum(n_local)
        scale = self.dist.world_size / max(n_global, 1.0)  # FSDP/DDP average grads over ranks
        self.model.train()
        ce_total = sum(self._pass(b, scale) for b in batches)
        for b in self._fillers(batches, split.passes - len(batches), prepared.peek):
            self._pass(b, 0.0)  # no gradient: this rank's part in the others' gathers and reduces
        if self.ds_engine is not None:
            self.ds_engine.step()
            grad_norm = float(self.ds_engine.get_global_grad_norm() or 0.0)
        else:
            grad_norm = parallel.clip_grad_norm(self.model.parameters(), cfg.optim.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        dt = time.perf_counter() - t0
        flat = [e for m in micro for e in m]
        pad = padding_stats(flat, cfg.packing, cfg.max_length)
        real = parallel.all_reduce_sum(pad["real_tokens"])
        return {"loss": parallel.all_reduce_sum(ce_total) / max(n_global, 1.0),
                "lr": self.optimizer.param_groups[0]["lr"], "grad_norm": grad_norm,
                "tokens_per_s": real / dt, "supervised_tokens": n_global, "real_tokens": real,
                "tokens_per_step": real, "micro_batches": split.passes, "filler_passes": split.fillers,
                "rows_per_step": parallel.all_reduce_sum(len(flat)),
                "padding_fraction": pad["padding_fraction"], "step_seconds": dt, "epoch": self.stream.state.epoch,
                **({"copy_loss": parallel.all_reduce_sum(copy_ce) / self.dist.world_size}
                   if copy_ce is not None else {})}

    def _copy_aux_step(self) -> float | None:
        """Forward + backward of this step's copy batch (``copy_aux``), before the SFT micro-batches' own;
        returns its mean cross entropy, or None when off."""
        if self._copy is None:
            return None
        from paravt.models.tiny import copy_batch, copy_loss  # noqa: PLC0415

        g = torch.Generator().manual_seed(stable_hash(self.cfg.seed, "sft-copy-aux", self.dist.rank, self.global_step))
        ids, start = copy_batch(*self._copy, g)
        self.model.train()
        loss = copy_loss(self.model, ids.to(self.dist.device), start)
        (loss * self.cfg.copy_aux.weight).backward()
        return float(loss.detach())

    def train(self, until: int | None = None) -> Path:
        """Train to ``max_steps`` (or stop early after step ``until``, as a crash would)."""
        cfg = self.cfg
        self._resume()
        with TrainLoop(self, "sft") as loop, self.feed:
            while self.global_step < cfg.max_steps:
                m = self.train_step()
                m["skipped_rows"] = dict(self.feed.skipped)
                log_now = self.global_step % cfg.logging.log_every == 0 or self.global_step == cfg.max_steps
                loop.log(m if log_now else None, self.global_step,
                         {"loss": f"{m['loss']:.3f}", "lr": f"{m['lr']:.1e}", "tok_s": f"{m['tokens_per_s']:.0f}"})
                if self.global_step % cfg.save_every == 0 or self.global_step == cfg.max_steps:
                    self.save()
                if until is not None and self.global_step >= until:
                    return self.out
        return loop.finish(["loss", "lr", "grad_norm", "tokens_per_s", "padding_fraction"], "loss_curve.png",
                           "cold-start SFT")

