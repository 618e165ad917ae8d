"""The world a dry run steps in: N ranks of torch's fake process group, the model's parameters and
activations as fake tensors (shape, dtype and device, no storage), the host's own tensors real.

Three kinds of tensor meet in a step:

* **fake device tensors** (parameters, activations, gradients): :class:`FakeTensorMode` computes their
  shapes; no value exists.
* **host tensors** (token ids, positions, image grids, masks built from Python lists): real CPU tensors;
  an op on host tensors alone runs for real, as on the GPU machine's host.
* **device tensors with known values**: a host tensor the step moves to the device (``x.to(device)``,
  ``torch.tensor(..., device=device)``) becomes a fake tensor with its real value kept beside it (its
  *shadow*). Ops whose fake inputs all have shadows compute the shadows too, so when the step reads such
  a value back (``.item()``, ``.tolist()``, a boolean-mask index, ``nonzero``) the read returns the true
  value, and it is counted as a **host sync**: on a GPU the host waits for the device there.

The step code is handed a marker device (``meta``) as its device: a copy to it makes a device tensor.
The model itself lives on the fake process group's device (``cpu``), where FSDP2 shards it.

Where the values cannot be known (a read of a fake tensor without a shadow: a loss, a gradient norm)
the read returns a placeholder (1) and its call site is listed (:attr:`HostMode.placeholders`); an op
whose output shape depends on such values runs on real zero tensors of the fake inputs' shapes and is
listed too (:attr:`HostMode.stand_ins`). Nothing is skipped without a line in the report.

DTensor computes the metadata of its outputs by running the op on global-shape fake tensors in the
active fake mode (sharding propagation); those tensors are not memory any rank holds, so while
propagation runs the trackers ignore every op (:func:`propagation_guard`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

aten = torch.ops.aten
MARKER = torch.device("meta")  # the device the step code is given: a copy to it is a host-to-device copy
SIM = torch.device("cpu")  # the device the fake tensors live on (the fake process group's)
SHADOW_LIMIT = 1 << 22  # elements: larger device tensors keep no shadow (pixels, hidden states)
SMALL_FACTORY = 1 << 20  # integer/bool tensors made from nothing up to this size are host tensors
_STATE = threading.local()
_ROOT = Path(__file__).resolve().parents[2]  # the repository: call sites are named relative to it


def in_propagation() -> bool:
    return getattr(_STATE, "propagating", False)


class _PropagationFlag:
    """Stands in for DTensor's ``ShardingPropagator._fake_mode_lock`` (a context manager around the
    metadata propagation, a no-op by default): sets :func:`in_propagation` while it runs."""

    def __init__(self, inner):
        self.inner = inner

    def __enter__(self):
        self.prev = in_propagation()
        _STATE.propagating = True
        return self.inner.__enter__()

    def __exit__(self, *exc):
        _STATE.propagating = self.prev
        return self.inner.__exit__(*exc)


@contextlib.contextmanager
def propagation_guard():
    """While inside: DTensor's sharding propagation is flagged (see the module doc). Says whether this
    torch has the hook (``ShardingPropagator._fake_mode_lock``; torch >= 2.9)."""
    try:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a torch without DTensor
        yield False
        return
    old = getattr(ShardingPropagator, "_fake_mode_lock", None)
    if old is None:  # pragma: no cover - a torch without the hook: optimizer temporaries over-counted
        yield False
        return
    ShardingPropagator._fake_mode_lock = _PropagationFlag(old)
    try:
        yield True
    finally:
        ShardingPropagator._fake_mode_lock = old


def init_fake_group(rank: int, world: int) -> None:
    """torch's fake process group as the default group (collectives return at once, shapes only)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: PLC0415 - registers "fake"

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())


