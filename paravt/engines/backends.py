"""The built-in engine backends (:mod:`paravt.engines.registry` finds them here by name).

=============  ==========================================================================  ==================
backend        engine                                                                      weights by
=============  ==========================================================================  ==================
``hf``         :class:`~paravt.engines.hf.HFEngine` in this process (the embedded default)  state_dict
``hf_server``  ``python -m paravt.engines.hf_server`` on a free localhost port (CPU/GPU),    disk
               SGLang's API, and/or such servers at ``urls``
``sglang``     ``sglang.launch_server`` from ``server`` (:class:`SGLangServerConfig`)        broadcast, disk
               and/or SGLang servers already running at ``urls``; two or more behind
               ``sglang-router`` with ``router=``
``vllm``       vLLM rollout servers (tokens endpoint, :class:`~paravt.engines.vllm.VLLMEngine`) broadcast, disk,
                                                                                           adapter (LoRA)
               launched from ``server`` (:class:`VLLMServerConfig`) and/or at ``urls``; two
               or more behind ``vllm-router`` with ``router=``
``remote``     an SGLang-API server already running at ``url`` (``scripts/inference.py``)   broadcast, disk
``openai``     an OpenAI-compatible chat server at ``url``, or launched from ``server``      none (eval)
               (SGLang or vLLM launch settings)
=============  ==========================================================================  ==================
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from paravt.engines.factory import EngineHandle, EngineSpec, launch_servers, stop_processes, token_ids
from paravt.engines.http import wait_healthy
from paravt.engines.registry import EngineBackend
from paravt.engines.sglang import SGLangServer, SGLangServerConfig
from paravt.engines.vllm import VLLMServer, VLLMServerConfig, lora_launch


def token_handle(kind: str, spec: EngineSpec, launched: list[tuple[str, Any]],
                 client: Callable[[str, Any, int, list[int]], Any], wrap: Callable[[list[Any], list[Any]], Any] | None = None,
                 **extra: Any) -> EngineHandle:
    """The handle over ``launched`` (url, server) plus ``spec.urls``: one ``client(url, server, pad, banned)``
    each, one engine, or a pool of them (``wrap(engines, processes)`` may put a router in front). The launched
    servers are stopped if anything here fails."""
    from paravt.engines.pool import EnginePool  # noqa: PLC0415

    servers = launched + [(u.rstrip("/"), None) for u in spec.urls]
    procs = [srv for _, srv in launched if srv is not None]
    try:
        if not servers:
            raise ValueError(f"engine {kind!r} needs url=/urls= (or server= to launch one)")
        pad, banned = token_ids(spec)
        engines = [client(u, srv, pad, banned) for u, srv in servers]
        engine = wrap(engines, procs) if wrap is not None and len(engines) > 1 else None
        if engine is None:
            engine = engines[0] if len(engines) == 1 else EnginePool(engines)
    except BaseException:
        stop_processes(procs)
        raise
    return EngineHandle(kind, engine, servers[0][0], procs, pad, urls=[u for u, _ in servers], **extra)


# ---------------------------------------------------------------------------------------------- hf
def _build_hf(spec: EngineSpec) -> EngineHandle:
    from paravt.engines.hf import HFEngine  # noqa: PLC0415

    return EngineHandle("hf", HFEngine.from_pretrained(spec.model, dtype=spec.dtype, batch_wait_s=spec.batch_wait_s,
                                                       seed=spec.seed))


HF = EngineBackend("hf", _build_hf, transports=("state_dict",))


# ---------------------------------------------------------------------- SGLang's API (hf_server, sglang, remote)
def _sglang_client(spec: EngineSpec):
    def make(url: str, srv: Any, pad: int, banned: list[int]):
        from paravt.engines.sglang import SGLangEngine  # noqa: PLC0415

        e = SGLangEngine(url, server=srv if isinstance(srv, SGLangServer) else None, banned_token_ids=banned,
                         image_token_id=pad, max_retries=spec.max_retries)
        e.weight_version = spec.weight_version
        return e
    return make


def _sglang_control(handle: EngineHandle, url: str):
    from paravt.engines.sglang import SGLangEngine  # noqa: PLC0415

    return SGLangEngine(url, server=handle.server_at(url), image_token_id=handle.image_token_id,
                        request_timeout_s=handle.load_timeout_s, max_retries=1,
                        verify_push=handle.verify_first_push and url not in handle.verified)


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


@dataclass
class HFServerConfig:
    """One ``hf_server`` of a node's launcher (``rollout.layout``): its settings come from the model alone."""

    model_path: str = ""
    dtype: str = "float32"
    port: int = 0  # 0: a free port
    host: str = "127.0.0.1"
    log_file: str | None = None


class HFServer:
    """``python -m paravt.engines.hf_server`` with the ``start`` / ``stop`` of the SGLang and vLLM launchers."""

    def __init__(self, cfg: HFServerConfig):
        self.cfg, self.proc, self.url = cfg, None, None

    def start(self) -> "HFServer":
        c = self.cfg
        self.proc, self.url = start_hf_server(c.model_path, c.dtype, c.port or None, c.log_file, host=c.host)
        return self

    def stop(self) -> None:
        stop_processes([self.proc] if self.proc else [])


