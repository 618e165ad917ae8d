"""Secrets for the Python entry points, read as the launch scripts read them.

The shell launchers source the repository's ``.secrets.env`` (``scripts/_common.sh``); a user who
starts ``python -m paravt.data.fetch`` or ``python -m paravt.eval.driver`` directly gets the same
``HF_TOKEN`` (gated datasets and models), ``WANDB_API_KEY`` and judge keys from the same file, parsed
by python-dotenv. A variable already set in the environment wins; empty values in the file (the
example's ``HF_TOKEN=``) are not exported, so they never hide a token huggingface_hub would find in
its own login file.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[2] / ".secrets.env"


def load_secrets(path: str | Path | None = None) -> list[str]:
    """Export the file's non-empty variables that are not set yet; the names exported."""
    p = Path(path) if path is not None else Path(os.environ.get("PARAVT_SECRETS_FILE", DEFAULT))
    if not p.is_file():
        return []
    from dotenv import dotenv_values  # noqa: PLC0415

    done = []
    for key, value in dotenv_values(p).items():
        if value and key not in os.environ:
            os.environ[key] = value
            done.append(key)
    return done
