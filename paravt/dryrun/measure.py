"""What a dry run measures while the step runs on fake tensors.

* :class:`StepCounter` (a ``TorchDispatchMode``): FLOPs by phase (forward, activation recompute,
  backward, optimizer) with torch's own formulas (``torch.utils.flop_counter``, the table
  ``FlopCounterMode`` uses) plus the CPU flash-attention kernel the CPU stands in with, causal attention
  counted half; the bytes each kernel reads and writes (the eager step's memory traffic: every op reads its
  inputs and writes its outputs once, views move nothing); the collectives and their buffer bytes;
  the attention calls of each text layer and vision block.
* :class:`PeakTracker`: torch's ``FSDPMemTracker`` (``torch.distributed._tools.fsdp2_mem_tracker``), which
  files every tensor as sharded/unsharded parameter, gradient, optimizer state, activation, temporary or
  collective buffer, plus the module that runs when the peak is reached. :func:`split` folds its
  categories into five that sum to the peak.
"""

from __future__ import annotations

import contextlib
from collections import Counter, defaultdict
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from paravt.dryrun.fake import call_site, in_propagation

aten = torch.ops.aten
c10d = torch.ops.c10d
_fc = torch.ops._c10d_functional

SDPA_FORWARD = {aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention,
                aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_cudnn_attention,
                aten._scaled_dot_product_attention_math, aten._flash_attention_forward,
                aten._efficient_attention_forward}


def _attn_flops(q, k, causal: bool, factor: int) -> int:
    """``factor`` × 2·b·h·s_q·s_k·d (forward: 2, two matmuls of 2 FLOPs a multiply-add each; backward: 4),
    half of it for causal attention over a square score matrix (the half a causal kernel computes)."""
    b, h, sq, d = q.shape
    sk = k.shape[-2]
    flops = factor * 2 * b * h * sq * sk * d
    return flops // 2 if causal and sq == sk else flops


def _cpu_flash(q, k, v, dropout_p=0.0, is_causal=False, **_):
    return _attn_flops(q, k, bool(is_causal), 2)


def _cpu_flash_backward(grad_out, q, k, v, out, lse, dropout_p=0.0, is_causal=False, **_):
    return _attn_flops(q, k, bool(is_causal), 4)


_EXTRA_FLOPS = {aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash,
                aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward}
# ops that read or write no tensor data of their own (views, metadata, allocation, bookkeeping)
_NO_TRAFFIC = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
               aten.detach.default, aten._local_scalar_dense.default, aten.new_empty.default,
               aten.new_empty_strided.default, aten.lift_fresh.default, aten.set_.source_Storage_storage_offset}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def collective_bytes(func, args, kwargs) -> tuple[str, int] | None:
    """(kind, buffer bytes) of a c10d collective: the gathered output of an all-gather, the input of a
    reduce-scatter, the tensors of an all-reduce or broadcast. None for any other op."""
    if func is c10d._allgather_base_.default:
        return "all_gather", _nbytes(args[0])
    if func is c10d.allgather_.default:
        return "all_gather", sum(_nbytes(t) for ts in args[0] for t in ts)
    if func is c10d.allgather_into_tensor_coalesced_.default:
        return "all_gather", sum(_nbytes(t) for t in args[0])
    if func is c10d._reduce_scatter_base_.default:
        return "reduce_scatter", _nbytes(args[1])
    if func is c10d.reduce_scatter_.default:
        return "reduce_scatter", sum(_nbytes(t) for ts in args[1] for t in ts)
    if func is c10d.reduce_scatter_tensor_coalesced_.default:
        return "reduce_scatter", sum(_nbytes(t) for t in args[1])
    if func is c10d.allreduce_.default:
        return "all_reduce", sum(_nbytes(t) for t in args[0])
    if func is c10d.broadcast_.default:
        return "broadcast", sum(_nbytes(t) for t in args[0])
    if func is _fc.all_gather_into_tensor.default:
        return "all_gather", _nbytes(args[0]) * int(args[1])
    if func is _fc.reduce_scatter_tensor.default:
        return "reduce_scatter", _nbytes(args[0])
    if func in (_fc.all_reduce.default, _fc.all_reduce_.default):
        return "all_reduce", _nbytes(args[0])
    if func in (_fc.broadcast.default, _fc.broadcast_.default):
        return "broadcast", _nbytes(args[0])
    return None


