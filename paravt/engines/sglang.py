"""The production rollout engine: an SGLang server on dedicated GPU(s), native HTTP API.

* :class:`SGLangServer` launches ``python -m sglang.launch_server`` (from SGLang's own venv,
  ``.venv-sglang``), pinned to the GPUs it is given, and waits on ``/health`` with backoff,
  never a fixed sleep. The release's launch settings are on by default: ``SGLANG_VLM_CACHE_SIZE_MB``
  = 4096 (the 100 MB default is too small for 64-frame rollouts), the static memory fraction
  and the context length.
* :class:`SGLangEngine` speaks the native ``/generate`` API with ``input_ids`` holding ONE
  ``<|image_pad|>`` per image (SGLang's Qwen-VL processor expands each into its patch tokens
  itself; the trajectory keeps the locally expanded ids, which are the ids the trainer scores,
  and the server's ``meta_info.prompt_tokens`` must equal their length), ``image_data`` (PNG
  data URLs), ``sampling_params`` and ``return_logprob``; it reads the output ids and logprobs
  from ``meta_info.output_token_logprobs``. Weights: ``/update_weights_from_disk`` (``disk``) or
  the trainer's broadcast group, each push inside SGLang's own session (pause → begin → buckets →
  end → continue); a server's first push accounts for every tensor through ``/weights_checker``.

Seeds: SGLang honours ``sampling_seed`` only when launched with
``--enable-deterministic-inference`` (``SGLangServerConfig.deterministic``; slower kernels).
Without it, per-request seeds are best-effort and two runs differ.

SGLang cannot run on CPU machines; everything except the HTTP round trip and the process
launch is pure functions (:func:`launch_command`, and the request builders in
:mod:`paravt.engines.sglang_protocol`). The conformance tests (``tests/conformance``) check them
against the pinned SGLang wheel's own request/response types, its ServerArgs parser and its
``build_input_ids``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from paravt.engines.base import EngineError, GenerationOutput, InferenceEngine, SamplingParams
from paravt.engines.http import HTTPSessionMixin, LaunchedServerMixin, wait_healthy, weight_group_env
from paravt.engines.sglang_logit_processor import processor_string
from paravt.engines.sglang_protocol import (BEGIN_UPDATE_PAYLOAD, PAUSE_PAYLOAD, bucket_payload, checksums, generate_payload,
                                            init_group_payload, parse_generate_response, unwritten,
                                            update_from_disk_payload)
from paravt.models.images import ImageInputs

log = logging.getLogger(__name__)


@dataclass
class SGLangServerConfig:
    model_path: str = ""  # weights to serve (set by the trainer)
    python: str = ".venv-sglang/bin/python"  # SGLang's own environment (requirements/sglang.txt)
    host: str = "127.0.0.1"  # bind address
    port: int = 30000  # HTTP port
    gpus: list[int] = field(default_factory=lambda: [0])  # CUDA devices of the server
    tp_size: int = 1  # tensor parallel size (divides len(gpus))
    dtype: str = "bfloat16"  # serving dtype
    mem_fraction_static: float = 0.7  # GPU memory for weights + KV cache
    context_length: int = 32768  # max tokens per request
    max_running_requests: int | None = None  # concurrent requests (null: SGLang's default)
    # SGLang's vision-embedding cache (the release: >= 4096 MB for 64-frame prompts). Neither
    # /flush_cache nor a weight update clears it, so while the vision tower trains (RL) it serves
    # stale features: the RL recipes set 0; eval (frozen weights) keeps it.
    vlm_cache_size_mb: int = 4096
    deterministic: bool = False  # --enable-deterministic-inference: sampling_seed honoured (reproducible eval)
    random_seed: int | None = None  # --random-seed
    served_model_name: str | None = None  # the name OpenAI-style clients must send
    attention_backend: str | None = None  # --attention-backend (null: SGLang's choice)
    # Frames per video on the video_url channel (eval). SGLang's Qwen-VL processor samples video with
    # the server-wide --mm-process-config '{"video": {"nframes": K}}' (linspace over the whole file,
    # K rounded to an even number) and ignores the per-request video_url.fps / max_frames; so K is one
    # value per server. null: SGLang's default (2 fps, capped).
    video_nframes: int | None = None
    # --enable-custom-logit-processor, with this repository on the server's PYTHONPATH: requests may carry a
    # custom logit processor, and ours (paravt.engines.sglang_logit_processor: the vision-token ban that
    # crosses sglang-router, which drops logit_bias) can be read. On for rollout servers (the backend's
    # rollout settings). SGLang unpickles the processor: whoever reaches the port can run code in the server.
    enable_custom_logit_processor: bool = False
    extra_args: list[str] = field(default_factory=list)  # more sglang.launch_server flags
    startup_timeout_s: float = 1200.0  # give up waiting for /health after this
    log_file: str | None = None  # server log (null: sglang_<port>.log)

    def __post_init__(self):
        if self.tp_size < 1 or len(self.gpus) % self.tp_size:
            raise ValueError(f"tp_size {self.tp_size} must divide the number of GPUs {self.gpus}")
        if not 0 < self.mem_fraction_static < 1:
            raise ValueError("mem_fraction_static must be in (0, 1)")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def launch_command(cfg: SGLangServerConfig) -> tuple[list[str], dict[str, str]]:
    """argv and the environment additions that start the server."""
    if not cfg.model_path:
        raise ValueError("SGLangServerConfig.model_path is required")
    argv = [cfg.python, "-m", "sglang.launch_server",
            "--model-path", str(cfg.model_path), "--host", cfg.host, "--port", str(cfg.port),
            "--tp-size", str(cfg.tp_size), "--dtype", cfg.dtype,
            "--mem-fraction-static", str(cfg.mem_fraction_static),
            "--context-length", str(cfg.context_length), "--trust-remote-code", "--skip-server-warmup"]
    if cfg.max_running_requests:
        argv += ["--max-running-requests", str(cfg.max_running_requests)]
    if cfg.attention_backend:
        argv += ["--attention-backend", cfg.attention_backend]
    if cfg.deterministic:
        argv += ["--enable-deterministic-inference"]
    if cfg.random_seed is not None:
        argv += ["--random-seed", str(cfg.random_seed)]
    if cfg.served_model_name:
        argv += ["--served-model-name", cfg.served_model_name]
    if cfg.video_nframes:
        argv += ["--mm-process-config", json.dumps({"video": {"nframes": int(cfg.video_nframes)}})]
    if cfg.enable_custom_logit_processor:
        argv += ["--enable-custom-logit-processor"]
    argv += list(cfg.extra_args)
    env = {"CUDA_VISIBLE_DEVICES": physical_gpus(cfg.gpus), "SGLANG_VLM_CACHE_SIZE_MB": str(cfg.vlm_cache_size_mb),
           **weight_group_env()}
    if cfg.enable_custom_logit_processor:  # the processor's class is imported from this repository
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH", "")) if x)
    return argv, env


def physical_gpus(gpus: Sequence[int]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a server on the job's logical GPUs ``gpus``: mapped through the
    devices the job was given (``PARAVT_VISIBLE_DEVICES``, the scheduler's ``CUDA_VISIBLE_DEVICES`` as
    the launcher found it), so a job given GPUs 4-7 puts ``gpus=[3]`` on physical GPU 7, not 3."""
    visible = [x for x in os.environ.get("PARAVT_VISIBLE_DEVICES", "").split(",") if x.strip()]
    out = []
    for g in gpus:
        if visible and not 0 <= int(g) < len(visible):
            raise ValueError(f"GPU {g} is not among the {len(visible)} this job was given (CUDA_VISIBLE_DEVICES="
                             f"{','.join(visible)})")
        out.append(visible[int(g)] if visible else str(g))
    return ",".join(out)


