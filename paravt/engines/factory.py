"""``build_engine``: the one place that turns a config into a running engine (RL, eval and
``scripts/inference.py`` all call it). It owns server launch, health waits and shutdown; weights
reach an engine only through its public ``update_weights`` (:meth:`EngineHandle.push_weights`).

=============  ==========================================================================
kind           engine
=============  ==========================================================================
``hf``         :class:`~paravt.engines.hf.HFEngine` in this process (the embedded default)
``hf_server``  ``python -m paravt.engines.hf_server`` on a free localhost port (CPU/GPU), SGLang API
``sglang``     ``sglang.launch_server`` on the GPUs of ``server`` (:class:`SGLangServerConfig`),
               and/or SGLang servers already running at ``urls``
``vllm``       vLLM rollout servers (tokens endpoint, :class:`~paravt.engines.vllm.VLLMEngine`)
               launched from ``server`` (:class:`~paravt.engines.vllm.VLLMServerConfig`) and/or at ``urls``
``remote``     an SGLang-API server already running at ``url``
``openai``     an OpenAI-compatible chat server at ``url``, or launched from ``server`` (eval):
               SGLang (:class:`SGLangServerConfig`) or vLLM (:class:`~paravt.engines.vllm.VLLMServerConfig`)
=============  ==========================================================================

Token kinds with more than one server (``replicas`` launched, plus ``urls``) are one
:class:`~paravt.engines.pool.EnginePool`: an episode's requests on one server, a dead server evicted,
weights to every live one; vLLM servers can sit behind ``vllm-router`` instead
(:class:`~paravt.engines.router.RoutedPool`, ``router=``), the same two properties.
Every server this process launches dies with it (``PR_SET_PDEATHSIG``), kill -9 included.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paravt.engines.base import EngineError
from paravt.engines.http import wait_healthy

KINDS = ("hf", "hf_server", "sglang", "vllm", "remote", "openai")


@dataclass
class EngineHandle:
    """A built engine plus whatever processes serve it."""

    kind: str
    engine: Any  # InferenceEngine (token engines, an EnginePool for several servers) or ChatEngine (openai)
    url: str | None = None
    processes: list[Any] = field(default_factory=list)  # subprocess.Popen | SGLangServer | VLLMServer
    image_token_id: int | None = None
    urls: list[str] = field(default_factory=list)  # every server behind the engine (weights go to each)
    model_name: str | None = None  # the name vLLM requests must send
    reload_method: str = "paravt"  # how vLLM rollout servers load a checkpoint directory (VLLMServerConfig.reload_method)
    broadcaster: Any = None  # BroadcastPush: the weight group of a run with rollout.weight_sync=broadcast
    control_timeout_s: float = 30.0  # pause / version / cache / resume requests of a push
    load_timeout_s: float = 600.0  # one server's weight load (disk) or a push's whole transfer (broadcast)
    verify_first_push: bool = False  # SGLang: account for every parameter on each server's first push
    verified: set[str] = field(default_factory=set)  # servers whose first push was accounted for

    def __post_init__(self):
        if not self.urls and self.url:
            self.urls = [self.url]

    def push_weights(self, source: Any, version: int) -> None:
        """Load new weights and tag them ``version``, on every server at once: a state dict for ``hf``;
        for servers a checkpoint directory (``disk``) or
        :class:`~paravt.core.weight_sync.WeightBuckets` streamed over the weight group
        (``broadcast``, :class:`~paravt.engines.weight_push.BroadcastPush`). Synchronous and safe to
        call from a thread other than the one driving rollouts: each server gets a short-lived
        control client with its own HTTP session."""
        if self.kind == "hf":
            asyncio.run(self.engine.update_weights(source, version))
            return
        from paravt.core.weight_sync import WeightBuckets  # noqa: PLC0415

        async def push(urls: list[str]) -> None:
            controls = [self.control_client(u) for u in urls]
            try:
                if isinstance(source, WeightBuckets):
                    if self.broadcaster is None:
                        raise EngineError("broadcast weight sync needs EngineHandle.broadcaster (rollout.weight_sync)")
                    await self.broadcaster.push(controls, urls, source, version)
                    self.verified.update(urls)
                else:
                    await asyncio.gather(*(c.update_weights(str(source), version) for c in controls))
                if self.kind == "vllm":  # every server says it holds the version just pushed
                    held = await asyncio.gather(*(c.server_version() for c in controls))
                    if any(v != version for v in held):
                        raise EngineError(f"after pushing version {version} the servers hold {dict(zip(urls, held))}")
            finally:
                await asyncio.gather(*(c.close() for c in controls), return_exceptions=True)

        if isinstance(source, WeightBuckets):
            # a broadcast cannot be sent again: a server that died since its last request is evicted first
            asyncio.run(self._evict_dead("it did not answer the health check before the weight broadcast"))
        try:
            asyncio.run(push(self.live_urls()))
        except EngineError as exc:
            # a disk push can be sent again: to the servers still alive once the dead ones are evicted (a
            # broadcast cannot: its buckets were gathered once, by every trainer rank together)
            if isinstance(source, WeightBuckets) or not asyncio.run(self._evict_dead(f"the weight push failed: {exc}")):
                raise
            asyncio.run(push(self.live_urls()))
        if self.engine is not None:
            self.engine.weight_version = version

    async def _evict_dead(self, why: str) -> bool:
        """Probe every live server of the pool; evict those that do not answer. True when any was."""
        from paravt.engines.pool import EnginePool  # noqa: PLC0415

        pool = self.engine
        if not isinstance(pool, EnginePool):
            return False
        controls = [self.control_client(u) for u in pool.live_urls()]
        try:
            ok = await asyncio.gather(*(asyncio.wait_for(c.health(), pool.probe_timeout_s) for c in controls),
                                      return_exceptions=True)
        finally:
            await asyncio.gather(*(c.close() for c in controls), return_exceptions=True)
        dead = [pool.names.index(c.url) for c, good in zip(controls, ok) if good is not True]
        for i in dead:
            pool.evict(i, why)
        return bool(dead) and bool(pool.live)

    def live_urls(self) -> list[str]:
        """The servers a push goes to: every one, less those the pool evicted as dead (none left is an
        :class:`EngineError` naming them, which ends the run with exit 3)."""
        from paravt.engines.pool import EnginePool  # noqa: PLC0415

        if not isinstance(self.engine, EnginePool):
            return list(self.urls)
        if not self.engine.live:
            raise EngineError(self.engine.none_left())
        return self.engine.live_urls()

    def control_client(self, url: str | None = None):
        url = url or self.url
        if url is None:
            raise ValueError(f"engine kind {self.kind!r} has no server to control")
        if self.kind == "vllm":
            from paravt.engines.vllm import VLLMEngine  # noqa: PLC0415

            return VLLMEngine(url, server=self._server_at(url), model=self.model_name,
                              image_token_id=self.image_token_id, max_retries=1, reload_method=self.reload_method,
                              control_timeout_s=self.control_timeout_s, load_timeout_s=self.load_timeout_s)
        from paravt.engines.sglang import SGLangEngine  # noqa: PLC0415

        return SGLangEngine(url, server=self._server_at(url), image_token_id=self.image_token_id,
                            request_timeout_s=self.load_timeout_s, max_retries=1,
                            verify_push=self.verify_first_push and url not in self.verified)

    def _server_at(self, url: str):
        """The launched server process behind ``url`` (None for servers this run did not start)."""
        for p in self.processes:
            cfg = getattr(p, "cfg", None)
            if cfg is not None and cfg.url.rstrip("/") == url.rstrip("/"):
                return p
        return None

    async def aclose(self) -> None:
        """Close the client (call on the event loop that used it)."""
        try:
            await self.engine.close()
        except Exception:  # noqa: BLE001 - closing is best-effort
            pass

    def stop(self) -> None:
        """Terminate the processes this handle started (and leave the weight group)."""
        if self.broadcaster is not None:
            self.broadcaster.close()
            self.broadcaster = None
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


def replica_configs(server: Any, replicas: int, model: str) -> list[Any]:
    """``replicas`` copies of a server config: ports ``port, port+1, ...`` (0: free ports), the GPUs split in order
    (``tp_size`` each), a log file each. On CPU (no GPUs) every replica shares the machine."""
    out = []
    gpus = list(getattr(server, "gpus", []) or [])
    tp = getattr(server, "tp_size", 1)
    if gpus and len(gpus) < replicas * tp:
        raise ValueError(f"{replicas} server replica(s) x tp_size {tp} need {replicas * tp} GPUs, got {gpus}")
    from paravt.models.parallel import free_port  # noqa: PLC0415

    for i in range(replicas):
        # port 0: a free port each (tests, shared machines)
        kw: dict[str, Any] = {"model_path": str(model), "port": server.port + i if server.port else free_port()}
        if gpus:
            kw["gpus"] = gpus[i * tp:(i + 1) * tp]
        if server.log_file and replicas > 1:
            p = Path(server.log_file)
            kw["log_file"] = str(p.with_name(f"{p.stem}_{i}{p.suffix}"))
        out.append(dataclasses.replace(server, **kw))
    return out


def start_hf_server(model: str, dtype: str = "float32", port: int | None = None, log_file: str | Path | None = None,
                    timeout_s: float = 300.0, host: str = "127.0.0.1") -> tuple[subprocess.Popen, str]:
    """``python -m paravt.engines.hf_server`` listening on ``host`` (localhost by default); returns
    (process, a URL this machine reaches it at) once healthy."""
    from paravt.models.parallel import free_port  # noqa: PLC0415

    port = port or free_port()
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    from paravt.core.procs import preexec_die_with_parent  # noqa: PLC0415

    proc = subprocess.Popen([sys.executable, "-m", "paravt.engines.hf_server", "--model", str(model),
                             "--host", host, "--port", str(port), "--dtype", dtype], stdout=out,
                            stderr=subprocess.STDOUT, preexec_fn=preexec_die_with_parent)
    if log_file:
        out.close()  # the child holds its own descriptor
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '127.0.0.1') else host}:{port}"

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
                 max_retries: int = 3, log_file: str | Path | None = None, urls: list[str] | None = None,
                 replicas: int = 1, weight_version: int = 0, router: Any = None) -> EngineHandle:
    """Build (and, for server kinds, launch and health-check) the engine ``kind`` for ``model``.

    ``processor`` supplies the tokenizer ids token engines need (image pad, banned vision
    tokens); ``server`` is an :class:`~paravt.engines.sglang.SGLangServerConfig` (or, for
    ``openai`` and ``vllm``, a :class:`~paravt.engines.vllm.VLLMServerConfig`) whose ``model_path`` is
    set to ``model``; ``replicas`` copies of it are launched (token kinds). ``urls`` are token servers
    already running (``sglang``/``vllm``), used beside the launched ones. ``weight_version`` is the
    policy version the served weights are (a resumed run's step). ``replicas=0`` launches none (the
    servers of ``urls`` only, e.g. those each node's launcher started under a ``rollout.layout``).
    ``router`` (kind ``vllm``, two or more servers): requests through ``vllm-router``
    (:class:`~paravt.engines.router.RoutedPool`), weight pushes still to each server."""
    if kind not in KINDS:
        raise ValueError(f"engine kind must be one of {KINDS}, got {kind!r}")
    if kind == "hf":
        from paravt.engines.hf import HFEngine  # noqa: PLC0415

        return EngineHandle(kind, HFEngine.from_pretrained(model, dtype=dtype, batch_wait_s=batch_wait_s, seed=seed))
    from paravt.engines.sglang import SGLangServer  # noqa: PLC0415
    from paravt.engines.vllm import VLLMServer, VLLMServerConfig  # noqa: PLC0415

    procs: list[Any] = []
    launched: list[tuple[str, Any]] = []  # (url, server process object)
    try:
        if kind in ("sglang", "openai", "vllm") and server is not None and (replicas or kind == "openai"):
            if isinstance(server, VLLMServerConfig) and kind not in ("openai", "vllm"):
                raise ValueError("a vLLM server serves kind='openai' (chat) or kind='vllm' (tokens)")
            if kind == "vllm" and not isinstance(server, VLLMServerConfig):
                raise ValueError("kind='vllm' launches a VLLMServerConfig")
            n = replicas if kind in ("sglang", "vllm") else 1
            for cfg in replica_configs(server, n, model):
                if kind == "vllm":
                    cfg = dataclasses.replace(cfg, rollout=True)
                srv = (VLLMServer if isinstance(cfg, VLLMServerConfig) else SGLangServer)(cfg)
                procs.append(srv)  # stopped by the except below if a later one fails to start
                srv.start()
                launched.append((cfg.url, srv))
            url = url or (launched[0][0] if launched else None)
        elif kind == "hf_server" and replicas:
            proc, url = start_hf_server(model, dtype, log_file=log_file)
            procs.append(proc)
            launched.append((url, None))
    except BaseException:
        EngineHandle(kind, None, processes=procs).stop()
        raise
    if kind == "openai":
        if not url:
            raise ValueError("engine kind 'openai' needs url= (or server= to launch one)")
        from paravt.engines.openai import OpenAIEngine  # noqa: PLC0415

        return EngineHandle(kind, OpenAIEngine(url, model=model_name, max_retries=max_retries), url, procs)
    servers = launched + [(u.rstrip("/"), None) for u in (urls or [])]
    if url and kind == "remote":
        servers = [(url.rstrip("/"), None)]
    if not servers:
        raise ValueError(f"engine kind {kind!r} needs url=/urls= (or server= to launch one)")
    from paravt.engines.pool import EnginePool  # noqa: PLC0415
    from paravt.engines.sglang import SGLangEngine  # noqa: PLC0415
    from paravt.engines.vllm import VLLMEngine  # noqa: PLC0415
    from paravt.models.tokenize import image_pad_id, vision_token_ids  # noqa: PLC0415

    if processor is None:
        from paravt.models.loading import load_processor  # noqa: PLC0415

        processor = load_processor(model)
    pad = image_pad_id(processor.tokenizer)
    banned = vision_token_ids(processor.tokenizer)
    name = (server.served_model_name if isinstance(server, VLLMServerConfig) else None) or model_name
    reload_method = server.reload_method if isinstance(server, VLLMServerConfig) else "paravt"
    engines = []
    for u, srv in servers:
        if kind == "vllm":
            engines.append(VLLMEngine(u, server=srv, model=name, banned_token_ids=banned, image_token_id=pad,
                                      max_retries=max_retries, weight_version=weight_version,
                                      reload_method=reload_method))
        else:
            engines.append(SGLangEngine(u, server=srv if isinstance(srv, SGLangServer) else None,
                                        banned_token_ids=banned, image_token_id=pad, max_retries=max_retries))
            engines[-1].weight_version = weight_version
    if kind == "vllm" and router is not None and len(engines) > 1:
        from paravt.engines.router import RoutedPool  # noqa: PLC0415

        try:
            engine = RoutedPool.start(engines, router)
        except BaseException:
            EngineHandle(kind, None, processes=procs).stop()
            raise
        procs.insert(0, engine.router)  # stopped first, before the servers it routes to
    else:
        engine = engines[0] if len(engines) == 1 else EnginePool(engines)
    return EngineHandle(kind, engine, servers[0][0], procs, pad, urls=[u for u, _ in servers], model_name=name,
                        reload_method=reload_method)
