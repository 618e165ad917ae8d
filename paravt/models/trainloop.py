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
        self.t, self.desc = trainer, desc
        self.logger: MetricsLogger | None = None
        self.bar = None

    def __enter__(self) -> "TrainLoop":
        t, lc = self.t, self.t.cfg.logging
        self.logger = MetricsLogger(t.out / "metrics.jsonl", enabled=t.d.is_main, wandb_project=lc.wandb_project,
                                    wandb_mode=lc.wandb_mode, run_name=t.out.name, config=asdict(t.cfg),
                                    resume_step=t.global_step + 1)
        if t.d.is_main and lc.progress:
            from tqdm import tqdm  # noqa: PLC0415

            self.bar = tqdm(total=t.cfg.max_steps, initial=t.global_step, desc=self.desc, dynamic_ncols=True)
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
        t = self.t
        final = t.out / "final"
        last = parallel.step_dir(t.ckpt_root, t.global_step) / "hf"
        if t.d.is_main:
            if final.is_symlink():
                final.unlink()
            if not final.exists() and last.exists():
                final.symlink_to(last.resolve(), target_is_directory=True)
            plot_curves(t.out / "metrics.jsonl", curves, t.out / png, title=title, smooth=smooth)
        parallel.barrier()
        return final
