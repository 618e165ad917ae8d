"""Cold-start SFT: ``bash scripts/run_sft.sh [RECIPE.yaml] [key=value ...]``.

One trainer for CPU and GPU. FSDP2 by default (``fully_shard`` per decoder layer and vision
block; bf16 compute over fp32 master weights on GPU), DeepSpeed ZeRO-3 as an option, DDP or
a plain module for debugging. Launched by torchrun across the node's devices (and across
nodes with the usual rendezvous variables) or as a plain process (a group of one).

Loss: token-level cross entropy over assistant tokens only, normalised by the number of
supervised tokens in the whole optimizer step across all ranks and micro-batches, so packed
and padded batches, any world size and any accumulation give the same gradient.

Every ``save_every`` steps: ``<output_dir>/checkpoints/step_N/`` holds the resumable state
(model + optimizer through torch.distributed.checkpoint, scheduler, step, each rank's data
cursor and RNG) and ``hf/`` (``save_pretrained`` model + processor that RL and eval load).
``resume=auto`` continues from the newest complete checkpoint: same step counter, same data
order. Metrics go to ``metrics.jsonl`` and wandb (offline by default); ``loss_curve.png`` at the end.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from paravt.core.metrics import MetricsLogger, plot_curves
from paravt.core.seeding import seed_everything
from paravt.models import parallel
from paravt.models.loading import default_attn_implementation, load_model, load_processor, resolve_dtype
from paravt.sft.data import (IGNORE, ExampleBuilder, PackedStream, Shard, StreamState, VideoSampling, collate_packed,
                             collate_padded, load_manifest, padding_stats)

log = logging.getLogger("paravt.sft")


@dataclass
class OptimConfig:
    lr: float = 2e-5  # peak learning rate (AdamW)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    eps: float = 1e-8  # AdamW epsilon
    weight_decay: float = 0.01  # AdamW weight decay (not on norms/biases)
    scheduler: str = "cosine"  # cosine | constant
    warmup_ratio: float = 0.05  # linear warm-up as a fraction of the planned schedule
    # Steps the warm-up + cosine is planned over (None: max_steps). The authors plan 1500 steps
    # (1 epoch) and release step 500, where the cosine is unfinished (lr ~0.8x peak).
    schedule_steps: int | None = None
    min_lr_ratio: float = 0.0  # cosine floor as a fraction of lr
    grad_clip: float = 1.0  # global grad-norm clip
    vision_lr_scale: float = 1.0  # lr multiplier for the vision tower (0 freezes it)

    def __post_init__(self):
        if self.scheduler not in ("cosine", "constant"):
            raise ValueError(f"optim.scheduler must be cosine or constant, got {self.scheduler!r}")
        if not (self.lr > 0 and 0 <= self.warmup_ratio < 1):
            raise ValueError("optim.lr must be > 0 and optim.warmup_ratio in [0, 1)")
        if self.schedule_steps is not None and self.schedule_steps < 1:
            raise ValueError(f"optim.schedule_steps must be >= 1 or null, got {self.schedule_steps}")


@dataclass
class DistConfig:
    strategy: str = "fsdp2"  # fsdp2 | deepspeed | ddp | none
    zero_stage: int = 3  # DeepSpeed ZeRO stage (strategy=deepspeed)
    reshard_after_forward: bool = True  # FSDP2: free gathered params after forward (memory for comms)

    def __post_init__(self):
        if self.strategy not in ("fsdp2", "deepspeed", "ddp", "none"):
            raise ValueError(f"dist.strategy must be fsdp2, deepspeed, ddp or none, got {self.strategy!r}")


@dataclass
class LogConfig:
    log_every: int = 1  # metrics every N steps
    wandb_project: str | None = "paravt-sft"  # wandb project (null: no wandb; metrics.jsonl always)
    wandb_mode: str = "offline"  # offline | online | disabled
    progress: bool = True  # tqdm progress bar


@dataclass
class SFTConfig:
    model_path: str = "???"  # base model: a save_pretrained dir or hub id (required)
    output_dir: str = "runs/sft"  # checkpoints/, final/, metrics.jsonl, loss_curve.png
    data: list[Shard] = field(default_factory=list)  # manifest: list of {path, name, max_rows, optional} parquet shards
    data_root: str = ""  # shard paths that are not absolute are relative to this folder
    max_length: int = 8192  # longest tokenised row (or packed bin); longer rows are skipped and counted
    packing: bool = True  # pack rows into max_length bins (per-sequence M-RoPE positions)
    per_device_batch_size: int = 4  # rows per micro-batch (padded) or packed bins per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    max_steps: int = 500  # optimizer steps to train (the schedule may be planned longer: optim.schedule_steps)
    save_every: int = 100  # checkpoint every N steps
    keep_last: int = 2  # complete checkpoints kept on disk
    seed: int = 0  # seeds data order, init and dropout
    dtype: str = "bfloat16"  # compute dtype; master weights stay fp32
    attn_implementation: str | None = None  # None: flash_attention_2 on CUDA if installed, else sdpa
    gradient_checkpointing: bool = True  # recompute activations in backward (memory for time)
    resume: str = "auto"  # auto | never | <checkpoint dir>
    video: VideoSampling = field(default_factory=VideoSampling)
    optim: OptimConfig = field(default_factory=OptimConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    logging: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self):
        if self.model_path in ("", "???"):
            raise ValueError("model_path is required (a save_pretrained directory or hub id)")
        if not self.data:
            raise ValueError("data: give at least one shard ({path: ..., name: ...})")
        self.data = [Shard(**d) if isinstance(d, dict) else d for d in self.data]
        if self.data_root:
            for sh in self.data:
                if not Path(sh.path).is_absolute():
                    sh.path = str(Path(self.data_root) / sh.path)
        for name in ("max_length", "per_device_batch_size", "grad_accum", "max_steps", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        resolve_dtype(self.dtype)


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


def token_ce_sum(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Sum of next-token cross entropy over supervised positions, and their count."""
    labels = batch.pop("labels")
    out = model(**batch, use_cache=False)
    logits = out.logits[:, :-1].float()
    target = labels[:, 1:].to(logits.device)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                           ignore_index=IGNORE, reduction="sum")
    return ce, int((target != IGNORE).sum())


