"""ParaVT: parallel video tool calling with PARA-GRPO (a reproduction of arXiv 2605.20342)."""

import os as _os
import sys as _sys

__version__ = "0.1.0"

# The same numbers from run to run on CPU: torch's CPU BLAS (MKL) in its conditional numerical reproducibility
# mode, set before any paravt process first calls MKL (MKL reads it once). Without it, a tiny SFT run on two
# OpenMP threads ended in one of two different results from its second step on (docs/RESULTS.md); with it,
# every run gave the same losses bit for bit, at the same speed. MKL_CBWR set by the user wins.
_os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

# A `python -m paravt.<entry point>` process that loads torch and transformers does so with the cyclic garbage
# collector paused, and the entry point turns it back on once its set-up is done (paravt.core.startup: ~0.9 CPU-s
# a process). Programs that import paravt are left as they are.
if _sys.argv[:1] == ["-m"]:
    from paravt.core import startup as _startup

    if _startup.entry_point() in _startup.HEAVY_ENTRY_POINTS:
        _startup.pause()
