"""Shared by the benchmark scripts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_result(out: str | Path, res: dict[str, Any]) -> int:
    """Write ``res`` as JSON to ``out`` (parents created), print it; the script's exit code (0)."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))
    return 0
