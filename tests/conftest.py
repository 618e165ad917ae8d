"""Shared fixtures: a small synthetic world and the tiny model, built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> Path:
    """A materialized synthetic world: media/, parquet/ (sentinel paths), local/ (file:// paths)."""
    from paravt.data.materialize import materialize
    from paravt.data.synthetic.world import WorldConfig
    from paravt.data.synthetic.writer import build_world

    out = tmp_path_factory.mktemp("world")
    build_world(out, WorldConfig(seed=0, n_train_videos=8, n_eval_videos=4), progress=False)
    materialize(out / "media", out / "parquet", out / "local")
    return out


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from paravt.models.tiny import build_tiny

    out = tmp_path_factory.mktemp("tiny")
    build_tiny(out, seed=0)
    return out


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    """(model, processor) of the tiny Qwen3-VL, loaded through the shared loading helpers."""
    from paravt.models.loading import load_model, load_processor

    return load_model(tiny_dir).eval(), load_processor(tiny_dir)


@pytest.fixture(scope="session")
def tiny8b_dir(tmp_path_factory) -> Path:
    """A tiny Qwen3-VL with Qwen3-VL-8B's structure (``paravt.models.tiny.tiny_8b_structure_shape``)."""
    from paravt.models.tiny import build_tiny, tiny_8b_structure_shape

    out = tmp_path_factory.mktemp("tiny8b")
    build_tiny(out, seed=0, shape=tiny_8b_structure_shape(), progress=False)
    return out
