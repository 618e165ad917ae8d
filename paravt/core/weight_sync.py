"""Weights in memory, trainer → rollout servers: the ``broadcast`` transport.

One process group joins trainer rank 0 (group rank 0) and every worker of every rollout server
(ranks ``1 …``): NCCL on GPUs, gloo on CPU. Each push streams the policy in **buckets**: a bucket
is a list of tensors (name, dtype, shape) laid out back to back as raw bytes in one ``uint8``
tensor (SGLang's ``flattened_bucket`` layout, which our vLLM worker extension reads too), sent
with one ``broadcast`` from rank 0. Rank 0 materialises one bucket at a time (the FSDP2 shards
gathered parameter by parameter), so no whole-model copy is ever held.

Group layout, for ``S`` servers with ``w_s`` workers each (``w_s`` = tensor-parallel size)::

    rank 0                       trainer rank 0 (the sender)
    1 … w_1                      server 1's workers      (rank_offset 1)
    w_1+1 … w_1+w_2              server 2's workers      (rank_offset 1 + w_1)
    …                            world size 1 + Σ w_s

Every worker of every server receives every bucket of every version. The rendezvous is a TCP store
served by rank 0 at ``master_address:master_port`` (the other ranks are its clients) and the group is built exactly as SGLang's
``/init_weights_update_group`` builds its side (a ``PrefixStore(group_name, …)`` over the
rendezvous store, then torch's own group constructor), so the same :func:`init_weight_group` serves
the trainer, our vLLM worker extension and an SGLang server.

This module imports only torch: it runs in the trainer's environment and inside vLLM's workers.
"""

from __future__ import annotations

import atexit
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterable, Iterator, Sequence

import torch

GROUP_NAME = "paravt_weights"


@dataclass(frozen=True)
class TensorMeta:
    """One tensor of a bucket: its checkpoint name, dtype name (``"bfloat16"``) and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n * getattr(torch, self.dtype).itemsize

    def to_json(self) -> list:
        return [self.name, self.dtype, list(self.shape)]

    @classmethod
    def from_json(cls, x: Sequence) -> "TensorMeta":
        return cls(str(x[0]), str(x[1]), tuple(int(d) for d in x[2]))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def plan_buckets(metas: Iterable[TensorMeta], bucket_bytes: int) -> list[list[TensorMeta]]:
    """Consecutive tensors grouped into buckets of at most ``bucket_bytes`` (a tensor larger than
    that is a bucket of its own); a bucket holds one dtype, so every tensor starts at a multiple of
    its element size (SGLang refuses unaligned ones). Order is kept: it is the order of the gathers
    on every rank."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket size must be >= 1 byte, got {bucket_bytes}")
    out: list[list[TensorMeta]] = []
    cur: list[TensorMeta] = []
    size = 0
    for m in metas:
        if cur and (size + m.nbytes > bucket_bytes or m.dtype != cur[0].dtype):
            out.append(cur)
            cur, size = [], 0
        cur.append(m)
        size += m.nbytes
    if cur:
        out.append(cur)
    return out


