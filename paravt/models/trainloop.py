"""Scaffolding shared by the SFT and RL trainers: metrics (``metrics.jsonl`` + wandb), the
progress bar, and the end of a run (the ``final`` symlink to the last checkpoint's ``hf/`` and
the curves PNG). Checkpoint save/resume live in :mod:`paravt.models.parallel`."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from paravt.core.metrics import MetricsLogger, plot_curves
from paravt.models import parallel


class TrainLoop:
    """``with TrainLoop(trainer, "sft") as loop: ... loop.log(metrics, step, postfix)``; then
    ``loop.finish(...)``. Only rank 0 writes; every rank may call every method."""

    def __init__(self, trainer, desc: str):
        self.trainer, self.desc = trainer, desc
        self.logger: MetricsLogger | None = None
        self.bar = None

    def __enter__(self) -> "TrainLoop":
        trainer, log_cfg = self.trainer, self.trainer.cfg.logging
        self.logger = MetricsLogger(trainer.out / "metrics.jsonl", enabled=trainer.dist.is_main,
                                    wandb_project=log_cfg.wandb_project, wandb_mode=log_cfg.wandb_mode,
                                    run_name=trainer.out.name, config=asdict(trainer.cfg),
                                    resume_step=trainer.global_step + 1)
        if trainer.dist.is_main and log_cfg.progress:
            from tqdm import tqdm  # noqa: PLC0415

            self.bar = tqdm(total=trainer.cfg.max_steps, initial=trainer.global_step, desc=self.desc,
                            dynamic_ncols=True)
        return self

    def log(self, metrics: dict[str, Any] | None, step: int, postfix: dict[str, str] | None = None) -> None:
        """Write ``metrics`` at ``step`` (None: only advance the bar)."""
        if metrics is not None:
            self.logger.log(metrics, step)
        if self.bar is not None:
            self.bar.update(1)
            if postfix:
                self.bar.set_postfix(**postfix)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.logger is not None:
            self.logger.close()

    def finish(self, curves: list[str], png: str, title: str, smooth: int = 1) -> Path:
        """Point ``out/final`` at the last checkpoint's ``hf/`` and draw the curves; returns ``final``."""
        trainer = self.trainer
        final = trainer.out / "final"
        last = parallel.step_dir(trainer.ckpt_root, trainer.global_step) / "hf"
        if trainer.dist.is_main:
            if final.is_symlink():
                final.unlink()
            if not final.exists() and last.exists():
                final.symlink_to(last.resolve(), target_is_directory=True)
            plot_curves(trainer.out / "metrics.jsonl", curves, trainer.out / png, title=title, smooth=smooth)
        parallel.barrier()
        return final
