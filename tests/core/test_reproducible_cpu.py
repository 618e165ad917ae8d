"""Every paravt process runs torch's CPU BLAS (MKL) in its conditional numerical reproducibility mode: two
OpenMP threads otherwise let a tiny SFT run end in one of two results (docs/RESULTS.md). MKL's own
``mkl_serv_cbwr_get`` (exported by torch's CPU library) says which mode the process is in."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = """
import ctypes, json, os, sys
if sys.argv[1] == "paravt":
    import paravt  # noqa: F401
import torch
try:
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    get = lib.mkl_serv_cbwr_get
except (OSError, AttributeError):
    print(json.dumps(None)); raise SystemExit
torch.randn(64, 64) @ torch.randn(64, 64)  # MKL has read its settings by now
print(json.dumps(get(-1)))  # MKL_CBWR_ALL: the branch bits and the STRICT bit
"""
MKL_CBWR_AUTO, MKL_CBWR_STRICT = 2, 0x10000


def _mode(first: str, **extra: str):
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"} | {"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1",
                                                                      **extra}
    out = subprocess.run([sys.executable, "-c", PROBE, first], env=env, capture_output=True, text=True, check=True,
                         timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_paravt_puts_mkl_in_its_strict_reproducible_mode_and_a_users_setting_wins():
    mode = _mode("paravt")
    if mode is None:
        pytest.skip("this torch build exports no mkl_serv_cbwr_get (not an MKL build)")
    assert mode == MKL_CBWR_AUTO | MKL_CBWR_STRICT, hex(mode)
    assert _mode("paravt", MKL_CBWR="AUTO") == MKL_CBWR_AUTO
