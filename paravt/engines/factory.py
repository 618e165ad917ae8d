"""``build_engine``: the one place that turns an engine's name and an :class:`EngineSpec` into a
running engine (RL, eval and ``scripts/inference.py`` all call it). The name picks an
:class:`~paravt.engines.registry.EngineBackend` (built in: :mod:`paravt.engines.backends`), whose
``build`` launches and health-checks its servers; weights reach an engine only through
:meth:`EngineHandle.push_weights`, in the transport its :class:`~paravt.engines.weight_update.WeightUpdate`
names and the backend accepts.

Token backends with more than one server (``replicas`` launched, plus ``urls``) are one
:class:`~paravt.engines.pool.EnginePool`: an episode's requests on one server, a dead server evicted,
weights to every live one; a routed backend's servers can sit behind a router instead
(:class:`~paravt.engines.router.RoutedPool`, ``router=``), with the same two properties.
Every server this process launches dies with it (``PR_SET_PDEATHSIG``), kill -9 included.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paravt.core.startup import ready
from paravt.engines.base import EngineError
from paravt.engines.registry import EngineBackend, get_backend
from paravt.engines.weight_update import WeightUpdate


@dataclass
class EngineSpec:
    """What to build: the model and every setting a backend may read (each reads its own)."""

    model: str
    processor: Any = None  # supplies the tokenizer ids token engines need (image pad, banned vision tokens)
    dtype: str = "float32"  # in-process / hf_server dtype
    seed: int = 0
    batch_wait_s: float = 0.03  # in-process engine: requests arriving this close are batched
    url: str | None = None  # one server already running
    urls: list[str] = field(default_factory=list)  # token servers already running, used beside the launched ones
    server: Any = None  # launch settings (the backend's server_config); model_path is set to ``model``
    replicas: int = 1  # copies of ``server`` launched (0: none, the servers of ``urls`` only)
    model_name: str | None = None  # the name requests must send (chat servers)
    max_retries: int = 3
    log_file: str | Path | None = None  # hf_server's log
    weight_version: int = 0  # the policy version the served weights are (a resumed run's step)
    router: Any = None  # RouterConfig: a routed backend's servers behind a router (two or more servers)
    weight_update: WeightUpdate | None = None  # how pushes travel (None: the backend's disk or in-memory default)
    adapter: str | None = None  # the LoRA adapter requests name (the "adapter" transport loads it; None: the base)
    # while a request or push waits on a server, its /health is probed this often; this many probes in a row
    # without an answer fail it (http.LaunchedServerMixin.watched): a frozen server is found in seconds
    health_interval_s: float = 5.0
    health_misses: int = 3


@dataclass
class EngineHandle:
    """A built engine plus whatever processes serve it."""

    kind: str  # the backend's name (or module:attribute of an engine outside the package)
    engine: Any  # InferenceEngine (token engines, an EnginePool for several servers) or ChatEngine (openai)
    url: str | None = None
    processes: list[Any] = field(default_factory=list)  # subprocess.Popen | SGLangServer | VLLMServer
    image_token_id: int | None = None
    urls: list[str] = field(default_factory=list)  # every server behind the engine (weights go to each)
    model_name: str | None = None  # the name vLLM requests must send
    reload_method: str = "paravt"  # how vLLM rollout servers load a checkpoint directory (VLLMServerConfig.reload_method)
    weight_update: WeightUpdate | None = None  # how pushes travel (None: the backend's disk or in-memory default)
    broadcaster: Any = None  # the weight group of a broadcast update (made from weight_update when first needed)
    control_timeout_s: float = 30.0  # pause / version / cache / resume requests of a push
    load_timeout_s: float = 600.0  # one server's weight load (disk) or a push's whole transfer (broadcast)
    verify_first_push: bool = False  # SGLang: account for every parameter on each server's first push
    verified: set[str] = field(default_factory=set)  # servers whose first push was accounted for
    adapter: str | None = None  # EngineSpec's: the name the "adapter" transport loads each version under
    health_interval_s: float = 5.0  # EngineSpec's: the probes of the push's control clients too
    health_misses: int = 3

    def __post_init__(self):
        if not self.urls and self.url:
            self.urls = [self.url]
        self.check_update()

    def check_update(self) -> None:
        """The weight update is one the backend accepts (None: its disk or in-memory default)."""
        b = self.backend
        if self.weight_update is None and b.transports:
            self.weight_update = WeightUpdate.from_disk() if "disk" in b.transports else WeightUpdate(b.transports[0])
        if self.weight_update is not None and self.weight_update.transport not in b.transports:
            raise ValueError(f"engine {self.kind!r} takes weights by {' | '.join(b.transports) or 'none'}, not by "
                             f"{self.weight_update.transport}")

    @property
    def backend(self) -> EngineBackend:
        return get_backend(self.kind)

    def push_weights(self, weights: Any, version: int) -> None:
        """Load new weights and tag them ``version``, on every server at once, as :attr:`weight_update` says:
        a state dict (``state_dict``), a checkpoint directory (``disk``) or
        :class:`~paravt.core.weight_sync.WeightBuckets` (``broadcast``, streamed over the weight group by
        :class:`~paravt.engines.weight_push.BroadcastPush`). Synchronous and safe to call from a thread
        other than the one driving rollouts: each server gets a short-lived control client with its own
        HTTP session."""
        update = self.weight_update
        if update is None:
            raise EngineError(f"engine {self.kind!r} takes no weights")
        update.check_payload(weights)
        if update.transport == "state_dict":
            asyncio.run(self.engine.update_weights(weights, version))
            return

        async def push(urls: list[str]) -> None:
            controls = [self.control_client(u) for u in urls]
            try:
                if update.transport == "broadcast":
                    await self._group().push(controls, urls, weights, version)
                    self.verified.update(urls)
                elif update.transport == "adapter":  # a LoRA adapter loaded over the served base
                    await asyncio.gather(*(c.load_adapter(str(weights), version, self.adapter) for c in controls))
                else:
                    await asyncio.gather(*(c.update_weights(str(weights), version) for c in controls))
                if self.backend.confirms_version:  # every server says it holds the version just pushed
                    held = await asyncio.gather(*(c.server_version() for c in controls))
                    if any(v != version for v in held):
                        raise EngineError(f"after pushing version {version} the servers hold {dict(zip(urls, held))}")
            finally:
                await asyncio.gather(*(c.close() for c in controls), return_exceptions=True)

        if update.transport == "broadcast":
            # a broadcast cannot be sent again: a server that died since its last request is evicted first
            asyncio.run(self._evict_dead("it did not answer the health check before the weight broadcast"))
        try:
            asyncio.run(push(self.live_urls()))
        except EngineError as exc:
            # a disk push can be sent again: to the servers still alive once the dead ones are evicted (a
            # broadcast cannot: its buckets were gathered once, by every trainer rank together)
            if update.transport == "broadcast" or not asyncio.run(self._evict_dead(f"the weight push failed: {exc}")):
                raise
            asyncio.run(push(self.live_urls()))
        if self.engine is not None:
            self.engine.weight_version = version

    def _group(self):
        """The weight group of a broadcast update: formed on the first push, re-formed without evicted servers."""
        if self.broadcaster is None:
            from paravt.engines.weight_push import BroadcastPush  # noqa: PLC0415

            u = self.weight_update
            self.broadcaster = BroadcastPush(u.backend, u.master_address, u.timeout_s, join_timeout_s=u.join_timeout_s)
        return self.broadcaster

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
        """A short-lived client of the server at ``url`` (default: the first) for a weight push."""
        url = url or self.url
        control = self.backend.control
        if url is None or control is None:
            raise ValueError(f"engine {self.kind!r} has no server to control")
        return watch_health(control(self, url), self.health_interval_s, self.health_misses)

    def server_at(self, url: str):
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
        stop_processes(self.processes)
        self.processes = []


def stop_processes(processes: list[Any]) -> None:
    """Terminate launched servers: ``subprocess.Popen`` (30 s, then killed) or objects with ``stop()``."""
    for p in processes:
        if isinstance(p, subprocess.Popen):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        else:
            p.stop()


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


def launch_servers(spec: EngineSpec, server_cls: type, n: int, **settings: Any) -> list[tuple[str, Any]]:
    """``n`` copies of ``spec.server`` (with ``settings`` replaced), each started and healthy, as (url, server);
    all of them stopped again if one fails to start."""
    procs: list[Any] = []
    try:
        for cfg in replica_configs(spec.server, n, spec.model):
            srv = server_cls(dataclasses.replace(cfg, **settings) if settings else cfg)
            procs.append(srv)
            srv.start()
    except BaseException:
        stop_processes(procs)
        raise
    return [(p.cfg.url, p) for p in procs]


def token_ids(spec: EngineSpec) -> tuple[int, list[int]]:
    """(the image placeholder id, the vision token ids a token engine must never generate) of the model."""
    from paravt.models.tokenize import image_pad_id, vision_token_ids  # noqa: PLC0415

    processor = spec.processor
    if processor is None:
        from paravt.models.loading import load_processor  # noqa: PLC0415

        processor = load_processor(spec.model)
    return image_pad_id(processor.tokenizer), vision_token_ids(processor.tokenizer)


def watch_health(client: Any, interval_s: float, misses: int) -> Any:
    """``client`` with its server's health probed every ``interval_s`` seconds while it waits, failing after
    ``misses`` probes in a row without an answer (clients that probe: :class:`~paravt.engines.http.LaunchedServerMixin`)."""
    if hasattr(client, "health_misses"):
        client.health_interval_s, client.health_misses = float(interval_s), int(misses)
    return client


def build_engine(kind: str, model: str, processor=None, **settings: Any) -> EngineHandle:
    """Build (and, for server backends, launch and health-check) the engine ``kind`` for ``model``;
    ``settings`` are :class:`EngineSpec`'s fields. ``kind`` is a backend's name
    (:func:`~paravt.engines.registry.backend_names`) or ``module:attribute`` of an EngineBackend."""
    backend = get_backend(kind)
    spec = EngineSpec(model, processor, **settings)
    takes = backend.server_config
    if spec.server is not None and takes is not None and not isinstance(spec.server, takes):
        names = " or ".join(t.__name__ for t in (takes if isinstance(takes, tuple) else (takes,)))
        raise ValueError(f"engine {kind!r} launches a {names}, got {type(spec.server).__name__}")
    handle = backend.build(spec)
    handle.kind, handle.adapter = kind, spec.adapter
    handle.health_interval_s, handle.health_misses = spec.health_interval_s, spec.health_misses
    for e in getattr(handle.engine, "engines", [handle.engine]):  # each server's client (a pool's too)
        watch_health(e, spec.health_interval_s, spec.health_misses)
    if spec.weight_update is not None:
        handle.weight_update = spec.weight_update
    try:
        handle.check_update()
    except ValueError:
        handle.stop()
        raise
    ready()  # an engine is the last thing an eval or RL process sets up (paravt.core.startup)
    return handle
