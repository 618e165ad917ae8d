"""A process's start-up without the cyclic garbage collector's full passes.

Importing torch and transformers' Qwen3-VL stack creates about a million long-lived objects (modules,
classes, functions), and the collector, at its default thresholds, scans all of them again and again while
they are being created: dozens of collections that find almost nothing. With it paused, a process that loads
the stack starts ~0.9 CPU-s sooner (4.9 -> 4.0 s on this project's 2-core machines, docs/RESULTS.md); the
SFT and RL trainers, every eval cell, the in-process server and the dry run are such processes, many times
over in the pipeline and the tests.

* ``paravt/__init__.py`` calls :func:`pause` when the process was started as ``python -m M`` with M one of
  :data:`HEAVY_ENTRY_POINTS` (``sys.argv[0] == "-m"`` while the package loads, M read from
  ``sys.orig_argv``): nothing imported into another program, and no light tool (a report, a node's
  watcher) that has nothing heavy to load. ``PARAVT_STARTUP_GC=on`` keeps the collector running throughout.
* Each of those entry points calls :func:`ready` once its set-up is done (modules loaded, the model built), before
  its long work: one full collection of what the set-up left as garbage, then ``gc.freeze()`` moves the
  survivors out of every later collection (they live as long as the process), and the collector runs
  again as usual. A collector left paused for a whole run would keep every reference cycle: the full
  dry run, paused throughout, peaked at twice the memory. A child forked before :func:`ready` runs it at
  once (``os.register_at_fork``).
"""

from __future__ import annotations

import gc
import os
import sys

#: The entry points that load torch and the model code before their work, each reaching :func:`ready` when set up.
HEAVY_ENTRY_POINTS = frozenset({"paravt.sft.train", "paravt.rl.train", "paravt.eval.driver", "paravt.engines.hf_server",
                                "paravt.analysis.probe", "paravt.models.tiny", "paravt.dryrun"})

_paused = False


def entry_point() -> str | None:
    """M of ``python [options] -m M ...`` while the package loads for it, else None."""
    argv = getattr(sys, "orig_argv", [])
    if sys.argv[:1] != ["-m"] or "-m" not in argv[1:-1]:
        return None
    return argv[argv.index("-m", 1) + 1]


def pause() -> None:
    """Stop automatic collections until :func:`ready` (no-op when the collector is already off)."""
    global _paused
    if gc.isenabled() and os.environ.get("PARAVT_STARTUP_GC", "").lower() != "on":
        gc.disable()
        _paused = True


def ready() -> None:
    """The set-up is done: collect its garbage once, freeze what survives, collect automatically again.
    Idempotent; nothing happens in a process :func:`pause` did not pause."""
    global _paused
    if not _paused:
        return
    _paused = False
    gc.collect()
    gc.freeze()
    gc.enable()


def paused() -> bool:
    return _paused


os.register_at_fork(after_in_child=ready)