def _build_hf_server(spec: EngineSpec) -> EngineHandle:
    launched: list[tuple[str, Any]] = []
    if spec.replicas:
        proc, url = start_hf_server(spec.model, spec.dtype, log_file=spec.log_file)
        launched.append((url, proc))
    return token_handle("hf_server", spec, launched, _sglang_client(spec))


# a rollout server: requests may carry the vision-token ban as a custom logit processor (sglang-router drops
# logit_bias), whose class is imported from this repository (paravt.engines.sglang_logit_processor)
SGLANG_ROLLOUT = {"enable_custom_logit_processor": True}


def _routed(spec: EngineSpec, router: str):
    """``token_handle``'s ``wrap``: the servers behind ``router`` (``module:Class`` of a
    :class:`~paravt.engines.router.RouterProcess`) when the spec asks for a router (``spec.router``, two or more
    servers), else None (the pool)."""
    def wrap(engines: list[Any], procs: list[Any]):
        if spec.router is None:
            return None
        import importlib  # noqa: PLC0415

        from paravt.engines.router import RoutedPool  # noqa: PLC0415

        module, _, name = router.partition(":")
        pool = RoutedPool.start(engines, spec.router, router=getattr(importlib.import_module(module), name))
        procs.insert(0, pool.router)  # stopped first, before the servers it routes to
        return pool
    return wrap


def _build_sglang(spec: EngineSpec) -> EngineHandle:
    launched = (launch_servers(spec, SGLangServer, spec.replicas, **SGLANG_ROLLOUT)
                if spec.server is not None and spec.replicas else [])
    return token_handle("sglang", spec, launched, _sglang_client(spec),
                        _routed(spec, "paravt.engines.sglang_router:SGLangRouter"))


def _build_remote(spec: EngineSpec) -> EngineHandle:
    if not spec.url and not spec.urls:
        raise ValueError("engine 'remote' needs url= or urls= (SGLang-API servers already running)")
    if spec.url:
        spec.urls = [spec.url]
    return token_handle("remote", spec, [], _sglang_client(spec))


HF_SERVER = EngineBackend("hf_server", _build_hf_server, transports=("disk",), control=_sglang_control,
                          server_config=HFServerConfig, server_class=HFServer)
SGLANG = EngineBackend("sglang", _build_sglang, transports=("broadcast", "disk"), control=_sglang_control,
                       server_config=SGLangServerConfig, server_class=SGLangServer, rollout_settings=SGLANG_ROLLOUT,
                       launch_needs_cuda=True, routed=True)
REMOTE = EngineBackend("remote", _build_remote, transports=("broadcast", "disk"), control=_sglang_control, rollout=False)


# ---------------------------------------------------------------------------------------------- vLLM
VLLM_ROLLOUT = {"rollout": True}  # a rollout server: the tokens endpoint, processed logprobs, /collective_rpc


def _build_vllm(spec: EngineSpec) -> EngineHandle:
    from paravt.engines.vllm import VLLMEngine  # noqa: PLC0415

    server = spec.server
    launched = (launch_servers(spec, VLLMServer, spec.replicas, **VLLM_ROLLOUT) if server is not None and spec.replicas
                else [])
    name = (server.served_model_name if server is not None else None) or spec.model_name
    reload_method = server.reload_method if server is not None else "paravt"

    def client(url: str, srv: Any, pad: int, banned: list[int]):  # requests name the LoRA adapter when one is pushed
        return VLLMEngine(url, server=srv, model=spec.adapter or name, banned_token_ids=banned, image_token_id=pad,
                          max_retries=spec.max_retries, weight_version=spec.weight_version, reload_method=reload_method)

    return token_handle("vllm", spec, launched, client, _routed(spec, "paravt.engines.router:VLLMRouter"),
                        model_name=name, reload_method=reload_method)


def _vllm_control(handle: EngineHandle, url: str):
    from paravt.engines.vllm import VLLMEngine  # noqa: PLC0415

    return VLLMEngine(url, server=handle.server_at(url), model=handle.model_name, image_token_id=handle.image_token_id,
                      max_retries=1, reload_method=handle.reload_method, control_timeout_s=handle.control_timeout_s,
                      load_timeout_s=handle.load_timeout_s)


VLLM = EngineBackend("vllm", _build_vllm, transports=("broadcast", "disk", "adapter"), control=_vllm_control,
                     server_config=VLLMServerConfig, server_class=VLLMServer, rollout_settings=VLLM_ROLLOUT,
                     gpus_need_cuda=True, confirms_version=True, routed=True, adapters=lora_launch)


# ---------------------------------------------------------------------------------------------- chat
def _build_openai(spec: EngineSpec) -> EngineHandle:
    from paravt.engines.openai import OpenAIEngine  # noqa: PLC0415

    procs: list[Any] = []
    url = spec.url
    if spec.server is not None:
        cls = VLLMServer if isinstance(spec.server, VLLMServerConfig) else SGLangServer
        (launched_url, srv), = launch_servers(spec, cls, 1)
        procs, url = [srv], url or launched_url
    if not url:
        raise ValueError("engine 'openai' needs url= (or server= to launch one)")
    return EngineHandle("openai", OpenAIEngine(url, model=spec.model_name, max_retries=spec.max_retries), url, procs)


OPENAI = EngineBackend("openai", _build_openai, transports=(), server_config=(SGLangServerConfig, VLLMServerConfig),
                       rollout=False)
