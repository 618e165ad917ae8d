"""The conformance group runs only in .venv-conformance (``bash scripts/test.sh --conformance``),
where the pinned sglang and vllm wheels are installed. There, a missing wheel is an import
error that fails the run, never a skip."""

import os

if os.environ.get("PARAVT_CONFORMANCE") != "1":
    collect_ignore_glob = ["test_*.py"]