class StepCounter(TorchDispatchMode):
    """FLOPs, kernel bytes, collectives and attention calls of the ops that run on device (fake) tensors.
    ``blocks``: {module: (kind, index)} of the text layers and vision blocks, to attribute forward FLOPs
    and attention calls; an op inside backward while a module's forward runs is a recompute."""

    def __init__(self, blocks: dict[torch.nn.Module, tuple[str, int]]):
        super().__init__()
        self.flops: Counter = Counter()  # phase -> FLOPs
        self.bytes: Counter = Counter()  # phase -> bytes read + written by kernels
        self.kernels: Counter = Counter()  # (flops, bytes) -> kernels: the per-kernel roofline
        self.collectives: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # kind -> [calls, buffer bytes]
        self.host_collectives = 0  # collectives on host tensors (each a read-back on a GPU machine)
        self.attention: Counter = Counter()  # block kind -> attention kernels in forward
        self.block_flops: Counter = Counter()  # (kind, index) -> forward FLOPs
        self.unknown_ops: Counter = Counter()  # ops with FLOPs torch has no formula for (none expected)
        self._stack: list[tuple[str, int]] = []  # the blocks whose forward runs (forward pass)
        self._recomputing = 0  # checkpointed blocks recomputing (inside backward)
        self._optimizer = False
        self._handles = []
        self._restore = []
        for m, key in blocks.items():
            self._handles.append(m.register_forward_pre_hook(lambda mod, a, key=key: self._enter(key)))
            self._handles.append(m.register_forward_hook(lambda mod, a, o: self._leave()))
            # transformers checkpoints a block's ``forward``: its hooks do not run again in a recompute, so the
            # checkpointed function is wrapped to say when it runs inside backward
            plain = getattr(m, "_gradient_checkpointing_func", None)
            if getattr(m, "gradient_checkpointing", False) and plain is not None:
                m._gradient_checkpointing_func = self._wrap(plain)
                self._restore.append((m, plain))

    def _enter(self, key: tuple[str, int]) -> None:
        self._stack.append(key)

    def _leave(self) -> None:  # returns None: a forward hook's return value would replace the output
        if self._stack:
            self._stack.pop()

    def _wrap(self, checkpoint_fn):
        def run(fn, *args, **kwargs):
            def counted(*a, **k):
                inside = int(torch._C._current_graph_task_id() != -1)
                self._recomputing += inside
                try:  # a recompute may stop early by an exception (torch's early stop)
                    return fn(*a, **k)
                finally:
                    self._recomputing -= inside
            return checkpoint_fn(counted, *args, **kwargs)
        return run

    def _block(self) -> tuple[str, int] | None:
        return self._stack[-1] if self._stack else None

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        for m, plain in self._restore:
            m._gradient_checkpointing_func = plain

    @contextlib.contextmanager
    def optimizer_phase(self):
        self._optimizer = True
        try:
            yield
        finally:
            self._optimizer = False

    def phase(self) -> str:
        if self._optimizer:
            return "optimizer"
        if torch._C._current_graph_task_id() != -1:
            return "recompute" if self._recomputing else "backward"
        return "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor  # noqa: PLC0415

        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        out = func(*args, **kwargs)
        if in_propagation():
            return out
        flat_in, _ = tree_flatten((args, kwargs))
        ins = [a for a in flat_in if isinstance(a, torch.Tensor)]
        flat_out, _ = tree_flatten(out)
        outs = [o for o in flat_out if isinstance(o, torch.Tensor)]
        coll = collective_bytes(func, args, kwargs)
        if not any(isinstance(t, FakeTensor) for t in ins + outs):  # the host's own tensors
            if coll is not None:
                self.host_collectives += 1
            return out
        if coll is not None:
            c = self.collectives[coll[0]]
            c[0] += 1
            c[1] += coll[1]
            return out
        phase = self.phase()
        packet = func._overloadpacket
        flops = 0
        if packet in _EXTRA_FLOPS:
            flops = _EXTRA_FLOPS[packet](*args, **kwargs)
        elif packet in flop_registry:
            flops = flop_registry[packet](*args, **kwargs, out_val=out)
        traffic = 0
        if func not in _NO_TRAFFIC and not func.is_view and func.namespace == "aten":
            seen = {id(t) for t in ins}
            traffic = sum(_nbytes(t) for t in ins) + sum(_nbytes(o) for o in outs if id(o) not in seen)
        self.flops[phase] += flops
        self.bytes[phase] += traffic
        if flops or traffic:
            self.kernels[(flops, traffic)] += 1
        block = self._block() if phase == "forward" else None
        if block is not None:
            self.block_flops[block] += flops
            if packet in SDPA_FORWARD:
                self.attention[block[0]] += 1
        return out

    def roofline(self, peak_flops: float, bandwidth: float) -> dict[str, float]:
        """Seconds: all FLOPs at the peak, all bytes at the bandwidth, and the sum over kernels of each
        kernel's larger of the two (every kernel waits for its slower resource)."""
        f = sum(self.flops.values())
        b = sum(self.bytes.values())
        per_kernel = sum(n * max(fl / peak_flops, by / bandwidth) for (fl, by), n in self.kernels.items())
        return {"compute_s": f / peak_flops, "memory_s": b / bandwidth, "per_kernel_s": per_kernel}


