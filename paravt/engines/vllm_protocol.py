"""The wire format of vLLM's tokens endpoint (``/inference/v1/generate``): the request body
:class:`~paravt.engines.vllm.VLLMEngine` sends and how its reply becomes a
:class:`~paravt.engines.base.GenerationOutput` (checked against vLLM's own code in ``tests/conformance``)."""

from __future__ import annotations

from typing import Any, Sequence

from paravt.engines.base import EngineError, GenerationOutput, SamplingParams
from paravt.engines.sglang_protocol import collapse_image_pads
from paravt.models.images import ImageInputs


def tokens_payload(input_ids: Sequence[int], images: ImageInputs | None, params: SamplingParams,
                   banned_token_ids: Sequence[int] = (), image_token_id: int | None = None,
                   model: str | None = None) -> dict[str, Any]:
    """The ``/inference/v1/generate`` body. Images go as ``content_parts`` with ONE
    ``image_token_id`` per image in ``token_ids``: vLLM's Qwen-VL processor expands each into its
    patch tokens (``return_token_ids`` sends the expanded prompt back for the equality check)."""
    ids = [int(t) for t in input_ids]
    body: dict[str, Any] = {"token_ids": ids, "return_token_ids": True, "output_mode": "tokens"}
    if images is not None and len(images):
        if image_token_id is None:
            raise ValueError("tokens_payload: image_token_id is required when images are sent")
        ids = collapse_image_pads(ids, image_token_id)
        if ids.count(image_token_id) != len(images):
            raise ValueError(f"tokens_payload: {ids.count(image_token_id)} image placeholder runs for {len(images)} images")
        body["token_ids"] = ids
        body["content_parts"] = [{"type": "image_url", "url": u} for u in images.data_urls()]
    sp: dict[str, Any] = {"max_tokens": params.max_new_tokens, "temperature": params.temperature,
                          "top_p": params.top_p, "logprobs": 0, "skip_special_tokens": False, "detokenize": False}
    if params.top_k and params.top_k > 0:
        sp["top_k"] = params.top_k
    if params.seed is not None:
        sp["seed"] = int(params.seed) % (2**31)
    if params.stop_token_ids:
        sp["stop_token_ids"] = list(params.stop_token_ids)
    if params.frequency_penalty:
        sp["frequency_penalty"] = params.frequency_penalty
    if params.presence_penalty:
        sp["presence_penalty"] = params.presence_penalty
    if banned_token_ids:  # vision placeholders are never text the policy may write
        sp["logit_bias"] = {str(int(t)): -100.0 for t in banned_token_ids}
    body["sampling_params"] = sp
    if model:
        body["model"] = model
    return body


def parse_version(value: Any, default: int) -> int:
    """A server's weight version as our integer policy version (vLLM starts at "default")."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def parse_tokens_response(resp: dict[str, Any], expected_prompt: Sequence[int] | None,
                          default_version: int) -> GenerationOutput:
    """GenerationOutput from a ``/inference/v1/generate`` reply. The served prompt must equal
    ``expected_prompt`` (the ids the trajectory holds, images expanded locally); otherwise the turn
    is an error, never trained on. The version is the oldest weight version that produced a token."""
    choices = resp.get("choices") or []
    if len(choices) != 1:
        raise EngineError(f"expected one choice, got {len(choices)}")
    c = choices[0]
    served = resp.get("prompt_token_ids")
    if expected_prompt is not None and served is not None and list(served) != list(expected_prompt):
        n_diff = next((i for i, (a, b) in enumerate(zip(served, expected_prompt)) if a != b),
                      min(len(served), len(expected_prompt)))
        return GenerationOutput([], [], "error", default_version,
                                error=f"the server's prompt ({len(served)} tokens) differs from the local one "
                                      f"({len(expected_prompt)} tokens) from position {n_diff}: processor or "
                                      "min/max_pixels mismatch between the client and the served model")
    ids = [int(t) for t in c.get("token_ids") or []]
    content = (c.get("logprobs") or {}).get("content") or []
    if len(content) != len(ids):
        raise EngineError(f"{len(ids)} tokens but {len(content)} logprobs (was the server started with --enable-scale-out "
                          "and asked for logprobs?)")
    logprobs = [float(x["logprob"]) for x in content]
    spans = c.get("weight_versions") or []
    versions = [parse_version(sp.get("version"), default_version) for sp in spans]
    version = min(versions) if versions else default_version
    fr = c.get("finish_reason") or "stop"
    if fr == "abort":
        return GenerationOutput(ids, logprobs, "error", version, error="request aborted by the server")
    return GenerationOutput(ids, logprobs, "length" if fr == "length" else "stop", version,
                            prompt_token_ids=list(served) if served is not None else None)
