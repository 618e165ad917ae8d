"""``bash scripts/test.sh --gpu`` sets PARAVT_REQUIRE_GPU=1: there, no CUDA is a failure, never a skip."""

import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PARAVT_REQUIRE_GPU") == "1" and not torch.cuda.is_available():
        raise pytest.UsageError("PARAVT_REQUIRE_GPU=1 but torch has no CUDA here: the GPU tests cannot run")