class SFTTrainer:
    def __init__(self, cfg: SFTConfig):
        self.cfg = cfg
        self.d = parallel.init_distributed()
        seed_everything(cfg.seed + self.d.rank)
        self.out = Path(cfg.output_dir)
        self.ckpt_root = self.out / "checkpoints"
        self.processor = load_processor(cfg.model_path, cfg.video.min_pixels, cfg.video.max_pixels)
        self.tokenizer = self.processor.tokenizer
        compute = resolve_dtype(cfg.dtype)
        if self.d.device.type == "cpu" and compute == torch.bfloat16:
            log.warning("bf16 on CPU is ~2x slower than fp32 (PLATFORM_NOTES); consider dtype=float32")
        attn = cfg.attn_implementation or default_attn_implementation()
        model = load_model(cfg.model_path, dtype="float32", attn_implementation=attn)
        self.rope_index = model.model.get_rope_index
        self.image_token_id = model.config.image_token_id
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        model.to(self.d.device)
        s = cfg.dist.strategy
        self.ds_engine = None
        if s == "fsdp2":
            model = parallel.wrap_fsdp2(model, self.d, compute, cfg.dist.reshard_after_forward)
        elif s == "ddp" and self.d.world_size > 1:
            model = torch.nn.parallel.DistributedDataParallel(model)
        self.model = model
        self.optimizer = torch.optim.AdamW(param_groups(model, cfg.optim.weight_decay, cfg.optim.vision_lr_scale,
                                                        cfg.optim.lr), lr=cfg.optim.lr,
                                           betas=tuple(cfg.optim.betas), eps=cfg.optim.eps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        if s == "deepspeed":
            self._init_deepspeed(compute)
        self.step = 0

        rows, report, missing = load_manifest(cfg.data)
        self.data_report = {"rows": report.to_dict(), "missing_shards": missing}
        if not rows:
            raise RuntimeError(f"no SFT rows: {report.summary()}; missing shards: {missing}")
        self.builder = ExampleBuilder(self.processor, cfg.video, cfg.max_length)
        self.stream = PackedStream(rows, self.builder, cfg.seed, cfg.max_length, cfg.packing, cfg.per_device_batch_size,
                                   self.d.rank, self.d.world_size)
        if self.d.is_main:
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
        if self.ds_engine is not None:
            self.ds_engine.load_checkpoint(str(path / "deepspeed"))
            import json  # noqa: PLC0415
            state = json.loads((path / "trainer_state.json").read_text())
            rank_state = torch.load(path / f"rank{self.d.rank}.pt", weights_only=False)
            torch.set_rng_state(rank_state["torch_rng"])
        else:
            state, rank_state = parallel.load_resumable(path, self.model, self.optimizer, self.d)
            self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        self.stream.state = StreamState(**rank_state["stream"])
        if self.d.is_main:
            log.info("resumed from %s at step %d", path, self.step)

    def save(self) -> Path:
        path = parallel.step_dir(self.ckpt_root, self.step)
        state = {"step": self.step, "scheduler": self.scheduler.state_dict(), "config": asdict(self.cfg),
                 "data_report": self.data_report}
        rank_extra = {"stream": self.stream.state.to_dict()}
        if self.ds_engine is not None:
            path.mkdir(parents=True, exist_ok=True)
            self.ds_engine.save_checkpoint(str(path / "deepspeed"))
            torch.save({"torch_rng": torch.get_rng_state(), **rank_extra}, path / f"rank{self.d.rank}.pt")
            if self.d.is_main:
                import json  # noqa: PLC0415
                (path / "trainer_state.json").write_text(json.dumps(state, indent=2, default=str))
            self._export_ds(path / "hf")
        else:
            parallel.save_resumable(path, self.model, self.optimizer, state, self.d, rank_extra)
            parallel.export_hf(self.model, self.processor, path / "hf", self.d)
        parallel.mark_complete(path, self.d, self.cfg.keep_last)
        return path

    def _export_ds(self, out: Path) -> None:
        sd = self.ds_engine._zero3_consolidated_16bit_state_dict() if self.cfg.dist.zero_stage == 3 else \
            self.ds_engine.module.state_dict()
        if self.d.is_main:
            out.mkdir(parents=True, exist_ok=True)
            self.ds_engine.module.save_pretrained(out, state_dict=dict(sd))
            self.processor.save_pretrained(out)
        parallel.barrier()

    # ------------------------------------------------------------------ training
    def _collate(self, examples):
        if self.cfg.packing:
            return collate_packed(examples, self.processor, self.image_token_id, self.rope_index)
        return collate_padded(examples, self.processor, self.tokenizer.pad_token_id, self.image_token_id)

    def train_step(self) -> dict[str, Any]:
        cfg = self.cfg
        t0 = time.perf_counter()
        micro = [self.stream.next_batch() for _ in range(cfg.grad_accum)]
        batches = [self._collate(m) for m in micro]
        n_local = sum(int((b["labels"][:, 1:] != IGNORE).sum()) for b in batches)
        n_global = parallel.all_reduce_sum(n_local)
        scale = self.d.world_size / max(n_global, 1.0)  # FSDP/DDP average grads over ranks
        self.model.train()
        ce_total = 0.0
        for b in batches:
            b = {k: v.to(self.d.device) for k, v in b.items()}
            ce, _ = token_ce_sum(self.model, b)
            loss = ce * scale
            if self.ds_engine is not None:
                self.ds_engine.backward(loss)
            else:
                loss.backward()
            ce_total += float(ce.detach())
        if self.ds_engine is not None:
            self.ds_engine.step()
            grad_norm = float(self.ds_engine.get_global_grad_norm() or 0.0)
        else:
            grad_norm = parallel.clip_grad_norm(self.model.parameters(), cfg.optim.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        dt = time.perf_counter() - t0
        flat = [e for m in micro for e in m]
        pad = padding_stats(flat, cfg.packing, cfg.max_length)
        real = parallel.all_reduce_sum(pad["real_tokens"])
        return {"loss": parallel.all_reduce_sum(ce_total) / max(n_global, 1.0),
                "lr": self.optimizer.param_groups[0]["lr"], "grad_norm": grad_norm,
                "tokens_per_s": real / dt, "supervised_tokens": n_global, "real_tokens": real,
                "padding_fraction": pad["padding_fraction"], "step_seconds": dt, "epoch": self.stream.state.epoch}

    def train(self, until: int | None = None) -> Path:
        """Train to ``max_steps`` (or stop early after step ``until``, as a crash would)."""
        cfg = self.cfg
        self._resume()
        logger = MetricsLogger(self.out / "metrics.jsonl", enabled=self.d.is_main,
                               wandb_project=cfg.logging.wandb_project, wandb_mode=cfg.logging.wandb_mode,
                               run_name=self.out.name, config=asdict(cfg), resume_step=self.step + 1)
        bar = None
        if self.d.is_main and cfg.logging.progress:
            from tqdm import tqdm  # noqa: PLC0415
            bar = tqdm(total=cfg.max_steps, initial=self.step, desc="sft", dynamic_ncols=True)
        try:
            while self.step < cfg.max_steps:
                m = self.train_step()
                m["skipped_rows"] = dict(self.builder.skipped)
                if self.step % cfg.logging.log_every == 0 or self.step == cfg.max_steps:
                    logger.log(m, self.step)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{m['loss']:.3f}", lr=f"{m['lr']:.1e}", tok_s=f"{m['tokens_per_s']:.0f}")
                if self.step % cfg.save_every == 0 or self.step == cfg.max_steps:
                    self.save()
                if until is not None and self.step >= until:
                    return self.out
        finally:
            if bar is not None:
                bar.close()
            logger.close()
        final = self.out / "final"
        last = parallel.step_dir(self.ckpt_root, self.step) / "hf"
        if self.d.is_main:
            if final.is_symlink() or final.exists():
                final.unlink() if final.is_symlink() else None
            if not final.exists():
                final.symlink_to(last.resolve(), target_is_directory=True)
            plot_curves(self.out / "metrics.jsonl", ["loss", "lr", "grad_norm", "tokens_per_s", "padding_fraction"],
                        self.out / "loss_curve.png", title="cold-start SFT")
        parallel.barrier()
        return final


def main(argv: list[str] | None = None) -> int:
    return parallel.run_trainer(SFTTrainer, SFTConfig, argv, "python -m paravt.sft.train", "SFT")


if __name__ == "__main__":
    sys.exit(main())
