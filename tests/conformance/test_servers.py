"""Request bodies our SGLang and OpenAI clients build, checked with the pinned servers' own
schemas and SGLang's own multimodal input-id builder (sglang 0.5.23, vllm 0.33.0; see
requirements/conformance.txt). Run: ``bash scripts/test.sh --conformance``."""

from __future__ import annotations

import json

import pytest

from paravt.models.tokenize import encode_prompt
from paravt.core.prompts import THINK_PREFIX, build_messages
from paravt.core.video import sample_overview
from paravt.data.schema import load_rl_rows
from paravt.data.tool_specs import DATA_TOOL_SCHEMAS
from paravt.engines.base import SamplingParams
from paravt.engines.openai import chat_payload, parse_chat_response
from paravt.engines.sglang import SGLangServerConfig, launch_command
from paravt.engines.sglang_protocol import (PAUSE_PAYLOAD, bucket_payload, collapse_image_pads, generate_payload,
                                            init_group_payload, parse_generate_response, update_from_disk_payload)
from tests.conformance.server_source import load_file_module, load_method, load_structs

pytestmark = pytest.mark.conformance

from sglang.api.v1 import api_types as sgl_api  # noqa: E402  (the real schema; an ImportError fails the run)
from sglang.srt.entrypoints.openai import protocol as sgl_openai  # noqa: E402
from vllm.entrypoints.openai.chat_completion import protocol as vllm_chat  # noqa: E402

PARAMS = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=64, seed=12345, stop_token_ids=[7],
                        frequency_penalty=0.3, presence_penalty=0.2)


@pytest.fixture(scope="module")
def rows(world):
    return load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])[0]


@pytest.fixture(scope="module")
def prompts(tiny, rows):
    """Real prompts with 1, 2 and 5 frames: (expanded ids as the trajectory keeps them, images)."""
    _, proc = tiny
    out = {}
    for n in (1, 2, 5):
        frames = sample_overview(rows[0].video, n)
        msgs = build_messages("agentic_minimal", rows[0].question, frames, "clip.mp4", 60.0, tool_schemas=DATA_TOOL_SCHEMAS)
        out[n] = encode_prompt(proc, msgs, THINK_PREFIX)
    return out


def _sglang_build_input_ids(proc):
    """SGLang's own ``BaseMultimodalProcessor.build_input_ids`` bound to Qwen3-VL's settings."""
    modality = load_file_module("sglang", "srt/multimodal/modality.py").Modality
    fn = load_method("sglang", "srt/multimodal/processors/base_processor.py", "BaseMultimodalProcessor",
                     "build_input_ids", {"Modality": modality})

    class _Proc:  # the attributes build_input_ids reads from a QwenVL processor instance
        IM_TOKEN_ID = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        VIDEO_TOKEN_ID = proc.tokenizer.convert_tokens_to_ids("<|video_pad|>")
        audio_token_id = None
        spatial_merge_size = proc.image_processor.merge_size
        _tokenizer = proc.tokenizer

    return lambda prompt, grid: fn(_Proc(), prompt, img_grid_thw=grid)


@pytest.mark.parametrize("n_images", [1, 2, 5])
def test_generate_body_passes_sglang_schema_and_sglang_expands_it_to_our_ids(tiny, prompts, n_images):
    _, proc = tiny
    ids, images = prompts[n_images]
    pad = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    body = generate_payload(ids, images, PARAMS, banned_token_ids=[pad], image_token_id=pad)
    req = sgl_api.GenerateRequest.from_json_value(json.loads(json.dumps(body)))
    assert req.return_logprob is True and req.sampling_params.sampling_seed == 12345
    assert (req.sampling_params.frequency_penalty, req.sampling_params.presence_penalty) == (0.3, 0.2)
    assert len(req.image_data) == n_images
    sent = list(req.input_ids)
    assert sent.count(pad) == n_images  # SGLang counts one <|image_pad|> per image
    grid = images.tensors(proc)[1]
    expanded, offsets, modalities = _sglang_build_input_ids(proc)(sent, grid)
    assert expanded == list(ids)  # SGLang's expansion == the ids our trajectory trains on
    assert len(offsets) == n_images and all(m.name == "IMAGE" for m in modalities)
    assert collapse_image_pads(ids, pad) == sent


