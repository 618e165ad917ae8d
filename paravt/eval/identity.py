"""The resume identity of an eval split: everything that changes its answers. A rerun reuses finished
samples only when its identity matches the one stored beside them (``run_config.json``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paravt.eval.config import EvalConfig

class ResumeMismatch(RuntimeError):
    """Existing results of a split were produced with other settings."""


def weights_fingerprint(model: str) -> str:
    """A fast fingerprint of a checkpoint's weight files (name, size, first and last MiB of each;
    16 GB of 8B weights are not hashed in full); a hub id or missing path is fingerprinted by name."""
    import hashlib  # noqa: PLC0415

    p = Path(model)
    files = sorted(list(p.glob("*.safetensors")) + list(p.glob("*.bin"))) if p.is_dir() else []
    if not files:
        return "name:" + model
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
            if size > (2 << 20):
                fh.seek(-(1 << 20), os.SEEK_END)
                h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def git_commit() -> str | None:
    import subprocess  # noqa: PLC0415

    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                           cwd=Path(__file__).resolve().parent)
        return r.stdout.strip() or None if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


#: EvalConfig fields that do not change a split's answers (where results go, how fast and how
#: loudly the run goes, how lost samples are judged, where the data is found). Every other field,
#: nested ones included, is part of the resume identity: a new setting is in it by default.
IDENTITY_EXCLUDED = frozenset({
    "row", "out", "splits", "data_root", "split_paths", "hub", "concurrency", "limit", "progress", "resume",
    "save_trajectory", "trajectory_thumbnails", "max_error_fraction", "retries", "shard_id", "num_shards",
    "server.urls", "server.base_port", "server.restart_between_datasets", "server.python",
    "mcq_judge.api_key_env", "mcq_judge.timeout_s",
})


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and all(isinstance(x, str) for x in v):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def run_identity(cfg: "EvalConfig", split: str) -> dict[str, Any]:
    """Everything that changes a split's answers; resuming requires it to match. Derived from the
    config: every field except :data:`IDENTITY_EXCLUDED` (and their sub-fields), plus the weights'
    fingerprint and the derived tool switch."""
    from dataclasses import asdict  # noqa: PLC0415

    flat = _flatten(asdict(cfg))
    keep = {k: v for k, v in flat.items()
            if not any(k == x or k.startswith(x + ".") for x in IDENTITY_EXCLUDED)}
    if "model" in keep and Path(str(cfg.model)).exists():
        # a checkpoint reached through a symlink (reproduce_tiny's seed_0 -> the quickstart's run) is the same
        keep["model"] = os.path.realpath(str(cfg.model))
    return {"split": split, "weights": weights_fingerprint(str(cfg.model)), "use_tools": cfg.agentic,
            "shard": [cfg.shard_id, cfg.num_shards], **keep}
