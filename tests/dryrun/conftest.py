"""A small model with Qwen3-VL-8B's structure (untied head, GQA, M-RoPE, deepstack, the 8B's vocabulary and
token ids) for dry runs that take seconds, and a runner of the dry run in its own process (it installs a
fake process group as the default group, which must not leak into other tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TEXT = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "intermediate_size": 512, "vocab_size": 151936, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [12, 10, 10],
                            "mrope_interleaved": True}}
VISION = {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "out_hidden_size": 256,
          "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 2304,
          "deepstack_visual_indexes": [0, 1], "in_channels": 3}


@pytest.fixture(scope="session")
def small_config(tmp_path_factory) -> Path:
    """A folder holding the small model's ``config.json``."""
    from transformers import Qwen3VLConfig

    out = tmp_path_factory.mktemp("small_vl")
    Qwen3VLConfig(text_config=TEXT, vision_config=VISION, image_token_id=151655, video_token_id=151656,
                  vision_start_token_id=151652, vision_end_token_id=151653,
                  tie_word_embeddings=False).save_pretrained(out)
    return out


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def dry_run(*args: str, json_out: Path | None = None) -> tuple[subprocess.CompletedProcess, dict | None]:
    """``python -m paravt.dryrun ARGS [--json json_out]`` from the repository root: (process, its JSON)."""
    cmd = [sys.executable, "-m", "paravt.dryrun", *args] + (["--json", str(json_out)] if json_out else [])
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=900)
    data = json.loads(json_out.read_text()) if json_out is not None and json_out.exists() else None
    return proc, data


def run_script(code: str) -> dict:
    """Run ``code`` (which prints one JSON line last) in a fresh interpreter; its JSON."""
    proc = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
