"""A run that loses its work stops, and never ends as a success.

:class:`LostWork` is held by :class:`~paravt.rl.trainer.RLTrainer`: after each rollout batch it
counts the steps that lost work (prompts skipped because an episode failed: a server, a tool, a
missing video) and stops the run with a checkpoint and exit 3 after ``rollout.max_bad_steps`` of
them in a row; a run whose last steps lost work ends with exit 3 too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from paravt.models import parallel
from paravt.models.parallel import DistInfo
from paravt.models.stage_main import RunAborted
from paravt.rl.config import RLConfig
from paravt.rl.rollout import RolloutBatch


class LostWork:
    """The run's count of steps that lost work (rank 0 counts; every rank takes part in the checks)."""

    def __init__(self, cfg: RLConfig, dist: DistInfo, ckpt_root: Path, save: Callable[[], Any]):
        """``save()``: the trainer's checkpoint (collective, returns its directory), written before a stop."""
        self.cfg, self.dist, self.ckpt_root, self.save = cfg, dist, Path(ckpt_root), save
        self.bad_steps = 0  # rank 0: consecutive steps that lost more than rollout.max_skipped_fraction
        self.first_bad_error: str | None = None

    def check(self, batch: RolloutBatch | None, global_step: int) -> None:
        """Stop rather than train on nothing. A step is bad when it skipped more than
        ``rollout.max_skipped_fraction`` of its prompts (their episodes lost work) or kept no sample (a step
        whose groups dynamic sampling all dropped for zero reward spread lost no work and is not bad);
        after ``rollout.max_bad_steps`` bad steps in a row every rank saves the last good weights as a
        checkpoint and raises :class:`~paravt.models.stage_main.RunAborted` (one line, exit 3).
        Collective: every rank calls it."""
        r = self.cfg.rollout
        abort = None
        if batch is not None:
            no_signal = batch.metrics.get("dynamic_sampling/groups_dropped", 0) > 0
            bad = batch.skipped_fraction > r.max_skipped_fraction or (not batch.samples and not no_signal)
            self.bad_steps = self.bad_steps + 1 if bad else 0
            if bad and self.bad_steps == 1:
                self.first_bad_error = batch.first_error or "no samples"
            if r.max_bad_steps and self.bad_steps >= r.max_bad_steps:
                abort = (f"rollouts lost work on {self.bad_steps} steps in a row (each skipped more than "
                         f"rollout.max_skipped_fraction={r.max_skipped_fraction:g} of its prompts or kept no sample; "
                         f"rollout.max_bad_steps={r.max_bad_steps}); first error: {self.first_bad_error}")
        abort = parallel.broadcast_object(abort)
        if abort is None:
            return
        done = parallel.latest_complete(self.ckpt_root)
        if global_step > 0 and (done is None or done.name != parallel.step_dir(self.ckpt_root, global_step).name):
            done = self.save()
        where = f"checkpoint {done} (resume=auto continues from it)" if done is not None else \
            "no step was trained; nothing to resume"
        raise RunAborted(f"{abort}; {where}")

    def check_ended_well(self, global_step: int) -> None:
        """A run whose last steps lost work (fewer than ``rollout.max_bad_steps`` of them, so the
        abort never fired: a short run, a failure near the end) ends with exit 3, never as a success;
        its checkpoint holds the weights trained so far. Collective."""
        bad, err = parallel.broadcast_object((self.bad_steps, self.first_bad_error) if self.dist.is_main else None)
        if not bad or global_step < self.cfg.max_steps:
            return
        done = parallel.latest_complete(self.ckpt_root)
        raise RunAborted(
            f"the run ended with its last {bad} step(s) losing work (each skipped more than "
            f"rollout.max_skipped_fraction={self.cfg.rollout.max_skipped_fraction:g} of its prompts or kept no "
            f"sample); first error: {err}; checkpoint {done} holds the weights (resume=auto continues from it)")
