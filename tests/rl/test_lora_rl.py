"""PARA-GRPO with LoRA (``lora.enabled=true``): the adapters train over the frozen base, which is also the KL
reference (the actor with its adapters off: no second model in memory); the in-process engine gets the
merged weights by the usual push; with LoRA off nothing changes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from paravt.core.config import load_config
from paravt.models import lora
from paravt.models.loading import load_model
from paravt.rl.config import RLConfig
from paravt.rl.trainer import RLTrainer
from tests.rl.global_batch_script import samples

ROOT = Path(__file__).resolve().parents[2]


def _over(world, tiny_dir, out, *extra):
    return [f"model_path={tiny_dir}", f"output_dir={out}", f"train_data=[{world}/local/paravt_rl_synth.parquet]",
            "hierarchical_agent.max_new_tokens=40", "hierarchical_agent.crop.subagent_max_tokens=16",
            "grpo.prompts_per_step=2", "grpo.n_samples=2", "logging.wandb_project=null", "logging.progress=false",
            *extra]


def _trainer(world, tiny_dir, out, *extra):
    return RLTrainer(load_config(RLConfig, "configs/rl/tiny.yaml", _over(world, tiny_dir, out, *extra)))


@pytest.mark.parametrize("kl", [["grpo.kl_mode=loss_k3"], pytest.param(["grpo.kl_mode=reward_k1", "grpo.adv_norm_level=token"],
                                                                       marks=pytest.mark.slow)])
def test_a_fresh_adapter_steps_as_the_full_model_and_its_reference_is_the_base(kl, world, tiny_dir, tmp_path):
    """A fresh adapter (B = 0) leaves the model as it was: the step's loss and every metric but the gradient norm
    equal those of the full-parameter trainer (which holds a second model as its reference); after the step
    the reference is still exactly the base while the policy moved."""
    full = _trainer(world, tiny_dir, tmp_path / "full", "grpo.kl_coef=0.05", *kl)
    assert full.ref is not None and full.ref is not full.actor and lora.peft_model(full.actor) is None
    assert all(p.requires_grad for p in full.actor.parameters())
    tr = _trainer(world, tiny_dir, tmp_path / "lora", "grpo.kl_coef=0.05", "lora.enabled=true", "lora.rank=4",
                  "optim.lr=1e-2", *kl)
    assert tr.ref is tr.actor  # no second model: the reference is the actor with its adapters off
    assert {n for n, p in tr.actor.named_parameters() if p.requires_grad} == \
        {n for n, _ in tr.actor.named_parameters() if lora.is_adapter_param(n)}
    rl, _ = samples(tr.processor)
    a, b = full.train_on(rl), tr.train_on(rl)
    assert a.keys() == b.keys()
    for k in a.keys() - {"ppo/grad_norm"}:
        assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), k
    base = load_model(tiny_dir).eval()
    pad = rl[0]
    owned = [rl]
    with lora.reference(tr.ref):
        ref = tr._score(tr.ref, owned, pad)
    want = tr._score(base, owned, pad)
    assert all(torch.equal(ref[k], want[k]) for k in want)  # the frozen base, exactly
    moved = tr._score(tr.actor, owned, pad)
    assert any(not torch.allclose(moved[k], want[k]) for k in want)  # the adapters trained
    c = tr.train_on(rl)
    assert c["ppo/kl"] > 0 if "loss_k3" in kl[0] else c["ppo/kl_reward"] != 0  # a KL to the base, no longer 0
    assert tr.sync.push_bytes == {}  # push metrics come with pushes


def test_a_lora_run_refuses_another_reference_model():
    with pytest.raises(ValueError, match="ref_model_path must be null or model_path"):
        RLTrainer(load_config(RLConfig, "configs/rl/tiny.yaml", ["model_path=/nonexistent/m", "ref_model_path=/other",
                                                                   "train_data=[x.parquet]", "lora.enabled=true"]))


@pytest.mark.launcher  # run_rl.sh under torchrun, two gloo ranks: CI's launcher group
def test_run_rl_with_lora_pushes_the_merged_model_to_the_in_process_engine(world, tiny_dir, tmp_path):
    """``bash scripts/run_rl.sh configs/rl/tiny.yaml lora.enabled=true`` on two FSDP2 ranks, synchronous: after
    every push the engine's logprobs are the trainer's (the merged weights reached it), each checkpoint holds
    the adapter beside the merged export, and the push's bytes are logged beside a whole model's."""
    out = tmp_path / "rl"
    r = subprocess.run(["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml",
                        *_over(world, tiny_dir, out, "max_steps=3", "save_every=3", "grpo.max_staleness=0",
                               "lora.enabled=true", "lora.rank=8", "lora.vision=true", "optim.lr=1e-2")],
                       cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "NPROC": "2"})
    assert r.returncode == 0, r.stderr[-3000:]
    rec = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in rec] == [1, 2, 3]
    for m in rec:
        assert m["rollout/logprob_gap_max"] < 1e-4, m["rollout/logprob_gap_max"]
        assert m["sync/push_bytes"] == m["sync/full_push_bytes"] > 0  # the in-process engine takes the whole model
    ck = out / "checkpoints/step_000003"
    assert (ck / "adapter/adapter_model.safetensors").exists() and (ck / "hf/model.safetensors").exists()
    from safetensors.torch import load_file
    merged, base = load_file(str(ck / "hf/model.safetensors")), load_file(str(tiny_dir / "model.safetensors"))
    assert merged.keys() == base.keys()


def test_which_engine_gets_the_adapter_and_which_the_merged_weights():
    """vLLM servers the run launches load each version's adapter at run time; SGLang, the in-process engine, servers
    given by URL and lora.push=merged get the merged weights by their usual transport."""
    from paravt.engines.vllm import VLLMServerConfig, launch_command, lora_launch
    from paravt.rl.engine_sync import pushes_adapter, run_weight_update

    def cfg(recipe, *over):
        return load_config(RLConfig, recipe, ["model_path=m", "train_data=[x]", "lora.enabled=true", *over])

    assert run_weight_update(cfg("configs/rl/tiny_vllm.yaml"), False).transport == "adapter"
    assert run_weight_update(cfg("configs/rl/tiny_vllm.yaml", "lora.enabled=false"), False).transport == "broadcast"
    assert run_weight_update(cfg("configs/rl/tiny_vllm.yaml", "lora.push=merged"), False).transport == "broadcast"
    assert not pushes_adapter(cfg("configs/rl/tiny_vllm.yaml", "rollout.replicas=0", "rollout.urls=[http://h:1]"))
    assert run_weight_update(cfg("configs/rl/tiny.yaml"), False).transport == "state_dict"
    assert run_weight_update(cfg("configs/rl/paragrpo_8b_lora_4gpu.yaml"), True).transport == "broadcast"  # SGLang
    argv, env = launch_command(lora_launch(VLLMServerConfig(model_path="m", rollout=True), 12, True))
    assert " ".join(argv).endswith("--enable-lora --max-loras 1 --max-lora-rank 16 --enable-tower-connector-lora")
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    argv, env = launch_command(VLLMServerConfig(model_path="m", rollout=True))
    assert "--enable-lora" not in argv and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env
    with pytest.raises(ValueError, match="rank <= 512"):
        lora_launch(VLLMServerConfig(model_path="m"), 1024, False)


def test_the_8b_lora_recipe_on_4_gpus_passes_the_preflight():
    """configs/rl/paragrpo_8b_lora_4gpu.yaml as run_rl.sh's preflight reads it on a 4-GPU node: SGLang on GPU 3,
    3 FSDP2 trainers for the 8B recipe's 56 samples a step; against the 8B recipe it changes the GPUs, the
    LoRA block, the lr and SGLang's vision cache (the vision tower is frozen), nothing of the method."""
    from dataclasses import asdict

    from paravt.core.config import parse_cli
    from paravt.rl.layout import plan

    cfg = parse_cli(RLConfig, ["configs/rl/paragrpo_8b_lora_4gpu.yaml"], "run_rl.sh")
    assert cfg.needs_cuda()  # a GPU recipe: the launcher stops on a machine without CUDA
    share = plan(cfg, 4, {})
    cfg.check_world_size(share.world)
    assert (share.world, cfg.rollout.server.gpus) == (3, [3])
    a, b = asdict(cfg), asdict(load_config(RLConfig, "configs/rl/paragrpo_8b.yaml"))
    assert {k for k in a if a[k] != b[k]} == {"output_dir", "lora", "optim", "rollout"}
    assert {k for k in a["optim"] if a["optim"][k] != b["optim"][k]} == {"lr"}
    assert {k for k in a["rollout"]["server"] if a["rollout"]["server"][k] != b["rollout"]["server"][k]} == \
        {"gpus", "vlm_cache_size_mb"}
    assert (cfg.lora.enabled, cfg.lora.rank, cfg.lora.alpha, cfg.lora.vision) == (True, 64, 128.0, False)
    assert a["paravt"] == b["paravt"] and a["grpo"] == b["grpo"]
