"""Collective bytes as the dry run counts them: an FSDP2 group's all-gather holds its parameters in the
compute dtype (the buffer), of which each of N ranks receives (N-1)/N on a ring; the project's own
wrapping of the model gathers each text layer once in forward and once in backward."""

from __future__ import annotations

from tests.dryrun.conftest import run_script

GROUP = r'''
import json, torch
from paravt.dryrun.fake import HostMode, init_fake_group, make_fake_mode
from paravt.dryrun.measure import StepCounter
from paravt.dryrun.report import wire_bytes
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
N = 4
init_fake_group(0, N)
fm = make_fake_mode()
host = HostMode(fm)
with fm:
    with host:
        mesh = init_device_mesh("cpu", (N,))
        model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.Linear(128, 64))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        x = torch.zeros(8, 256)
    counter = StepCounter({})
    with counter, host:
        model(x).float().sum().backward()
calls, buf = counter.collectives["all_gather"]
rs_calls, rs_buf = counter.collectives["reduce_scatter"]
params = sum(p.numel() for p in model.parameters())
print(json.dumps({"calls": calls, "buffer": buf, "wire": wire_bytes("all_gather", buf, N), "params": params,
                  "rs_calls": rs_calls, "rs_buffer": rs_buf}))
'''


def test_all_gather_of_a_known_group_is_its_parameter_bytes():
    r = run_script(GROUP)
    # each layer gathered in forward and again in backward (resharded after forward), in bf16
    assert r["calls"] == 4
    assert r["buffer"] == 2 * 2 * r["params"]
    assert r["wire"] == r["buffer"] * 3 / 4
    # gradients reduce-scattered once per layer, in fp32 (the reduce dtype)
    assert r["rs_calls"] == 2 and r["rs_buffer"] == 4 * r["params"]


def test_project_wrapping_gathers_a_text_layer_twice_per_pass(small_config, tmp_path):
    from tests.dryrun.conftest import TEXT, dry_run

    args = ("configs/sft/qwen3vl_8b.yaml", "--model-config", str(small_config), "--gpus", "4", "global_batch_size=4",
            "max_length=1024", "video.max_frames=2", "--layers", "2,3")
    proc, res = dry_run(*args, json_out=tmp_path / "s.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    h, inter = TEXT["hidden_size"], TEXT["intermediate_size"]
    d = TEXT["head_dim"]
    q, kv = TEXT["num_attention_heads"] * d, TEXT["num_key_value_heads"] * d
    layer = h * q + 2 * h * kv + q * h + 3 * h * inter + 2 * h + 2 * d  # matmuls, two RMSNorms, q/k norms
    inc = res["linear_check"]["per_layer_increment"]["collectives.all_gather.buffer_bytes"]
    assert inc == 2 * 2 * layer  # forward + backward, bf16
