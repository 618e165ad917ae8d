"""Trainer rank 0's side of the ``broadcast`` weight sync: one push, server by server and bucket by
bucket. (The transport itself, the group layout and the bucket format: :mod:`paravt.core.weight_sync`.)

One push of version ``v`` to every server of a run, top to bottom (:meth:`BroadcastPush.push`)::

    first push only: each server's worker count → the group (rank 0 here, the workers after it)
    every server:    begin_broadcast(plan, v)      vLLM: pause + one "receive every bucket" request
                                                   SGLang: pause_generation
    every bucket:    its request to every server   SGLang: /update_weights_from_distributed
                     broadcast(flat bytes)         one collective, bounded by the timeout
    every server:    end_broadcast(v)              version, cache flush, resume

A server that dies, rejects a bucket or stalls ends the push with an :class:`EngineError` within
``timeout_s`` (the broadcast's own timeout, or the server's failed request seen while the bytes
are in flight); the trainer then checkpoints and exits 3. The server clients are the engines'
own (:class:`~paravt.engines.vllm.VLLMEngine`, :class:`~paravt.engines.sglang.SGLangEngine`). The
group's address (never loopback while a server is on another host): :mod:`paravt.engines.weight_addr`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any, Sequence

from paravt.engines.base import EngineError
from paravt.engines.weight_addr import weight_group_address
from paravt.core.weight_sync import GROUP_NAME, WeightBuckets, broadcast, destroy_weight_group, init_weight_group

log = logging.getLogger(__name__)


class BroadcastPush:
    """The weight-update group of one run and the pushes over it (rank 0 of the trainers only)."""

    _count = 0

    def __init__(self, backend: str, master_address: str | None, timeout_s: float, group_name: str | None = None,
                 join_timeout_s: float | None = None):
        """``timeout_s`` bounds each transfer; ``join_timeout_s`` (default ``timeout_s``) the group's
        formation: a server that never joins fails the first push within it, naming the address."""
        self.backend, self.master_address, self.timeout_s = backend, master_address, timeout_s
        self.join_timeout_s = join_timeout_s if join_timeout_s is not None else timeout_s
        # A group name is registered once per process (torch refuses a second group of that name, also in
        # a server that joined an earlier run's group): one name per trainer process and group.
        BroadcastPush._count += 1
        self.group_name = group_name or f"{GROUP_NAME}_{os.getpid()}_{BroadcastPush._count}"
        self.group = None
        self._base_name = self.group_name
        self.members: list[str] = []  # the servers the group was formed with
        self._left: list[Any] = []  # groups left behind by an evicted server (never destroyed: a peer is gone)

    # ------------------------------------------------------------------ group
    async def _connect(self, clients: list[Any], urls: list[str]) -> None:
        from paravt.models.parallel import free_port  # noqa: PLC0415

        workers = await asyncio.gather(*(c.weight_workers() for c in clients))
        world = 1 + sum(workers)
        addr = weight_group_address(urls, self.master_address)  # never loopback with a server elsewhere
        port = free_port()
        offsets = [1 + sum(workers[:i]) for i in range(len(clients))]
        self.members = list(urls)
        log.info("weight group %s: %d ranks (trainer + %s workers) at %s:%d over %s", self.group_name, world,
                 "+".join(map(str, workers)), addr, port, self.backend)
        joins = [asyncio.ensure_future(c.init_weight_group(addr, port, off, world, self.group_name, self.backend,
                                                           self.timeout_s, self.join_timeout_s))
                 for c, off in zip(clients, offsets)]
        mine = _in_thread(lambda: init_weight_group(addr, port, 0, world, self.group_name, self.backend,
                                                    self.timeout_s, self.join_timeout_s))
        try:
            self.group = await _first_error(mine, joins, f"joining the weight group at {addr}:{port}")
            await asyncio.gather(*joins)
        finally:
            for j in joins:
                j.cancel()
            await asyncio.gather(*joins, return_exceptions=True)

    # ------------------------------------------------------------------ one push
    async def push(self, clients: list[Any], urls: list[str], buckets: WeightBuckets, version: int) -> None:
        """Stream ``buckets`` to every server and tag them ``version``. The bucket iterator is not
        drained here on failure: the caller drains it (the other trainer ranks' gathers)."""
        if self.group is not None and list(urls) != self.members:
            # a server was evicted (dead): the live ones form a new group; the old one, with a peer gone,
            # is kept referenced rather than destroyed (its destructor could wait on that peer)
            log.warning("weight group %s: re-formed with %d live server(s) (was %d)", self.group_name, len(urls),
                        len(self.members))
            self._left.append(self.group)
            self.group = None
            self.group_name = f"{self._base_name}_r{len(self._left)}"  # torch registers a name once
        if self.group is None:
            await self._connect(clients, urls)
        plan = buckets.plan
        begun: list[Any] = []
        ok = False
        nxt = None
        try:
            # every server paused together: none keeps generating on the old version while another waits
            begins = await asyncio.gather(*(c.begin_broadcast(plan, version, self.group_name) for c in clients),
                                          return_exceptions=True)
            begun = [c for c, b in zip(clients, begins) if not isinstance(b, BaseException)]
            for b in begins:
                if isinstance(b, BaseException):
                    raise b
            it = iter(buckets)
            nxt = _in_thread(_prefetch(it))  # bucket 0: gathered and packed off the event loop
            for i in range(len(plan)):
                flat = await nxt
                # the next bucket's gathers and packing overlap this bucket's transfer (a second buffer)
                nxt = _in_thread(_prefetch(it)) if i + 1 < len(plan) else None
                requests = [f for f in (c.bucket_request(i) for c in clients) if f is not None]
                watch = requests + [c.receiving for c in clients if c.receiving is not None]
                send = _in_thread(lambda f=flat: broadcast(self.group, f.cpu() if self.backend == "gloo" else f,
                                                           self.timeout_s))
                await _first_error(send, watch, f"bucket {i + 1}/{len(plan)} of version {version}")
                del flat
                await asyncio.gather(*requests)
            ok = True
        finally:
            if nxt is not None:  # a gather in flight is a collective the other ranks are in: let it end
                await asyncio.gather(nxt, return_exceptions=True)
            ends = await asyncio.gather(*(c.end_broadcast(version, ok) for c in begun), return_exceptions=True)
        errors = [e for e in ends if isinstance(e, BaseException)]
        if errors:
            raise errors[0]

    def close(self) -> None:
        if self.group is not None:
            destroy_weight_group(self.group)
            self.group = None


def _prefetch(it):
    """The next bucket of ``it``, made in a worker thread: on a GPU on the calling thread's device and
    on a side stream, synchronised before it is handed over, so the gathers of bucket ``i + 1`` queue
    behind neither the transfer of bucket ``i`` nor the default stream."""
    import torch  # noqa: PLC0415

    device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def make():
        if device is None:
            return next(it)
        torch.cuda.set_device(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.default_stream(device))
        with torch.cuda.stream(side):
            flat = next(it)
        side.synchronize()
        return flat

    return make


def _in_thread(fn) -> asyncio.Future:
    """``fn()`` in a daemon thread (a collective stuck on a dead peer must never hold up the
    interpreter's exit), as a future of the running loop."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def settle(setter, value) -> None:
        try:
            loop.call_soon_threadsafe(lambda: fut.done() or setter(value))
        except RuntimeError:  # the push already ended (its loop is closed): nobody waits for this
            pass

    def run() -> None:
        try:
            res = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
            settle(fut.set_exception, exc)
        else:
            settle(fut.set_result, res)

    threading.Thread(target=run, name="paravt-weight-broadcast", daemon=True).start()
    return fut


async def _first_error(main: asyncio.Future, others: list[asyncio.Future], what: str) -> Any:
    """``main``'s result, unless one of ``others`` (the servers' requests) fails first: then that
    error, naming ``what``, without waiting for ``main`` (a collective whose peer is gone)."""
    # if a server's request fails first, main (a collective) may still fail later: nobody awaits it then
    main.add_done_callback(lambda f: f.cancelled() or f.exception())
    pending = {main, *others}
    while not main.done():
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for f in done:
            if f is not main and not f.cancelled() and f.exception() is not None:
                raise EngineError(f"{what}: {f.exception()}") from None
    try:
        return main.result()
    except EngineError:
        raise
    except Exception as exc:  # noqa: BLE001 - a gloo/NCCL error: one line
        raise EngineError(f"{what}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None
