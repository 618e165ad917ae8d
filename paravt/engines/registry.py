"""The engine backends, by name: what each one is, how it is built, how its servers are controlled
and which weight transports it accepts. :func:`paravt.engines.factory.build_engine` builds any of them;
RL, eval and ``scripts/inference.py`` name one (``rollout.engine``, ``backend``) and never branch on it.

The built-in backends are declared in :mod:`paravt.engines.backends`. A new engine is one module
(its client, and its server launcher if it has one) plus one :class:`EngineBackend`, made known by
either of::

    register_backend(EngineBackend("mine", build=build_mine, transports=("disk",)))   # in code
    rollout.engine=my_package.my_engine:BACKEND                                        # in a recipe

(docs/GUIDE.md, "Adding a rollout engine").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from paravt.engines.weight_update import TRANSPORTS

#: Built-in backends: name -> "module:attribute" of its EngineBackend (imported on first use).
BUILTIN = {name: f"paravt.engines.backends:{name.upper()}"
           for name in ("hf", "hf_server", "sglang", "vllm", "remote", "openai")}
_REGISTERED: dict[str, "EngineBackend"] = {}


@dataclass(frozen=True)
class EngineBackend:
    """One engine kind. ``build(spec)`` takes a :class:`~paravt.engines.factory.EngineSpec` and returns
    a started :class:`~paravt.engines.factory.EngineHandle` (servers launched and healthy, clients
    connected); ``control(handle, url)`` returns a short-lived client of one server for a weight push
    (``update_weights``, ``server_version``, ``health``, ``close`` and, for broadcast, the group
    methods :class:`~paravt.engines.weight_push.BroadcastPush` calls); None for in-process engines."""

    name: str
    build: Callable[[Any], Any]
    # weight transports it accepts, the one rollout.weight_sync=auto picks first; () takes none. A handle built
    # without a WeightUpdate (tests, scripts) takes disk when the backend accepts it, else the first.
    transports: tuple[str, ...]
    control: Callable[[Any, str], Any] | None = None
    server_config: type | tuple[type, ...] | None = None  # the launch settings it takes (None: it launches nothing)
    # the launcher of one server from its settings (start / stop); a node's launcher starts a layout's servers
    # with it, from the recipe's settings or, when the recipe holds none, server_config(model_path, dtype, port,
    # host, log_file)
    server_class: type | None = None
    rollout_settings: dict[str, Any] = field(default_factory=dict)  # settings a rollout server's launch adds
    rollout: bool = True  # serves RL rollouts: token ids in, token ids and logprobs out
    launch_needs_cuda: bool = False  # the servers it launches need GPUs (no CPU build)
    gpus_need_cuda: bool = False  # launch settings naming GPUs need the CUDA build (the CPU build takes none)
    confirms_version: bool = False  # after a push every server reports the version it holds, and is checked
    routed: bool = False  # several servers can sit behind a router (rollout.router)
    # LoRA runs: adapters(launch settings, rank, vision) -> the settings of a server that loads LoRA adapters of
    # that rank (vision: on the vision tower too) at run time, pushed by the "adapter" transport; None: the
    # backend loads none, and a LoRA run pushes the merged weights by its usual transport
    adapters: Callable[[Any, int, bool], Any] | None = None

    def __post_init__(self):
        if self.adapters is not None and "adapter" not in self.transports:
            raise ValueError(f"engine backend {self.name!r} loads adapters: its transports must include adapter")
        bad = [t for t in self.transports if t not in TRANSPORTS]
        if bad:
            raise ValueError(f"engine backend {self.name!r}: transports must be some of {' | '.join(TRANSPORTS)}, "
                             f"got {self.transports}")


def register_backend(backend: EngineBackend) -> EngineBackend:
    """Make ``backend`` known by its name (replacing one of that name). Returns it."""
    _REGISTERED[backend.name] = backend
    return backend


def _load(path: str, name: str) -> EngineBackend:
    module, _, attr = path.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr or "BACKEND")
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"engine {name!r}: cannot load {path} ({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, EngineBackend):
        raise ValueError(f"engine {name!r}: {path} is a {type(obj).__name__}, not an EngineBackend")
    return obj


def get_backend(name: str) -> EngineBackend:
    """The backend called ``name``: registered, built in, or ``module:attribute`` of an EngineBackend."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in BUILTIN:
        return register_backend(_load(BUILTIN[name], name))
    if ":" in name:  # an engine outside the package, named by where its EngineBackend is; then also by its name
        _REGISTERED[name] = _load(name, name)
        _REGISTERED.setdefault(_REGISTERED[name].name, _REGISTERED[name])
        return _REGISTERED[name]
    raise ValueError(f"engine must be one of {' | '.join(backend_names())} or module:attribute of an "
                     f"EngineBackend, got {name!r}")


def backend_names(rollout_only: bool = False) -> list[str]:
    """Every known backend name (built in, then registered), or those that serve RL rollouts."""
    names = list(BUILTIN) + [n for n in _REGISTERED if n not in BUILTIN]
    return [n for n in names if not rollout_only or get_backend(n).rollout]
