"""The weight group's NCCL environment is the same on both ends: the servers a trainer launches get
the trainer's ``NCCL_CUMEM_ENABLE`` (0 unless set; run_rl.sh exports it for the trainers)."""

import pytest

from paravt.engines.sglang import SGLangServerConfig, launch_command as sglang_command
from paravt.engines.vllm import VLLMServerConfig, launch_command as vllm_command


@pytest.mark.parametrize("value", [None, "0", "1"])
def test_launched_servers_get_the_trainers_nccl_cumem_setting(value, monkeypatch, tiny_dir):
    if value is None:
        monkeypatch.delenv("NCCL_CUMEM_ENABLE", raising=False)
    else:
        monkeypatch.setenv("NCCL_CUMEM_ENABLE", value)
    want = value or "0"
    _, env = sglang_command(SGLangServerConfig(model_path=str(tiny_dir), gpus=[0]))
    assert env["NCCL_CUMEM_ENABLE"] == want
    _, env = vllm_command(VLLMServerConfig(model_path=str(tiny_dir), rollout=True))
    assert env["NCCL_CUMEM_ENABLE"] == want


def test_a_bad_reload_method_is_one_line_naming_the_options():
    """The rollout server's reload method (rollout.vllm.reload_method in the RL recipe) is one of vLLM's two."""
    with pytest.raises(ValueError) as e:
        VLLMServerConfig(reload_method="restart")
    assert str(e.value) == "rollout.vllm.reload_method must be one of paravt | reload_weights, got 'restart'"