class SGLangServer:
    """A server process; ``with SGLangServer(cfg) as srv:`` starts it and waits until healthy."""

    name = "sglang"
    kill_grace_s = 15.0  # after the launcher died: SIGTERM to the server's group, SIGKILL this much later
    stop_grace_s = 60.0  # stop(): SIGTERM, SIGKILL this much later
    port_wait_s: float | None = None  # start(): wait this long for a busy port (None: kill_grace_s + 15)

    def __init__(self, cfg: SGLangServerConfig):
        self.cfg = cfg
        self.proc: subprocess.Popen | None = None
        self._reaper: subprocess.Popen | None = None
        self._log = None

    def command(self) -> tuple[list[str], dict[str, str]]:
        return launch_command(self.cfg)

    @property
    def log_path(self) -> Path:
        return Path(self.cfg.log_file or f"{self.name}_{self.cfg.port}.log")

    def start(self) -> "SGLangServer":
        argv, extra_env = self.command()
        self._wait_port_free()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        log.info("starting %s: %s (GPUs %s)", self.name, " ".join(argv), extra_env.get("CUDA_VISIBLE_DEVICES"))
        from paravt.core.procs import start_server  # noqa: PLC0415

        # The server and its children die with the process that launched it (kill -9 included), even when
        # wedged in their own shutdown (paravt.core.reaper): they never outlive a killed trainer or eval
        # holding its port and GPU.
        self.proc, self._reaper = start_server(argv, {**os.environ, **extra_env}, self._log, self.kill_grace_s)
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_port_free(self) -> None:
        """A restarted run (torchrun's --max-restarts, resume=auto) may find its dead predecessor's
        server still holding the port while the reaper ends it: wait for the port up to the reaper's
        grace plus a margin, then say who holds it instead of a bind error deep in the server's log."""
        import socket  # noqa: PLC0415

        wait_s = self.kill_grace_s + 15 if self.port_wait_s is None else self.port_wait_s
        deadline = time.monotonic() + wait_s
        while True:
            with socket.socket() as sk:
                sk.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sk.bind((self.cfg.host, self.cfg.port))
                    return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise EngineError(f"{self.name} port {self.cfg.host}:{self.cfg.port} is still in use after "
                                  f"{wait_s:.0f} s (another server, or one this run did not launch): "
                                  "stop it or choose another port")
            time.sleep(1.0)

    def log_tail(self, n: int = 40) -> str:
        path = self.log_path
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_healthy(self) -> None:
        wait_healthy(self.cfg.url + "/health", self.proc, self.cfg.startup_timeout_s, self.log_tail)

    def stop(self) -> None:
        from paravt.core.procs import stop_server  # noqa: PLC0415

        stop_server(self.proc, self._reaper, self.stop_grace_s)
        self._reaper = None
        if self._log is not None:
            self._log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# ---------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------

