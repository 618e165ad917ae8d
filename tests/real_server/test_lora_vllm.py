"""PARA-GRPO with LoRA against a REAL vLLM rollout server (CPU build): the run launches the server with the
base model and runtime LoRA loading (``--enable-lora``, ``--enable-tower-connector-lora`` for the vision
tower's adapters, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``), and after every step writes the adapter alone
(peft's format) and has the server load it (``/v1/load_lora_adapter``) under the name its requests give.
At every version the server's logprobs are the trainer's (the adapter over the base, text and vision), and
each push moves the adapter's bytes, reported beside a whole model's."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from tests.real_server.test_rl_vllm import _metrics, _rl_args, _run_rl

pytestmark = pytest.mark.real_server


def test_a_lora_run_pushes_only_the_adapter_and_the_server_follows_it(sft_world, sft_checkpoint, tmp_path):
    out = tmp_path / "rl_lora"
    r = _run_rl(_rl_args(sft_world, sft_checkpoint, out, "max_steps=4", "save_every=4", "grpo.max_staleness=0",
                         "lora.enabled=true", "lora.rank=8", "lora.alpha=16", "lora.vision=true", "optim.lr=1e-3"))
    assert r.returncode == 0, r.stderr[-3000:]
    rec = _metrics(out)
    assert [m["step"] for m in rec] == [1, 2, 3, 4]
    for i, m in enumerate(rec):
        assert m["rollout/skipped_prompts"] == 0 and m["rollout/samples"] > 0
        assert m["rollout/version_min"] == m["rollout/version_max"] == i
        # the server's processed logprobs are the trainer's re-score (the adapter over the base) at this version
        assert m["rollout/logprob_gap_max"] < 1e-4, (i, m["rollout/logprob_gap_max"])
        assert 0 < m["sync/push_bytes"] < m["sync/full_push_bytes"] / 10
    assert rec[-1]["ppo/kl"] > 0  # the policy left the base: the adapters the server followed are not zero
    log = (out / "rollout_vllm.log").read_text()
    assert "'enable_lora': True" in log and "'enable_tower_connector_lora': True" in log
    loads = [ln for ln in log.splitlines() if "Loaded new LoRA adapter: name 'paravt-lora'" in ln]
    assert len(loads) == 5, loads  # the start's version 0, then one per step
    kept = sorted(p.name for p in (out / "weights/lora").iterdir())
    assert kept == ["v000004"]  # max_staleness + 1 versions kept
    t = load_file(str(out / "weights/lora/v000004/adapter_model.safetensors"))
    assert any(".visual.blocks." in k for k in t) and any(float(v.abs().max()) > 0 for k, v in t.items() if "lora_B" in k)
    assert json.loads((out / "weights/lora/v000004/adapter_config.json").read_text())["r"] == 8
    print(f"\nLoRA push: {rec[0]['sync/push_bytes'] / 1e6:.3f} MB per version against "
          f"{rec[0]['sync/full_push_bytes'] / 1e6:.3f} MB for the whole model; logprob gap max per step: "
          + ", ".join(f"{m['rollout/logprob_gap_max']:.1e}" for m in rec)
          + "; push seconds: " + ", ".join(f"{m['time/sync']:.2f}" for m in rec))
