"""The command line of a training stage (``python -m paravt.sft.train`` / ``paravt.rl.train``): parse
the typed config, train, report, and end the way the launchers rely on.

* bad input (config, files, rows) is one line and exit 2, before any model loads;
* a run that stops itself (:class:`RunAborted`: lost work, a failed weight push) is one line and
  exit 3 with a resumable checkpoint;
* under ``scripts/_common.sh:torchrun_supervised`` either is also written to ``$PARAVT_ABORT_FILE``
  (:func:`paravt.core.shared_fs.report_abort`), so torchrun's restarts never resume a run that stopped
  on purpose.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

from paravt.core.shared_fs import report_abort, stopped_on_purpose
from paravt.core.startup import ready


class RunAborted(RuntimeError):
    """A run stopped itself after losing work it cannot train without (e.g. every rollout failed for
    ``rollout.max_bad_steps`` steps); the message names the first error. Exit code 3."""

    exit_code = 3

    def __init__(self, message: str, collectives_broken: bool = False, consequence: bool = False):
        super().__init__(message)
        # True when this rank left a collective the others still wait in: it must exit without
        # tearing the group down (that would wait for them); torchrun then ends the others.
        self.collectives_broken = collectives_broken
        # True when this rank stopped because another rank went away (its line is not the cause)
        self.consequence = consequence


def end_stopped_run(exc: Exception, prog: str, is_main: bool):
    """End this rank of a run that stopped itself (:class:`RunAborted`, exit 3) or found bad data while
    training (exit 2): one line, the abort file for the launcher, a non-zero exit; the newest
    checkpoint resumes it. A rank that left a collective the others still wait in
    (``collectives_broken``) exits at once, without tearing the group down (that would wait for
    them): torchrun ends the other ranks when it sees this one's exit."""
    import torch.distributed as dist  # noqa: PLC0415

    from paravt.data.schema import DataError  # noqa: PLC0415

    code = exc.exit_code if isinstance(exc, RunAborted) else 2
    broken = getattr(exc, "collectives_broken", False)
    if is_main or isinstance(exc, DataError) or broken:  # a broken rank names its own cause
        print(f"{prog}: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
    # a rank stopped by another's failure never replaces that rank's line (rank 0's otherwise wins)
    report_abort(code, f"{prog}: {exc}", cause=not getattr(exc, "consequence", False))
    if broken:
        logging.shutdown()
        os._exit(code)
    if dist.is_initialized():
        dist.destroy_process_group()
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", 1)) > 1:
        logging.shutdown()
        os._exit(code)
    raise SystemExit(code) from None


def run_trainer(trainer_path: str, schema, argv: list[str] | None, prog: str, label: str) -> int:
    """The CLI of a training stage: parse the typed config, train, report, tear the group down.
    ``trainer_path`` ("module:Class") is imported only after the config parsed: ``--help`` and bad input
    never wait for torch and the model code. ``prog`` names the command in messages; a launcher that
    starts the trainer itself sets ``PARAVT_PROG`` (e.g. ``run_sft.sh``) so its users read the name
    they typed."""
    from paravt.core.config import parse_cli, require_cuda_if_needed  # noqa: PLC0415

    from paravt.core.procs import OutputLock, OutputLockBusy  # noqa: PLC0415
    from paravt.data.schema import DataError  # noqa: PLC0415

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if stopped_on_purpose():  # a restart of a run that stopped itself: nothing to do, the launcher reports it
        return 0
    prog = os.environ.get("PARAVT_PROG") or prog
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_cli(schema, argv, prog)
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    # deepspeed (ZeRO, and transformers' integration) guesses its accelerator, with a warning, when unset
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    recipe = argv[0] if argv and argv[0].endswith((".yaml", ".yml")) else "this config"
    require_cuda_if_needed(cfg, prog, recipe, label.lower())
    lock = None
    try:
        if hasattr(cfg, "check_inputs"):
            cfg.check_inputs()
        if int(os.environ.get("RANK", 0)) == 0:  # one run per output directory (the lock dies with its holder)
            lock = OutputLock(cfg.output_dir).acquire()
        module, cls = trainer_path.split(":")
        trainer = getattr(importlib.import_module(module), cls)(cfg)
        ready()  # loaded and built: the collector runs again (paravt.core.startup)
    except (OutputLockBusy, DataError, ValueError, FileNotFoundError) as exc:
        # The user's input, not a crash: one line, exit 2. (The launch scripts run this same check in
        # a preflight before torchrun, so torchrun never restarts workers for a deterministic error.)
        print(f"{prog}: {' '.join(str(exc).split())}", file=sys.stderr)
        report_abort(2, f"{prog}: {exc}")
        if dist.is_initialized():
            dist.destroy_process_group()
        raise SystemExit(2) from None
    try:
        final = trainer.train()
    except (DataError, RunAborted) as exc:
        end_stopped_run(exc, prog, trainer.dist.is_main)
    if lock is not None:
        lock.release()
    if trainer.dist.is_main:
        print(f"{label} done ({trainer.out.name}): {trainer.global_step} steps; model at {final}")
    if dist.is_initialized():
        world = dist.get_world_size()
        dist.destroy_process_group()
        if world > 1:
            # Everything is written (checkpoints, final/, metrics; the logger is closed) and all
            # ranks passed the last barrier. Skip interpreter finalisation in torchrun workers:
            # under load a worker occasionally aborted there ("terminate called without an active
            # exception", SIGABRT from a native thread torn down by a static destructor; seen once
            # in CI on the 2-rank gloo test), which turns a finished run into a failed launch.
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    return 0