class SGLangEngine(LaunchedServerMixin, HTTPSessionMixin, InferenceEngine):
    server_kind = "SGLang"

    def __init__(self, url: str, server: SGLangServer | None = None, request_timeout_s: float = 900.0,
                 max_retries: int = 3, max_concurrency: int = 256, banned_token_ids: Sequence[int] = (),
                 image_token_id: int | None = None, verify_push: bool = False, ban_by_processor: bool = False):
        self.url = url.rstrip("/")
        self.verify_push = verify_push  # account for every parameter in the next broadcast (verify_payload)
        self.banned_token_ids = list(banned_token_ids)
        # the ban also as a custom logit processor (sglang_logit_processor), for requests through sglang-router,
        # which drops sampling_params.logit_bias; the server needs --enable-custom-logit-processor
        self.logit_processor = (processor_string(self.banned_token_ids)
                                if ban_by_processor and self.banned_token_ids else None)
        self.image_token_id = image_token_id  # <|image_pad|>: collapsed to one per image in requests
        self.server = server
        self.request_timeout_s = request_timeout_s
        self.max_retries = max_retries
        self.weight_version = 0
        self._sem = asyncio.Semaphore(max_concurrency)

    async def _post(self, path: str, payload: dict[str, Any]) -> Any:
        """POST with the retry policy while the server's health is probed (:meth:`watched`): a server that
        dies, or stops answering while it holds its port, fails the request in seconds, not at its timeout."""
        return await self.watched(self.post_json(self.url + path, payload, before_attempt=self._check_alive), path)

    async def generate(self, input_ids, images, params: SamplingParams) -> GenerationOutput:
        t0 = time.perf_counter()
        sent_under = self.weight_version  # a request retracted by a broadcast finishes on newer weights
        async with self._sem:
            try:
                body = generate_payload(input_ids, ImageInputs.wrap(images), params, self.banned_token_ids,
                                        self.image_token_id, self.logit_processor)
                resp = await self._post("/generate", body)
            except (EngineError, ValueError) as exc:
                return GenerationOutput([], [], "error", self.weight_version, error=str(exc))
        out = parse_generate_response(resp, self.weight_version, expected_prompt_tokens=len(input_ids))
        # SGLang reports one version per request: a turn that spanned a push reports the oldest (as on vLLM)
        out.weight_version = min(out.weight_version, sent_under)
        out.latency_s = time.perf_counter() - t0
        return out

    async def update_weights(self, source: Any, version: int | None = None) -> None:
        """Reload weights from a checkpoint directory written by the trainer."""
        if not isinstance(source, (str, Path)):
            raise TypeError("SGLangEngine.update_weights takes a checkpoint directory (the trainer exports one)")
        version = version if version is not None else self.weight_version + 1
        resp = await self._post("/update_weights_from_disk", update_from_disk_payload(str(source), version))
        if isinstance(resp, dict) and resp.get("success") is False:
            raise EngineError(f"update_weights_from_disk failed: {resp.get('message')}")
        self.weight_version = version

    # ------------------------------------------------------------------ broadcast transport
    async def _checked(self, path: str, payload: dict[str, Any]) -> Any:
        resp = await self._post(path, payload)
        if isinstance(resp, dict) and resp.get("success") is False:
            raise EngineError(f"{self.url}{path} failed: {resp.get('message')}")
        return resp

    async def weight_workers(self) -> int:
        """Ranks this server adds to the weight group: its tensor-parallel size (``/get_server_info``)."""
        import aiohttp  # noqa: PLC0415

        if self.server is not None:
            return int(self.server.cfg.tp_size)
        session = await self._http()
        async with session.get(self.url + "/get_server_info", timeout=aiohttp.ClientTimeout(total=30)) as r:
            info = await r.json() if r.status == 200 else {}
        return int(info.get("tp_size") or 1)

    async def init_weight_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                group_name: str, backend: str, timeout_s: float,  # noqa: ARG002
                                join_timeout_s: float | None = None) -> None:  # noqa: ARG002 - SGLang's own
        await self._checked("/init_weights_update_group",
                            init_group_payload(master_address, master_port, rank_offset, world_size, group_name, backend))

    async def begin_broadcast(self, plan: list[list[Any]], version: int, group_name: str) -> None:  # noqa: ARG002
        """Pause, then open SGLang's weight-update session (``/begin_weight_update``): the pinned SGLang
        refuses ``/update_weights_from_distributed`` outside one. A session left open by a trainer
        that died mid-push is closed first (SGLang answers "already open" otherwise)."""
        self._plan, self._version, self._group = plan, version, group_name
        await self._post("/pause_generation", PAUSE_PAYLOAD)
        try:
            await self._checked("/begin_weight_update", BEGIN_UPDATE_PAYLOAD)
        except EngineError as exc:
            if "already open" not in str(exc):
                raise
            log.warning("%s: closing a weight-update session an earlier push left open", self.url)
            await self._checked("/end_weight_update", {})
            await self._checked("/begin_weight_update", BEGIN_UPDATE_PAYLOAD)
        if self.verify_push:  # generation is paused (retract): no request sees the noise
            try:
                await self._checked("/weights_checker", {"action": "reset_tensors"})
                self._before = checksums(await self._checked("/weights_checker", {"action": "checksum"}))
            except EngineError as exc:  # the session closes; the server stays paused (its tensors may be noise)
                await self._post("/end_weight_update", {})
                raise EngineError(f"{exc} (rollout.verify_first_push=false skips this check)") from exc

    def bucket_request(self, index: int) -> asyncio.Future:
        last = index == len(self._plan) - 1
        return asyncio.ensure_future(self._checked("/update_weights_from_distributed", bucket_payload(
            self._plan[index], self._group, self._version if last else None)))

    receiving = None  # one request per bucket (bucket_request), nothing long-lived

    async def end_broadcast(self, version: int, ok: bool = True) -> None:
        """Close the session (also after a failed transfer, so the next push can open one), resume.
        A verified push whose buckets left a tensor unwritten fails naming it, the server left paused
        (its unwritten tensors hold noise)."""
        try:
            await self._checked("/end_weight_update", {})
            if ok and self.verify_push:
                after = checksums(await self._checked("/weights_checker", {"action": "checksum"}))
                missing = unwritten(self._before, after)
                if missing:
                    shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
                    raise EngineError(f"{self.url}: the push of version {version} left {len(missing)} tensor(s) of "
                                      f"the served model unwritten (SGLang /weights_checker): {shown}")
            await self._post("/continue_generation", {})
        except Exception:  # noqa: BLE001 - a failed transfer ends the run; its error is the one to report
            if ok:
                raise
        if ok:
            self.weight_version = version
