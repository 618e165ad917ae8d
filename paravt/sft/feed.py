"""The SFT trainer's batches, step by step: prepared on the training thread, or one step ahead on a
background thread (``prefetch``), and moved to the device.

Preparing a step (frames decoded from the videos, the processor's image tensors, tokens, packs,
collation) is host work; on a GPU it would leave the device idle between steps. With ``prefetch`` one
thread prepares step N+1 while step N trains (never more than one step ahead) and is then the only user
of the stream: the same bins in the same order as without it. Each prepared step carries the stream state
and skip counts *after* it, which is what a checkpoint saves while the thread may be a step ahead, and
:meth:`StepFeed.close` rewinds the stream to the last step handed out. On CUDA the tensors are pinned, so
the copy to the device (``non_blocking``) is a DMA that does not hold up the host; under bf16 mixed
precision the pixels are cast on the host first (the patch embedding casts them to that dtype anyway: half
the bytes, the same values). On CPU a thread gives no speed-up (it shares the GIL with training:
measured), so the trainer's default is on with CUDA only.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from paravt.sft.data import Example, PackedStream, StreamState


@dataclass
class PreparedStep:
    step: int
    micro: list[list[Example]]  # this rank's micro-batches of the step
    batches: list[dict[str, torch.Tensor]]  # the same, collated (host tensors)
    # this rank's next pack, collated, when the step needs zero-weight passes and the rank has trained none yet
    peek: dict[str, torch.Tensor] | None
    state: StreamState  # the stream after this step (what a checkpoint saved after it keeps)
    skipped: Counter  # rows skipped so far, by reason, after this step


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """``batch`` on ``device``; from pinned host memory the copies are asynchronous (ordered on the stream)."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


class StepFeed:
    """``get(step)`` → :class:`PreparedStep`, steps asked for in order from the stream's current state.

    ``sizes(step)``: this rank's micro-batch sizes that step; ``passes``: the passes every rank runs a step
    (fewer micro-batches: zero-weight passes over a pack of this rank, see the trainer); ``pin``: pin the host
    tensors (CUDA); ``pixel_dtype``: the dtype the pixels are cast to on the host (None: kept)."""

    def __init__(self, stream: PackedStream, builder, collate: Callable, sizes: Callable[[int], list[int]],
                 passes: int, prefetch: bool, pin: bool = False, pixel_dtype: torch.dtype | None = None,
                 last_step: int | None = None):
        self.stream, self.builder, self.collate, self.sizes = stream, builder, collate, sizes
        self.passes, self.prefetch, self.pin, self.pixel_dtype = passes, prefetch, pin, pixel_dtype
        self.last_step = last_step  # the thread prepares no step at or after this one
        self._given: tuple[StreamState, Counter] | None = None  # after the last step handed out
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue = queue.Queue()
        self._slot = threading.Semaphore(1)
        self._stop = threading.Event()

    # ------------------------------------------------------------------ what a checkpoint keeps
    @property
    def state(self) -> StreamState:
        """The stream after the last step handed out (the stream's own state before the first)."""
        return StreamState(**(self._given[0] if self._given else self.stream.state).to_dict())

    @property
    def skipped(self) -> Counter:
        return Counter(self._given[1] if self._given else self.builder.skipped)

    # ------------------------------------------------------------------ preparation
    def _host(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for k, v in batch.items():
            if k == "pixel_values" and self.pixel_dtype is not None:
                v = v.to(self.pixel_dtype)
            out[k] = v.pin_memory() if self.pin else v
        return out

    def _prepare(self, step: int, trained: bool) -> PreparedStep:
        micro = self.stream.step_batches(self.sizes(step))
        batches = [self._host(self.collate(m)) for m in micro]
        peek = None
        if self.passes > len(batches) and not (trained or batches):  # a look at the next pack, the stream put back
            state, skipped = StreamState(**self.stream.state.to_dict()), Counter(self.builder.skipped)
            peek = self._host(self.collate(self.stream.next_batch()))
            self.stream.state, self.builder.skipped = state, skipped
        return PreparedStep(step, micro, batches, peek, StreamState(**self.stream.state.to_dict()),
                            Counter(self.builder.skipped))

    def _run(self, first: int, trained: bool) -> None:
        step = first
        while self.last_step is None or step < self.last_step:
            while not self._slot.acquire(timeout=0.1):  # the previous step handed out: one step ahead at most
                if self._stop.is_set():
                    return
            if self._stop.is_set():
                return
            try:
                item = self._prepare(step, trained)
                trained = trained or bool(item.batches) or item.peek is not None
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread, raised there
                self._queue.put(exc)
                return
            self._queue.put(item)
            step += 1

    def get(self, step: int, trained: bool) -> PreparedStep:
        """Step ``step``'s batches. ``trained``: this rank has a pack for zero-weight passes already."""
        if not self.prefetch or (self.last_step is not None and step >= self.last_step):
            self.close()
            item = self._prepare(step, trained)
        else:
            if self._thread is None:
                if self._given is None:  # what close() rewinds to if no step is handed out
                    self._given = (StreamState(**self.stream.state.to_dict()), Counter(self.builder.skipped))
                self._stop.clear()
                self._slot = threading.Semaphore(1)
                self._queue = queue.Queue()
                self._thread = threading.Thread(target=self._run, args=(step, trained), name="sft-prefetch",
                                                daemon=True)
                self._thread.start()
            item = self._queue.get()
            self._slot.release()  # the thread may prepare the next step while this one trains
            if isinstance(item, BaseException):
                self.close()
                raise item
            if item.step != step:
                self.close()
                raise RuntimeError(f"prefetched step {item.step} but step {step} was asked for")
        self._given = (item.state, item.skipped)
        return item

    def reset(self) -> None:
        """Forget the steps handed out (the stream's state is set anew: a resumed run)."""
        self.close()
        self._given = None

    def __enter__(self) -> StepFeed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the thread (after the step it is preparing) and rewind the stream to the last step handed out."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self._given is not None:
            self.stream.state = StreamState(**self._given[0].to_dict())
            self.builder.skipped = Counter(self._given[1])