def flatten(tensors: Sequence[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
    """The bucket's bytes: each tensor's contiguous bytes back to back (one ``uint8`` tensor), on the
    tensors' device; written into ``out`` (a preallocated ``uint8`` buffer of exactly that many bytes)
    when given. On CPU the copy is numpy's single-threaded memcpy: torch's parallel copy stalls
    when a rollout server's OpenMP threads spin on the same cores (measured on 2 cores beside a vLLM
    CPU server: 190 ms for a 5 MB bucket, against 2 ms alone or with one thread)."""
    parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    if parts and all(p.device.type == "cpu" for p in parts) and (out is None or out.device.type == "cpu"):
        import numpy as np  # noqa: PLC0415

        if out is None:
            return torch.from_numpy(np.concatenate([p.numpy() for p in parts]))
        np.concatenate([p.numpy() for p in parts], out=out.numpy())
        return out
    return torch.cat(parts) if out is None else torch.cat(parts, out=out)


def unflatten(flat: torch.Tensor, metas: Sequence[TensorMeta]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) views into ``flat`` (no copy), in bucket order."""
    total = sum(m.nbytes for m in metas)
    if total != flat.numel():
        raise ValueError(f"bucket holds {flat.numel()} bytes, its tensors {total}")
    off = 0
    for m in metas:
        n = m.nbytes
        yield m.name, flat[off:off + n].view(getattr(torch, m.dtype)).view(m.shape)
        off += n


def init_weight_group(master_address: str, master_port: int, rank: int, world_size: int,
                      group_name: str = GROUP_NAME, backend: str = "gloo", timeout_s: float = 300.0,
                      join_timeout_s: float | None = None):
    """Join the weight-update group (blocks until all ``world_size`` ranks joined). Returns the
    process group; its collectives time out after ``timeout_s``.

    Rank 0 serves the group's own TCP store at ``master_address:master_port``; every other rank is a
    client of it. The store is built here, not by torch's ``tcp://`` rendezvous: under torchrun
    (``TORCHELASTIC_USE_AGENT_STORE=True`` in every worker) that rendezvous makes rank 0 a client too,
    and nobody serves the store. The join (store connection and every rank's arrival) is bounded by
    ``join_timeout_s`` (default ``timeout_s``) and fails with a :class:`TimeoutError` naming the
    address. Works in a process that already has a default group (the trainer, a server's
    tensor-parallel workers): this group is separate from it. Returns a :class:`WeightGroup`."""
    import torch.distributed as dist  # noqa: PLC0415
    from torch.distributed import distributed_c10d as c10d  # noqa: PLC0415

    where = f"{master_address}:{int(master_port)}"
    join = timedelta(seconds=join_timeout_s if join_timeout_s is not None else timeout_s)
    try:
        # Every rank counts itself in (SGLang's rendezvous clients do the same) and rank 0 waits for
        # all of them: the join's one bounded wait.
        store = dist.TCPStore(master_address, int(master_port), world_size, is_master=(rank == 0), timeout=join,
                              wait_for_workers=True)
        store = c10d.PrefixStore(group_name, store)
        # The same constructor SGLang's init_custom_process_group calls (its group keys live in the
        # store), so a group built here and one built by an SGLang server meet.
        pg, _ = c10d._new_process_group_helper(world_size, rank, [], c10d.Backend(backend), store,
                                               group_name=group_name, timeout=join)
    except (RuntimeError, TimeoutError) as exc:  # torch's DistStoreError/DistNetworkError are RuntimeErrors
        raise TimeoutError(f"weight group {group_name!r} at {where}: rank {rank} of {world_size} could not join "
                           f"within {join.total_seconds():g} s ({' '.join(str(exc).split())[:200]})") from None
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    _set_pg_timeout(pg, timedelta(seconds=timeout_s))
    return WeightGroup(pg, group_name)


def _set_pg_timeout(pg, timeout: timedelta) -> None:
    """Collectives after the join get ``timeout`` (the join may have had a shorter one)."""
    if hasattr(pg, "set_timeout"):  # torch >= 2.6
        pg.set_timeout(timeout)


#: Every WeightGroup not yet closed (closed by the atexit hook below).
_OPEN: "weakref.WeakSet[WeightGroup]" = weakref.WeakSet()


class WeightGroup:
    """A joined weight-update group: the only long-lived reference to torch's process group.

    :meth:`close` (also run for every group still open when the interpreter exits, by ``atexit``)
    destroys the group and drops that reference while Python still runs, so torch's destructor joins
    gloo's worker threads then. Left to interpreter shutdown, a worker thread that releases the last
    reference to a sent tensor needs the GIL while Python finalises, and the process aborts
    ("terminate called without an active exception", exit -6) after its work is done: a trainer that
    completed would exit as failed. A group with a transfer still running or one that failed (a
    peer gone, a timeout) is never destroyed: its destructor would wait for that transfer."""

    def __init__(self, pg, name: str):
        self.pg = pg
        self.name = name
        self._in_flight = 0
        self._failed = False
        _OPEN.add(self)

    def broadcast(self, tensor: torch.Tensor, timeout_s: float) -> None:
        import torch.distributed as dist  # noqa: PLC0415

        if self.pg is None:
            raise RuntimeError(f"weight group {self.name!r} is closed")
        if tensor.is_cuda:  # the calling thread may not be the one that chose this rank's GPU
            torch.cuda.set_device(tensor.device)
        self._in_flight += 1
        try:
            work = dist.broadcast(tensor, src=0, group=self.pg, async_op=True)
            work.wait(timeout=timedelta(seconds=timeout_s))
        except BaseException:
            self._failed = True
            raise
        finally:
            self._in_flight -= 1

    def close(self) -> None:
        """Leave the group. Idempotent."""
        import torch.distributed as dist  # noqa: PLC0415

        pg, self.pg = self.pg, None
        _OPEN.discard(self)
        if pg is None:
            return
        try:
            dist.destroy_process_group(pg)
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass
        if self._in_flight or self._failed:
            # never destroyed (see the class docstring): one reference nobody releases, which a list
            # would not give (interpreter shutdown clears module globals)
            import ctypes  # noqa: PLC0415

            ctypes.pythonapi.Py_IncRef(ctypes.py_object(pg))
        del pg  # the last reference: torch's destructor joins the group's threads here

    def __repr__(self) -> str:
        return f"WeightGroup({self.name!r}, {'closed' if self.pg is None else 'open'})"


@atexit.register
def _close_open_groups() -> None:
    for g in list(_OPEN):
        g.close()


def broadcast(group: WeightGroup, tensor: torch.Tensor, timeout_s: float) -> None:
    """Broadcast ``tensor`` from group rank 0 to every rank of ``group``; raises (never hangs) when a
    peer is gone or the transfer stalls past ``timeout_s``."""
    group.broadcast(tensor, timeout_s)


def destroy_weight_group(group: WeightGroup) -> None:
    group.close()


class GatherError(RuntimeError):
    """A bucket's gathers (collectives of every trainer rank) failed on this rank: the ranks' collectives
    are out of step from here on, so nothing collective (a drain, a checkpoint) may follow.
    ``from_peer``: the failure is another rank's (its connection closed mid-collective), not this one's."""

    def __init__(self, message: str, from_peer: bool = False):
        super().__init__(message)
        self.from_peer = from_peer


#: How a collective reports that another rank went away (gloo's TCP transport, NCCL's abort).
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote worker", "communicator was aborted")


class WeightBuckets:
    """One version of the policy as buckets: ``plan`` (known on every rank before any transfer; sent
    to the servers so they can allocate) and iteration that yields each bucket's flat bytes on the
    sending rank (``None`` on the others).

    ``gather(i)`` runs bucket ``i``'s gathers (collectives on every rank: FSDP2's ``full_tensor``) and
    returns its tensors on the sender (``None`` elsewhere); ``pack`` lays them out (:func:`flatten`).
    A bucket counts as done once gathered, before it is packed or sent, so when packing or sending
    fails on the sender (an out-of-memory in ``flatten``, a dead server), :meth:`drain` runs exactly
    the gathers the other ranks still wait in: every rank must iterate or drain to the end.

    On the sender, buckets are packed into ``buffers`` preallocated byte buffers used in turn (each the
    plan's largest bucket, allocated once per push on the tensors' device; 0: a fresh tensor per
    bucket): bucket ``i``'s bytes stay valid until bucket ``i + buffers`` is packed, which is what lets
    the push gather and pack the next bucket while the current one is on the wire
    (:class:`~paravt.engines.weight_push.BroadcastPush`)."""

    def __init__(self, plan: list[list[TensorMeta]], gather, pack=flatten, buffers: int = 2):
        self.plan = plan
        self._gather = gather
        self._pack = pack
        self._next = 0
        self.buffers = buffers
        self._bufs: list[torch.Tensor] = []

    def __iter__(self) -> Iterator[torch.Tensor | None]:
        while self._next < len(self.plan):
            i = self._next
            tensors = self._run_gather(i)
            yield None if tensors is None else self._pack(tensors, **self._out(i, tensors))

    def _run_gather(self, i: int):
        self._next = i + 1  # done once started: a failed gather is never rerun (see GatherError)
        try:
            return self._gather(i)
        except Exception as exc:  # noqa: BLE001 - named, with its bucket, for the trainer's abort line
            raise GatherError(f"gathering bucket {i + 1}/{len(self.plan)}: {type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:300]}",
                              from_peer=any(m in str(exc) for m in PEER_GONE)) from exc

    def _out(self, i: int, tensors: Sequence[torch.Tensor]) -> dict:
        if not self.buffers or not tensors:
            return {}
        if not self._bufs:
            size = max(sum(m.nbytes for m in b) for b in self.plan)
            self._bufs = [torch.empty(size, dtype=torch.uint8, device=tensors[0].device) for _ in range(self.buffers)]
        return {"out": self._bufs[i % self.buffers][:sum(m.nbytes for m in self.plan[i])]}

    def drain(self) -> None:
        """Run the remaining gathers without packing or sending (keeps every rank's collectives in step)."""
        while self._next < len(self.plan):
            self._run_gather(self._next)

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for b in self.plan for m in b)
