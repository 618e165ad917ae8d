"""SGLang's native HTTP API as pure functions: the ``/generate`` request and response, the weight
update requests (disk, the broadcast group and its buckets, the pause and session bodies) and the
``/weights_checker`` answer. No I/O here; :mod:`paravt.engines.sglang` sends them. The conformance
group checks each against the pinned SGLang wheel's own request types and handlers."""

from __future__ import annotations

from typing import Any, Sequence

from paravt.engines.base import EngineError, GenerationOutput, SamplingParams
from paravt.models.images import ImageInputs


def sampling_payload(params: SamplingParams, banned_token_ids: Sequence[int] = ()) -> dict[str, Any]:
    sp: dict[str, Any] = {
        "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
        "max_new_tokens": params.max_new_tokens,
        "skip_special_tokens": False, "spaces_between_special_tokens": False, "no_stop_trim": True,
    }
    if params.stop:
        sp["stop"] = list(params.stop)
    if params.stop_token_ids:
        sp["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        sp["sampling_seed"] = int(params.seed) % (2**31)
    if params.frequency_penalty:
        sp["frequency_penalty"] = params.frequency_penalty
    if params.presence_penalty:
        sp["presence_penalty"] = params.presence_penalty
    if banned_token_ids:  # vision placeholders must never be generated
        sp["logit_bias"] = {str(int(t)): -100.0 for t in banned_token_ids}
    return sp


def collapse_image_pads(input_ids: Sequence[int], image_token_id: int) -> list[int]:
    """Each run of consecutive ``image_token_id`` (one image's patch tokens) as one token: the
    form SGLang's multimodal processor expects (it counts one pad per image and expands it)."""
    out: list[int] = []
    for t in input_ids:
        t = int(t)
        if t == image_token_id and out and out[-1] == image_token_id:
            continue
        out.append(t)
    return out


def generate_payload(input_ids: Sequence[int], images: ImageInputs | None, params: SamplingParams,
                     banned_token_ids: Sequence[int] = (), image_token_id: int | None = None,
                     logit_processor: str | None = None) -> dict[str, Any]:
    """The ``/generate`` body. ``input_ids`` are the locally expanded ids (as the processor made
    them); with images they are sent with one ``image_token_id`` per image. ``logit_processor``: a
    ``custom_logit_processor`` string (:func:`paravt.engines.sglang_logit_processor.processor_string`, the
    ban that crosses sglang-router), sent beside ``logit_bias``."""
    ids = [int(t) for t in input_ids]
    has_images = images is not None and len(images) > 0
    if has_images:
        if image_token_id is None:
            raise ValueError("generate_payload: image_token_id is required when images are sent "
                             "(SGLang expects one <|image_pad|> per image)")
        ids = collapse_image_pads(ids, image_token_id)
        n_pads = ids.count(image_token_id)
        if n_pads != len(images):
            raise ValueError(f"generate_payload: {n_pads} image placeholder runs in the prompt for {len(images)} images")
    payload: dict[str, Any] = {
        "input_ids": ids,
        "sampling_params": sampling_payload(params, banned_token_ids),
        "return_logprob": True,
        "logprob_start_len": -1,  # logprobs of the output tokens only
        "stream": False,
    }
    if has_images:
        payload["image_data"] = images.data_urls()
    if logit_processor is not None:
        payload["custom_logit_processor"] = logit_processor
    return payload


def parse_generate_response(resp: dict[str, Any], weight_version: int = 0,
                            expected_prompt_tokens: int | None = None) -> GenerationOutput:
    """GenerationOutput from a native ``/generate`` response (one request). When the server's
    ``meta_info.prompt_tokens`` differs from ``expected_prompt_tokens`` (the locally expanded
    prompt), the server saw other ids than the trajectory holds: an error output, never trained on."""
    if isinstance(resp, list):
        if len(resp) != 1:
            raise EngineError(f"expected one response, got {len(resp)}")
        resp = resp[0]
    meta = resp.get("meta_info") or {}
    got = meta.get("prompt_tokens")
    if expected_prompt_tokens is not None and got is not None and int(got) != int(expected_prompt_tokens):
        return GenerationOutput([], [], "error", weight_version, resp.get("text"),
                                error=f"server prompt_tokens={got} but the local prompt has {expected_prompt_tokens} "
                                      "tokens: the server expanded the image placeholders differently (processor "
                                      "or min/max_pixels mismatch between the client and the served model)")
    lps = meta.get("output_token_logprobs")
    if lps is not None:
        ids = [int(x[1]) for x in lps]
        logprobs = [float(x[0]) if x[0] is not None else 0.0 for x in lps]
    elif "output_ids" in resp:
        ids = [int(t) for t in resp["output_ids"]]
        logprobs = [0.0] * len(ids)
    else:
        raise EngineError(f"/generate response has neither output_token_logprobs nor output_ids: {list(resp)}")
    fr = meta.get("finish_reason") or {}
    ftype = fr.get("type", "stop") if isinstance(fr, dict) else str(fr)
    if ftype == "abort":
        return GenerationOutput(ids, logprobs, "error", weight_version, resp.get("text"),
                                error=f"request aborted: {fr.get('message', '')}")
    version = meta.get("weight_version", weight_version)
    try:
        version = int(version)
    except (TypeError, ValueError):
        version = weight_version
    return GenerationOutput(ids, logprobs, "length" if ftype == "length" else "stop", version, resp.get("text"))


def update_from_disk_payload(path: str, version: int) -> dict[str, Any]:
    return {"model_path": str(path), "weight_version": str(version), "flush_cache": True}


def init_group_payload(master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str,
                       backend: str) -> dict[str, Any]:
    """``/init_weights_update_group``: join the trainer's weight-update group (``weight_sync``)."""
    return {"master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": group_name, "backend": backend}


def bucket_payload(metas: Sequence[Any], group_name: str, version: int | None) -> dict[str, Any]:
    """``/update_weights_from_distributed`` for one bucket (SGLang's ``flattened_bucket`` layout: the
    tensors' bytes back to back, one broadcast). The last bucket of a version carries the version and
    flushes the cache."""
    body: dict[str, Any] = {"names": [m.name for m in metas], "dtypes": [m.dtype for m in metas],
                            "shapes": [list(m.shape) for m in metas], "group_name": group_name,
                            "load_format": "flattened_bucket", "flush_cache": version is not None}
    if version is not None:
        body["weight_version"] = str(version)
    return body


# Requests in flight during a broadcast go back to the waiting queue and are recomputed on the new
# weights after /continue_generation (the cache can be flushed in this mode, not in "in_place").
PAUSE_PAYLOAD = {"mode": "retract"}
# /begin_weight_update: the session covers the target model and a speculative draft model, if any.
BEGIN_UPDATE_PAYLOAD = {"selector": "all"}


def checksums(resp: Any) -> dict[str, str]:
    """``/weights_checker`` ``checksum`` answer → {tensor name: checksum}, a ``@rank`` suffix per
    tensor-parallel rank when the server has several (each rank holds its own shard)."""
    ranks = (resp or {}).get("ranks") if isinstance(resp, dict) else None
    if not ranks:
        raise EngineError("SGLang's /weights_checker returned no checksums")
    many = len(ranks) > 1
    return {f"{n}@rank{i}" if many else n: c for i, r in enumerate(ranks) for n, c in r["checksums"].items()}


def unwritten(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Tensors a push did not write: reset to noise before it, the same noise after it."""
    return sorted(n for n, c in before.items() if after.get(n) == c)
