"""A process's start-up without the cyclic garbage collector's full passes.

Importing torch and transformers' Qwen3-VL stack creates about a million long-lived objects (modules,
classes, functions), and the collector, at its default thresholds, scans all of them again and again while
they are being created: dozens of collections that find almost nothing. With it paused, a process that loads
the stack starts ~0.9 CPU-s sooner (4.9 -> 4.0 s on this project's 2-core machines, docs/RESULTS.md); the
SFT and RL trainers, every eval cell, the in-process server and the dry run are such processes, many times
over in the pipeline and the tests.

* ``paravt/__init__.py`` calls :func:`pause` when the process was started as ``python -m paravt.…``
  (``sys.argv[0] == "-m"`` while the package loads): the entry points of this package, nothing imported
  into another program. ``PARAVT_STARTUP_GC=on`` keeps the collector running throughout.
* Each entry point calls :func:`ready` once its set-up is done (modules loaded, the model built), before
  its long work: one full collection of what the set-up left as garbage, then ``gc.freeze()`` moves the
  survivors out of every later collection (they live as long as the process), and the collector runs
  again as usual. A collector left paused for a whole run would keep every reference cycle: the full
  dry run, paused throughout, peaked at twice the memory. A child forked before :func:`ready` runs it at
  once (``os.register_at_fork``).
"""

from __future__ import annotations

import gc
import os

_paused = False


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