def test_sglang_generate_response_decodes(tiny, prompts):
    ids, _ = prompts[2]
    meta = sgl_api.GenerateMetaInfo(id="r1", prompt_tokens=len(ids), completion_tokens=3,
                                    finish_reason=sgl_api.FinishLength(length=3),
                                    output_token_logprobs=[sgl_api.LogprobEntry(logprob=-0.5, token_id=11, text=None),
                                                           sgl_api.LogprobEntry(logprob=-1.0, token_id=12, text=None),
                                                           sgl_api.LogprobEntry(logprob=-0.1, token_id=13, text=None)],
                                    weight_version="4")
    resp = json.loads(json.dumps(sgl_api.GenerateResponse(text="abc", meta_info=meta, output_ids=[11, 12, 13])
                                 .to_json_value()))
    out = parse_generate_response(resp, 0, expected_prompt_tokens=len(ids))
    assert (out.token_ids, out.logprobs, out.finish_reason, out.weight_version) == ([11, 12, 13], [-0.5, -1.0, -0.1],
                                                                                    "length", 4)
    bad = parse_generate_response(resp, 0, expected_prompt_tokens=len(ids) + 7)
    assert bad.finish_reason == "error" and "prompt_tokens" in bad.error


def test_weight_update_bodies_are_sglang_requests():
    structs = load_structs("sglang", "srt/managers/io_struct.py", ["UpdateWeightFromDiskReqInput"])
    import msgspec
    disk = msgspec.convert(update_from_disk_payload("/ckpt/v000003", 3), structs["UpdateWeightFromDiskReqInput"])
    assert disk.model_path == "/ckpt/v000003" and disk.weight_version == "3" and disk.flush_cache


def test_broadcast_bodies_are_sglang_requests():
    """The broadcast transport's requests (join the group, one bucket per request, pause/continue)
    decode into SGLang's own request structs (unknown keys are rejected)."""
    import msgspec

    from paravt.core.weight_sync import TensorMeta
    structs = load_structs("sglang", "srt/managers/io_struct.py", [
        "InitWeightsUpdateGroupReqInput", "UpdateWeightsFromDistributedReqInput", "PauseGenerationReqInput",
        "ContinueGenerationReqInput"])
    init = msgspec.convert(init_group_payload("10.0.0.1", 29555, 1, 3, "paravt_weights_1_1", "nccl"),
                           structs["InitWeightsUpdateGroupReqInput"])
    assert (init.master_address, init.master_port, init.rank_offset, init.world_size, init.backend) == \
        ("10.0.0.1", 29555, 1, 3, "nccl")
    metas = [TensorMeta("model.language_model.layers.0.mlp.down_proj.weight", "bfloat16", (64, 128)),
             TensorMeta("model.visual.blocks.0.norm1.weight", "bfloat16", (64,))]
    mid = msgspec.convert(bucket_payload(metas, "g", None), structs["UpdateWeightsFromDistributedReqInput"])
    assert mid.names == [m.name for m in metas] and mid.dtypes == ["bfloat16"] * 2 and mid.shapes == [[64, 128], [64]]
    assert mid.load_format == "flattened_bucket" and not mid.flush_cache and mid.weight_version is None
    last = msgspec.convert(bucket_payload(metas, "g", 7), structs["UpdateWeightsFromDistributedReqInput"])
    assert last.flush_cache and last.weight_version == "7"
    pause = msgspec.convert(PAUSE_PAYLOAD, structs["PauseGenerationReqInput"])
    assert pause.mode == "retract"
    msgspec.convert({}, structs["ContinueGenerationReqInput"])


def test_sglang_reads_our_bucket_bytes_back_as_our_tensors():
    """SGLang's own FlattenedTensorBucket, allocated from the names/dtypes/shapes we send, holds our
    flat bytes as exactly our tensors."""
    import torch

    from paravt.core.weight_sync import TensorMeta, flatten
    ftb = load_file_module("sglang", "srt/weight_sync/tensor_bucket.py")
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(4, 6, generator=g).to(torch.bfloat16), torch.randn(5, generator=g).to(torch.bfloat16)]
    metas = [TensorMeta(f"t{i}", "bfloat16", tuple(t.shape)) for i, t in enumerate(ts)]
    body = bucket_payload(metas, "g", 1)
    bucket = ftb.FlattenedTensorBucket.empty(body["names"], body["dtypes"], body["shapes"], "cpu")
    bucket.get_flattened_tensor().copy_(flatten(ts))
    got = dict(bucket.reconstruct_tensors())
    assert all(torch.equal(got[m.name], t) for m, t in zip(metas, ts))


def _video_messages(k: int):
    return [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": "file:///data/charades/ABC12.mp4"}, "nframes": k, "duration": 31.5},
        {"type": "text", "text": "When does the person open the door?"}]}]


