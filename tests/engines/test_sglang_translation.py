"""SGLang cannot run on CPU: its launcher command line and the request/response translation,
by hand here; tests/conformance checks the same bodies with the pinned SGLang wheel's own types."""

import pytest
from PIL import Image

from paravt.engines.base import EngineError, SamplingParams
from paravt.models.images import ImageInputs
from paravt.engines.sglang import (SGLangServerConfig, generate_payload, launch_command,
                                   parse_generate_response, update_from_disk_payload)


def test_launch_command_has_reference_settings(monkeypatch):
    monkeypatch.delenv("NCCL_CUMEM_ENABLE", raising=False)  # the trainer's setting reaches the server: 0 unless set
    cfg = SGLangServerConfig(model_path="/ckpt/step5", gpus=[7], port=31000, context_length=65536)
    argv, env = launch_command(cfg)
    assert argv[:3] == [".venv-sglang/bin/python", "-m", "sglang.launch_server"]
    s = " ".join(argv)
    for flag in ("--model-path /ckpt/step5", "--port 31000", "--tp-size 1", "--dtype bfloat16",
                 "--mem-fraction-static 0.7", "--context-length 65536"):
        assert flag in s
    assert env == {"CUDA_VISIBLE_DEVICES": "7", "SGLANG_VLM_CACHE_SIZE_MB": "4096", "NCCL_CUMEM_ENABLE": "0"}
    assert "--enable-deterministic-inference" not in argv
    argv, _ = launch_command(SGLangServerConfig(model_path="m", deterministic=True, served_model_name="paravt-8b"))
    assert "--enable-deterministic-inference" in argv and argv[argv.index("--served-model-name") + 1] == "paravt-8b"
    with pytest.raises(ValueError, match="tp_size"):
        SGLangServerConfig(model_path="m", gpus=[0, 1, 2], tp_size=2)
    with pytest.raises(ValueError, match="model_path"):
        launch_command(SGLangServerConfig())


def test_generate_payload():
    imgs = ImageInputs([Image.new("RGB", (32, 32), (255, 0, 0))])
    p = generate_payload([5, 9, 9, 9, 9, 7], imgs, SamplingParams(temperature=0.7, max_new_tokens=2048, seed=42,
                                                               stop=["</answer>"]), image_token_id=9)
    assert p["input_ids"] == [5, 9, 7] and p["return_logprob"] is True and p["stream"] is False  # one pad per image
    with pytest.raises(ValueError, match="image_token_id"):
        generate_payload([5, 9, 7], imgs, SamplingParams())
    with pytest.raises(ValueError, match="2 image placeholder runs"):
        generate_payload([9, 9, 5, 9], imgs, SamplingParams(), image_token_id=9)
    assert p["image_data"][0].startswith("data:image/png;base64,")
    sp = p["sampling_params"]
    assert sp["temperature"] == 0.7 and sp["max_new_tokens"] == 2048 and sp["sampling_seed"] == 42
    assert sp["skip_special_tokens"] is False and sp["no_stop_trim"] is True and sp["stop"] == ["</answer>"]
    assert "image_data" not in generate_payload([1], None, SamplingParams())
    assert "frequency_penalty" not in sp and "presence_penalty" not in sp  # off: not sent
    sp = generate_payload([1], None, SamplingParams(frequency_penalty=0.5, presence_penalty=0.1))["sampling_params"]
    assert (sp["frequency_penalty"], sp["presence_penalty"]) == (0.5, 0.1)
    assert generate_payload([1], None, SamplingParams(), banned_token_ids=[5, 6])["sampling_params"]["logit_bias"] == \
        {"5": -100.0, "6": -100.0}


def test_parse_generate_response():
    resp = {"text": "<answer>B</answer>", "output_ids": [11, 12, 2],
            "meta_info": {"finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 900,
                          "completion_tokens": 3, "weight_version": "4",
                          "output_token_logprobs": [[-0.1, 11, None], [-0.2, 12, None], [-0.05, 2, None]]}}
    out = parse_generate_response(resp, expected_prompt_tokens=900)
    assert out.token_ids == [11, 12, 2] and out.logprobs == [-0.1, -0.2, -0.05]
    assert out.finish_reason == "stop" and out.weight_version == 4
    bad = parse_generate_response(resp, expected_prompt_tokens=896)  # the server expanded images differently
    assert bad.finish_reason == "error" and "prompt_tokens=900" in bad.error
    resp["meta_info"]["finish_reason"] = {"type": "length", "length": 3}
    assert parse_generate_response([resp]).finish_reason == "length"
    resp["meta_info"]["finish_reason"] = {"type": "abort", "message": "oom"}
    out = parse_generate_response(resp)
    assert out.finish_reason == "error" and "oom" in out.error
    with pytest.raises(EngineError):
        parse_generate_response({"text": "x", "meta_info": {}})
    with pytest.raises(ValueError):  # ids and logprobs must pair up
        from paravt.engines.base import GenerationOutput
        GenerationOutput([1, 2], [0.0], "stop")


def test_weight_update_payloads():
    assert update_from_disk_payload("/ckpt/step10", 10) == {"model_path": "/ckpt/step10", "weight_version": "10",
                                                             "flush_cache": True}


def test_weights_checker_answers_become_per_tensor_checksums_one_set_per_tp_rank():
    from paravt.engines.base import EngineError
    from paravt.engines.sglang_protocol import checksums, unwritten

    one = {"success": True, "ranks": [{"checksums": {"a": "1", "b": "2"}, "per_gpu_checksum": "x",
                                       "parallelism_info": [{"role": "target", "tp_rank": 0}]}]}
    assert checksums(one) == {"a": "1", "b": "2"}
    two = {"ranks": [{"checksums": {"a": "1"}}, {"checksums": {"a": "9"}}]}
    assert checksums(two) == {"a@rank0": "1", "a@rank1": "9"}  # each rank's shard of "a" checked on its own
    with pytest.raises(EngineError, match="no checksums"):
        checksums({"success": True, "message": "Success."})
    # reset to noise, then pushed: a tensor whose checksum did not move was not written
    assert unwritten({"a": "1", "b": "2", "c": "3"}, {"a": "7", "b": "2", "c": "8"}) == ["b"]
    assert unwritten({"a": "1"}, {}) == []  # a tensor gone from the answer is not reported as unwritten
