"""GPU-only end-to-end checks, skipped on machines without CUDA (never run in CPU CI).

Run on a GPU node with ``bash scripts/gpu_check.sh`` (these tests, then the 8B-width figures)."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _weights_changed(a: Path, b: Path) -> bool:
    from safetensors.torch import load_file

    x = load_file(next(a.glob("*.safetensors")))
    y = load_file(next(b.glob("*.safetensors")))
    return any(not torch.equal(x[k].float(), y[k].float()) for k in y if k in x)


def test_sft_two_steps_bf16_on_gpu(world, tiny_dir, tmp_path):
    """FSDP2 with bf16 mixed precision (fp32 master weights) and activation checkpointing, on CUDA:
    the run says so, trains (the weights move) and exports."""
    out = tmp_path / "sft"
    r = subprocess.run([sys.executable, "-m", "paravt.sft.train", "configs/sft/tiny.yaml", f"model_path={tiny_dir}",
                        f"output_dir={out}", f"data.0.path={world}/local/paravt_sft_synth.parquet", "max_steps=2",
                        "save_every=2", "dtype=bfloat16", "gradient_checkpointing=true", "logging.wandb_project=null"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "final/config.json").exists()
    assert "Guessing device ID" not in r.stderr and "gradient_checkpointing_enable` is deprecated" not in r.stderr
    assert _weights_changed(out / "final", tiny_dir)
    import json
    rec = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rec) == 2 and all(m["loss"] == m["loss"] for m in rec)  # finite, not NaN


def test_rl_two_steps_through_run_rl_on_gpu(world, tiny_dir, tmp_path):
    """run_rl.sh as a user runs it: torchrun, NCCL, FSDP2 bf16 mixed precision, the in-process engine
    in bf16 on the GPU; the trainer's re-score of the engine's tokens stays within bf16 noise."""
    import json

    out = tmp_path / "rl"
    r = subprocess.run(["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml", f"model_path={tiny_dir}",
                        f"output_dir={out}", f"train_data=[{world}/local/paravt_rl_synth.parquet]", "max_steps=2",
                        "save_every=2", "grpo.prompts_per_step=2", "grpo.n_samples=2", "hierarchical_agent.max_new_tokens=48",
                        "trainer.dtype=bfloat16", "rollout.dtype=bfloat16", "trainer.gradient_checkpointing=true",
                        "logging.wandb_project=null", "logging.progress=false"],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "NPROC": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    rec = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in rec] == [1, 2] and all(m["ppo/tokens"] > 0 for m in rec)
    assert all(m["rollout/logprob_gap"] < 0.1 for m in rec), [m["rollout/logprob_gap"] for m in rec]
    assert _weights_changed(out / "final", tiny_dir)


def test_eval_with_subagents_on_gpu(world, tiny_dir, tmp_path, monkeypatch):
    """The eval driver's in-process engine in bf16 on the GPU, agentic mode (crop_video as sub-agents)."""
    import paravt.eval.driver as drv
    from paravt.core.config import load_config
    from paravt.eval.config import EvalConfig
    from paravt.eval.driver import Evaluator

    built = []
    real = drv.build_engine

    def spy(*a, **k):
        built.append(real(*a, **k))
        return built[-1]

    monkeypatch.setattr(drv, "build_engine", spy)
    cfg = load_config(EvalConfig, None, [f"model={tiny_dir}", f"out={tmp_path}", f"split_paths={{synthetic: {world}/local}}",
                                         "max_new_tokens=48", "progress=false", "limit=4", "nframes=4", "dtype=bfloat16",
                                         "row=gpu"])
    res = Evaluator(cfg).run()["synthetic"]
    assert res["evaluated"] == 4 and res["errors"] == 0
    p = next(built[0].engine.model.parameters())
    assert p.device.type == "cuda" and p.dtype == torch.bfloat16


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


@pytest.mark.skipif(not Path(".venv-sglang/bin/python").exists(), reason="needs .venv-sglang (setup_env.sh rl)")
def test_sglang_rollout_with_images_matches_the_local_ids(tiny, world, tmp_path):
    """An image-carrying prompt through a real SGLang server: one <|image_pad|> per image sent,
    the server's prompt_tokens equal the locally expanded prompt, and the trainer's re-score of
    the returned tokens matches the server's logprobs (bf16 tolerance)."""
    from paravt.models.tokenize import encode_prompt
    from paravt.core.prompts import THINK_PREFIX, build_messages
    from paravt.core.video import sample_overview
    from paravt.data.schema import load_rl_rows
    from paravt.data.tool_specs import DATA_TOOL_SCHEMAS
    from paravt.engines.base import SamplingParams
    from paravt.models.tokenize import vision_token_ids
    from paravt.engines.sglang import SGLangEngine, SGLangServer, SGLangServerConfig

    model, proc = tiny
    row = load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])[0][0]
    ids, imgs = encode_prompt(proc, build_messages("agentic_minimal", row.question, sample_overview(row.video, 5),
                                                   "v.mp4", 60.0, tool_schemas=DATA_TOOL_SCHEMAS), THINK_PREFIX)
    pad = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    cfg = SGLangServerConfig(model_path=str(Path(model.name_or_path)), gpus=[int(os.environ.get("PARAVT_TEST_GPU", 0))],
                             mem_fraction_static=0.3, context_length=4096, port=31556, vlm_cache_size_mb=0,
                             log_file=str(tmp_path / "sglang.log"))
    with SGLangServer(cfg):
        async def go():
            eng = SGLangEngine(cfg.url, image_token_id=pad, banned_token_ids=vision_token_ids(proc.tokenizer))
            try:
                return await eng.generate(ids, imgs, SamplingParams(temperature=0.7, max_new_tokens=16, seed=3))
            finally:
                await eng.close()
        out = asyncio.run(go())
    assert out.error is None, out.error  # includes the prompt_tokens == len(local ids) check
    seq = torch.tensor([list(ids) + out.token_ids])
    pv, grid = imgs.tensors(proc)
    with torch.no_grad():
        logits = model(input_ids=seq, attention_mask=torch.ones_like(seq), mm_token_type_ids=(seq == pad).long(),
                       pixel_values=pv, image_grid_thw=grid).logits[0, len(ids) - 1:-1].float()
    lp = torch.log_softmax(logits / 0.7, -1).gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(lp, torch.tensor(out.logprobs), atol=5e-2)