def call_site(skip_dryrun: bool = True) -> str:
    """``path:line (function)`` of the innermost frame outside torch (and this package): where the step
    code made the call being recorded."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if "/torch/" not in name and not (skip_dryrun and "/paravt/dryrun/" in name) and "<" not in name:
            p = Path(name)
            if "site-packages" in p.parts:  # an installed package: from its own name on
                short = "/".join(p.parts[p.parts.index("site-packages") + 1:])
            else:
                short = str(p.relative_to(_ROOT)) if p.is_relative_to(_ROOT) else "/".join(p.parts[-3:])
            return f"{short}:{f.f_lineno} ({f.f_code.co_name})"
        f = f.f_back
    return "?"


def _is_marker(dev: Any) -> bool:
    return dev is not None and torch.device(dev).type == MARKER.type


class HostMode(TorchDispatchMode):
    """Routes each op to the real or the fake world (see the module doc) and counts the host's reads of
    device values. Entered innermost, so it sees every op first."""

    def __init__(self, fake_mode: FakeTensorMode):
        super().__init__()
        self.fm = fake_mode
        self.shadows: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.reads = 0  # device values read on the host
        self.syncs = 0  # reads separated by device work: one wait each
        self.sites: Counter = Counter()  # call site -> syncs there
        self.placeholders: Counter = Counter()  # call site -> reads whose value no fake tensor has
        self.stand_ins: Counter = Counter()  # op -> runs on real zero tensors (output shape from values)
        self.by_phase: Counter = Counter()  # phase -> syncs
        self.phase = lambda: "step"  # the step's phase now (set by the caller)
        self._since_read = True
        self._last_source = None

    # ---------------------------------------------------------------- helpers
    def _device_tensor(self, real: torch.Tensor) -> torch.Tensor:
        """A fake device tensor for host tensor ``real`` (allocated through the trackers), its shadow kept."""
        out = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device=SIM)
        if real.numel() <= SHADOW_LIMIT:
            self.shadows[out] = real
        return out

    def _read(self, placeholder: bool = False, source: torch.Tensor | None = None) -> None:
        """One device value read on the host; a new sync unless it follows the previous read with no device
        work between, from the same tensor (a ``tolist``'s elements)."""
        self.reads += 1
        site = call_site()
        key = source.untyped_storage()._cdata if source is not None else None
        if self._since_read or key != self._last_source:
            self.syncs += 1
            self.sites[site] += 1
            self.by_phase[self.phase()] += 1
        self._since_read = False
        self._last_source = key
        if placeholder:
            self.placeholders[site] += 1

    def _attach(self, out: Any, real: Any) -> None:
        fo, _ = tree_flatten(out)
        ro, _ = tree_flatten(real)
        for f, r in zip(fo, ro):
            if isinstance(f, FakeTensor) and isinstance(r, torch.Tensor) and r.numel() <= SHADOW_LIMIT:
                self.shadows[f] = r

    def _real(self, x: Any) -> Any:
        return self.shadows[x] if isinstance(x, FakeTensor) else x

    # ---------------------------------------------------------------- dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor  # noqa: PLC0415

        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        if in_propagation():
            return func(*args, **kwargs)
        flat, _ = tree_flatten((args, kwargs))
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        fakes = [a for a in tensors if isinstance(a, FakeTensor)]
        if func not in _NO_WORK:
            self._since_read = True
        if _is_marker(kwargs.get("device")):  # a copy to the device, or a tensor made there
            return self._to_device(func, args, kwargs, fakes)
        if not fakes:
            if tensors:  # host tensors only: the host computes it
                with unset_fake_temporarily():
                    return func(*args, **kwargs)
            out = func(*args, **kwargs)  # made from nothing: fake, unless a small integer tensor (host)
            if isinstance(out, torch.Tensor) and not out.is_floating_point() and out.numel() <= SMALL_FACTORY:
                with unset_fake_temporarily():
                    return func(*args, **kwargs)
            return out
        if all(f in self.shadows for f in fakes):
            return self._shadowed(func, args, kwargs)
        if func is aten._local_scalar_dense.default:  # a device value nobody knows: placeholder
            self._read(placeholder=True, source=args[0])
            return True if args[0].dtype == torch.bool else 1
        for f in _written(func, args, kwargs):  # an in-place op with unknown inputs: its output's value is unknown
            if isinstance(f, FakeTensor) and f in self.shadows:
                del self.shadows[f]
        try:
            return func(*args, **kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException):
            return self._data_dependent(func, args, kwargs)

    def _to_device(self, func, args, kwargs, fakes):
        kw = dict(kwargs, device=SIM)
        if fakes:  # already a device tensor: a plain copy (or cast) there
            out = func(*args, **kw)
            src = args[0]
            if src in self.shadows and isinstance(out, FakeTensor):
                with unset_fake_temporarily():
                    self._attach(out, func(self.shadows[src], **kw))
            return out
        if not any(isinstance(a, torch.Tensor) for a in tree_flatten((args, kwargs))[0]):
            out = func(*args, **kw)  # made on the device: fake, its value kept when small
            if out.numel() <= SHADOW_LIMIT:
                with unset_fake_temporarily():
                    self.shadows[out] = func(*args, **kw)
            return out
        with unset_fake_temporarily():
            real = func(*args, **kw)
        return self._device_tensor(real)

    def _shadowed(self, func, args, kwargs):
        rargs, rkw = tree_map_only(FakeTensor, self._real, (args, kwargs))
        with unset_fake_temporarily():
            real = func(*rargs, **rkw)
        if func is aten._local_scalar_dense.default:
            self._read(source=rargs[0])
            return real
        try:
            out = func(*args, **kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException):
            self._read()  # the output's shape is a device value: the host waits for it
            out = tree_map_only(torch.Tensor, self._device_tensor, real)
            return out
        self._attach(out, real)
        return out

    def _data_dependent(self, func, args, kwargs):
        """An op whose output shape depends on values: boolean-mask indices with known values become
        integer indices (a read); anything else runs on real zeros of the fake inputs' shapes."""
        if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
            idx = list(args[1])
            if all(i is None or i.dtype != torch.bool or not isinstance(i, FakeTensor) or i in self.shadows
                   for i in idx):
                new = []
                for i in idx:
                    if i is not None and i.dtype == torch.bool:
                        if isinstance(i, FakeTensor):
                            self._read()
                        with unset_fake_temporarily():
                            new.extend(self._real(i).nonzero().unbind(1))
                    else:
                        new.append(i)
                return func(args[0], new, *args[2:], **kwargs)
        self.stand_ins[f"{func} at {call_site()}"] += 1

        def zeros(t):
            if t in self.shadows:
                return self.shadows[t]
            with unset_fake_temporarily():
                return torch.zeros(t.shape, dtype=t.dtype)

        rargs, rkw = tree_map_only(FakeTensor, zeros, (args, kwargs))
        with unset_fake_temporarily():
            real = func(*rargs, **rkw)
        return tree_map_only(torch.Tensor, self._device_tensor, real)


def _written(func, args, kwargs) -> list:
    """The tensors an op writes in place (its schema's mutable arguments)."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            v = args[i] if i < len(args) else kwargs.get(a.name)
            out.extend(v if isinstance(v, (list, tuple)) else [v])
    return out


_NO_WORK = {aten.unbind.int, aten.select.int, aten._local_scalar_dense.default, aten.detach.default,
            torch.ops.prim.device.default}


def make_fake_mode() -> FakeTensorMode:
    # host tensors enter device ops as they are (FakeTensorMode wraps them)
    return FakeTensorMode(allow_non_fake_inputs=True)
