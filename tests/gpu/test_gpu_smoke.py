"""GPU-only end-to-end checks, skipped on machines without CUDA (never run in CPU CI).

Run on a GPU node with ``bash scripts/test.sh -m gpu tests/gpu``."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_sft_two_steps_bf16_on_gpu(world, tiny_dir, tmp_path):
    out = tmp_path / "sft"
    r = subprocess.run([sys.executable, "-m", "paravt.sft.train", "configs/sft/tiny.yaml", f"model_path={tiny_dir}",
                        f"output_dir={out}", f"data.0.path={world}/local/paravt_sft_synth.parquet", "max_steps=2",
                        "save_every=2", "dtype=bfloat16", "gradient_checkpointing=true", "logging.wandb_project=null"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "final/config.json").exists()


@pytest.mark.skipif(not Path(".venv-sglang/bin/python").exists(), reason="needs .venv-sglang (setup_env.sh rl)")
def test_sglang_server_generates_with_logprobs(tiny_dir, tmp_path):
    from paravt.engines.base import SamplingParams
    from paravt.engines.sglang import SGLangEngine, SGLangServer, SGLangServerConfig

    cfg = SGLangServerConfig(model_path=str(tiny_dir), gpus=[int(os.environ.get("PARAVT_TEST_GPU", 0))],
                             mem_fraction_static=0.3, context_length=4096, port=31555,
                             log_file=str(tmp_path / "sglang.log"))
    with SGLangServer(cfg):
        async def go():
            eng = SGLangEngine(cfg.url)
            try:
                return await eng.generate([1, 2, 3], None, SamplingParams(temperature=0.7, max_new_tokens=8, seed=1))
            finally:
                await eng.close()
        out = asyncio.run(go())
    assert out.error is None and len(out.token_ids) == len(out.logprobs) > 0