class PeakTracker(FSDPMemTracker):
    """``FSDPMemTracker`` that ignores DTensor's metadata propagation (see :mod:`paravt.dryrun.fake`) and
    notes the innermost module running (and the phase) when each device's peak is reached."""

    def __init__(self, mod, optm=None):
        super().__init__(mod, optm)
        self.peak_where: dict[torch.device, str] = {}

    def _track(self, reftype, t):  # noqa: D401 - torch's hook
        if not in_propagation():
            super()._track(reftype, t)

    def _update_peak_stats(self, peak_state) -> None:
        if in_propagation():
            return
        before = dict(self._peak_mem)
        super()._update_peak_stats(peak_state)
        for dev, peak in self._peak_mem.items():
            if peak != before.get(dev):
                self.peak_where[dev] = self._where()

    def _where(self) -> str:
        if self._in_opt:
            return "optimizer step"
        parents = [p for p in self._mod_tracker.parents if p != "Global"]
        phase = "backward" if self._mod_tracker.is_bw else "forward"
        if not parents:  # the loss and its backward: where the step code called it
            return f"{phase}, outside the model, from {call_site()}"
        inner = max(parents, key=lambda p: (p.count("."), len(p)))
        return f"{inner.replace('FSDPQwen3VLForConditionalGeneration.', '')} ({phase})"


# FSDPMemTracker's categories folded into the five a report gives; they sum to the peak
CATEGORIES = {"parameters": ("Sharded Param", "Unsharded Param", "Buffer", "All Gather"),
              "gradients": ("Sharded Grad", "Unsharded Grad", "Reduce Scatter"),
              "optimizer": ("OptState",),
              "activations": ("Activation", "Inputs"),
              "temporaries": ("Temp",)}


def split(snapshot: dict[Any, int]) -> dict[str, int]:
    """Bytes by report category from a tracker snapshot of one device (keys: the tracker's reference
    types or their names); ``peak`` is the snapshot's total."""
    named = {getattr(k, "value", k): v for k, v in snapshot.items()}
    out = {cat: sum(named.get(n, 0) for n in names) for cat, names in CATEGORIES.items()}
    known = {n for names in CATEGORIES.values() for n in names} | {"Total"}
    out["temporaries"] += sum(v for k, v in named.items() if k not in known)  # a category a newer torch adds
    out["peak"] = named.get("Total", sum(out.values()))
    return out