@pytest.mark.parametrize("k", [4, 64])
def test_chat_body_passes_both_servers_and_carries_k_frames(k):
    body = chat_payload("paravt-8b", _video_messages(k), SamplingParams(temperature=0.0, max_new_tokens=32, seed=1,
                                                                        frequency_penalty=0.5),
                        prefix=THINK_PREFIX)
    body = json.loads(json.dumps(body))
    s = sgl_openai.ChatCompletionRequest.model_validate(body)
    v = vllm_chat.ChatCompletionRequest.model_validate(body)
    assert s.return_token_ids and v.return_token_ids  # token ids come back on both servers
    video = s.messages[0].content[0].video_url
    # SGLang's Qwen-VL processor ignores these per-request fields (K is its --mm-process-config); its other
    # processors read them, so they are still sent and must validate
    assert video.max_frames == k and video.fps == pytest.approx(k / 31.5)
    # vLLM's qwen3_vl loader clamps its frame count to [min_frames, max_frames] (num_frames alone is ignored;
    # measured against a real vLLM in tests/real_server)
    assert v.media_io_kwargs == {"video": {"num_frames": k, "min_frames": k, "max_frames": k}}
    assert s.continue_final_message and v.continue_final_message
    assert s.logprobs and v.logprobs
    assert s.frequency_penalty == v.frequency_penalty == 0.5 and not s.presence_penalty and not v.presence_penalty  # 0 is not sent


def test_chat_body_with_client_side_frames(tiny, prompts):
    from PIL import Image
    msgs = [{"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "<0.0 seconds>"},
                                         {"type": "image", "image": Image.new("RGB", (32, 32), "red")},
                                         {"type": "text", "text": "Q?"}]}]
    body = json.loads(json.dumps(chat_payload("m", msgs, SamplingParams(max_new_tokens=8))))
    sgl_openai.ChatCompletionRequest.model_validate(body)
    vllm_chat.ChatCompletionRequest.model_validate(body)


def test_chat_responses_of_both_servers_decode():
    lp = [{"token": "A", "logprob": -0.2, "bytes": None, "top_logprobs": []},
          {"token": "<|im_end|>", "logprob": -0.01, "bytes": None, "top_logprobs": []}]
    v = vllm_chat.ChatCompletionResponse(
        model="m", choices=[vllm_chat.ChatCompletionResponseChoice(
            index=0, message={"role": "assistant", "content": "A"}, finish_reason="stop",
            logprobs={"content": lp}, token_ids=[65, 2])],
        usage={"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12})
    out = parse_chat_response(json.loads(v.model_dump_json()))
    assert (out.token_ids, out.logprobs, out.text) == ([65, 2], [-0.2, -0.01], "A")
    s_lp = sgl_openai.ChoiceLogprobs(content=[sgl_openai.ChatCompletionTokenLogprob(
        token=x["token"], bytes=list(x["token"].encode()), logprob=x["logprob"], top_logprobs=[]) for x in lp])
    s = sgl_openai.ChatCompletionResponse(
        id="chatcmpl-1", model="m", choices=[sgl_openai.ChatCompletionResponseChoice(
            index=0, message=sgl_openai.ChatMessage(role="assistant", content="A"), finish_reason="length",
            logprobs=s_lp, response_token_ids=[65, 2])],
        usage={"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12})
    out = parse_chat_response(json.loads(s.model_dump_json()))
    assert (out.token_ids, out.logprobs, out.finish_reason) == ([65, 2], [-0.2, -0.01], "length")


def test_launch_command_parses_with_sglang_server_args():
    """The launcher's argv is accepted by SGLang's own ServerArgs parser, with the values we mean."""
    import argparse

    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    cfg = SGLangServerConfig(model_path="/ckpt/hf", deterministic=True, vlm_cache_size_mb=0, random_seed=7,
                             served_model_name="paravt-rl")
    argv, env = launch_command(cfg)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    a = parser.parse_args(argv[3:])
    assert a.model_path == "/ckpt/hf" and a.enable_deterministic_inference and a.random_seed == 7
    assert a.served_model_name == "paravt-rl" and a.mem_fraction_static == 0.7
    assert env["SGLANG_VLM_CACHE_SIZE_MB"] == "0"
    a = parser.parse_args(launch_command(SGLangServerConfig(model_path="m"))[0][3:])
    assert not a.enable_deterministic_inference
    # K on the video_url channel: SGLang's Qwen-VL processor reads mm_process_config["video"]["nframes"]
    a = parser.parse_args(launch_command(SGLangServerConfig(model_path="m", video_nframes=16))[0][3:])
    assert a.mm_process_config == {"video": {"nframes": 16}}


def test_the_rl_trainers_torch_is_the_pinned_sglangs():
    """Trainer rank 0 and the SGLang server's workers form one NCCL communicator for the weight push;
    NCCL refuses ranks of different NCCL versions, so both environments need the same torch build.
    Read from the installed sglang's own metadata and requirements/rl.txt."""
    from importlib.metadata import requires
    from pathlib import Path

    from packaging.requirements import Requirement

    pins = [Requirement(r) for r in requires("sglang") or []]
    sglang_torch = next(str(r.specifier) for r in pins if r.name == "torch" and not r.marker)
    rl = Path(__file__).resolve().parents[2] / "requirements/rl.txt"
    trainer_torch = next(ln.strip() for ln in rl.read_text().splitlines() if ln.startswith("torch=="))
    assert sglang_torch == trainer_torch.removeprefix("torch"), (sglang_torch, trainer_torch)
