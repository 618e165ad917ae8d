"""``build_engine``: the one place that turns a config into a running engine (RL, eval and
``scripts/inference.py`` all call it). It owns server launch, health waits and shutdown; weights
reach an engine only through its public ``update_weights`` (:meth:`EngineHandle.push_weights`).

=============  ==========================================================================
kind           engine
=============  ==========================================================================
``hf``         :class:`~paravt.engines.hf.HFEngine` in this process (the embedded default)
``hf_server``  ``python -m paravt.engines.hf_server`` on a free localhost port (CPU/GPU), SGLang API
``sglang``     ``sglang.launch_server`` on the GPUs of ``server`` (:class:`SGLangServerConfig`)
``remote``     an SGLang-API server already running at ``url``
``openai``     an OpenAI-compatible chat server at ``url``, or launched from ``server`` (eval):
               SGLang (:class:`SGLangServerConfig`) or vLLM (:class:`~paravt.engines.vllm.VLLMServerConfig`)
=============  ==========================================================================
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paravt.engines.http import wait_healthy

KINDS = ("hf", "hf_server", "sglang", "remote", "openai")


@dataclass
class EngineHandle:
    """A built engine plus whatever process serves it."""

    kind: str
    engine: Any  # InferenceEngine (token engines) or ChatEngine (openai)
    url: str | None = None
    processes: list[Any] = field(default_factory=list)  # subprocess.Popen | SGLangServer
    image_token_id: int | None = None

    def push_weights(self, source: Any, version: int) -> None:
        """Load new weights (a state dict for ``hf``, a checkpoint directory for servers) and tag
        them ``version``. Synchronous and safe to call from a thread other than the one driving
        rollouts: servers get a short-lived control client with its own HTTP session."""
        if self.kind == "hf":
            asyncio.run(self.engine.update_weights(source, version))
            return
        control = self.control_client()

        async def push() -> None:
            try:
                await control.update_weights(str(source), version)
            finally:
                await control.close()

        asyncio.run(push())
        self.engine.weight_version = version

    def control_client(self):
        from paravt.engines.sglang import SGLangEngine  # noqa: PLC0415

        if self.url is None:
            raise ValueError(f"engine kind {self.kind!r} has no server to control")
        return SGLangEngine(self.url, image_token_id=self.image_token_id)

    async def aclose(self) -> None:
        """Close the client (call on the event loop that used it)."""
        try:
            await self.engine.close()
        except Exception:  # noqa: BLE001 - closing is best-effort
            pass

    def stop(self) -> None:
        """Terminate the processes this handle started."""
        for p in self.processes:
            if isinstance(p, subprocess.Popen):
                if p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        p.kill()
            else:
                p.stop()
        self.processes = []


def start_hf_server(model: str, dtype: str = "float32", port: int | None = None,
                    log_file: str | Path | None = None, timeout_s: float = 300.0) -> tuple[subprocess.Popen, str]:
    """``python -m paravt.engines.hf_server`` on localhost; returns (process, url) once healthy."""
    from paravt.models.parallel import free_port  # noqa: PLC0415

    port = port or free_port()
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "paravt.engines.hf_server", "--model", str(model),
                             "--port", str(port), "--dtype", dtype], stdout=out, stderr=subprocess.STDOUT)
    if log_file:
        out.close()  # the child holds its own descriptor
    url = f"http://127.0.0.1:{port}"

    def tail() -> str:
        return Path(log_file).read_text(errors="replace")[-3000:] if log_file and Path(log_file).exists() else ""

    try:
        wait_healthy(url + "/health", proc, timeout_s, tail)
    except Exception:
        proc.terminate()
        raise
    return proc, url


def build_engine(kind: str, model: str, processor=None, *, dtype: str = "float32", seed: int = 0,
                 batch_wait_s: float = 0.03, url: str | None = None, server=None, model_name: str | None = None,
                 max_retries: int = 3, log_file: str | Path | None = None) -> EngineHandle:
    """Build (and, for server kinds, launch and health-check) the engine ``kind`` for ``model``.

    ``processor`` supplies the tokenizer ids token engines need (image pad, banned vision
    tokens); ``server`` is an :class:`~paravt.engines.sglang.SGLangServerConfig` (or, for
    ``openai``, a :class:`~paravt.engines.vllm.VLLMServerConfig`) whose ``model_path`` is set to ``model``."""
    if kind not in KINDS:
        raise ValueError(f"engine kind must be one of {KINDS}, got {kind!r}")
    if kind == "hf":
        from paravt.engines.hf import HFEngine  # noqa: PLC0415

        return EngineHandle(kind, HFEngine.from_pretrained(model, dtype=dtype, batch_wait_s=batch_wait_s, seed=seed))
    procs: list[Any] = []
    if kind in ("sglang", "openai") and server is not None:
        from paravt.engines.sglang import SGLangServer  # noqa: PLC0415
        from paravt.engines.vllm import VLLMServer, VLLMServerConfig  # noqa: PLC0415

        if isinstance(server, VLLMServerConfig) and kind != "openai":
            raise ValueError("a vLLM server is an OpenAI-compatible chat server: use kind='openai'")
        server.model_path = str(model)
        procs.append((VLLMServer if isinstance(server, VLLMServerConfig) else SGLangServer)(server).start())
        url = server.url
    elif kind == "hf_server":
        proc, url = start_hf_server(model, dtype, log_file=log_file)
        procs.append(proc)
    if not url:
        raise ValueError(f"engine kind {kind!r} needs url= (or server= to launch one)")
    if kind == "openai":
        from paravt.engines.openai import OpenAIEngine  # noqa: PLC0415

        return EngineHandle(kind, OpenAIEngine(url, model=model_name, max_retries=max_retries), url, procs)
    from paravt.engines.sglang import SGLangEngine, SGLangServer  # noqa: PLC0415
    from paravt.models.tokenize import image_pad_id, vision_token_ids  # noqa: PLC0415

    if processor is None:
        from paravt.models.loading import load_processor  # noqa: PLC0415

        processor = load_processor(model)
    pad = image_pad_id(processor.tokenizer)
    watched = next((p for p in procs if isinstance(p, SGLangServer)), None)
    engine = SGLangEngine(url, server=watched, banned_token_ids=vision_token_ids(processor.tokenizer),
                          image_token_id=pad, max_retries=max_retries)
    return EngineHandle(kind, engine, url, procs, pad)
