"""How a new policy version reaches an engine: one typed object, :class:`WeightUpdate`.

=============  ===================================================================================
transport      what :meth:`paravt.engines.factory.EngineHandle.push_weights` takes, and how it travels
=============  ===================================================================================
``state_dict`` the full state dict, handed over in memory (the in-process engine)
``disk``       a checkpoint directory (an HF export) each server reloads; the servers must see the path
``broadcast``  :class:`~paravt.core.weight_sync.WeightBuckets` streamed over a process group of trainer
               rank 0 and every server worker (:class:`~paravt.engines.weight_push.BroadcastPush`):
               ``bucket_bytes`` per bucket, the group's ``backend`` (nccl | gloo) at ``master_address``
``adapter``    a LoRA adapter directory (peft's format) each server loads at run time over the base it
               serves, under the name its requests give (``lora.enabled`` runs; the servers must see the path)
=============  ===================================================================================

Each engine backend declares the transports it accepts (:class:`paravt.engines.registry.EngineBackend`);
a recipe's choice is checked against them at start-up. The named constructors are the three ways in::

    WeightUpdate.in_memory()
    WeightUpdate.from_disk()
    WeightUpdate.broadcast("nccl", master_address=None, bucket_mb=1024, timeout_s=300, join_timeout_s=30)
    WeightUpdate.adapter()
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

Transport = Literal["state_dict", "disk", "broadcast", "adapter"]
TRANSPORTS: tuple[str, ...] = get_args(Transport)
GroupBackend = Literal["nccl", "gloo"]


@dataclass(frozen=True)
class WeightUpdate:
    transport: Transport
    bucket_bytes: int = 1 << 30  # broadcast: bytes per bucket (rank 0's extra memory: one bucket + one parameter)
    backend: GroupBackend = "gloo"  # broadcast: the weight group's backend
    master_address: str | None = None  # broadcast: where servers reach trainer rank 0 (None: paravt.engines.weight_addr)
    # broadcast: one transfer (a disk reload is bounded by the handle's load_timeout_s, rollout.sync_timeout_s)
    timeout_s: float = 300.0
    join_timeout_s: float = 30.0  # broadcast: the group's formation

    def __post_init__(self):
        if self.transport not in TRANSPORTS:
            raise ValueError(f"weight update transport must be one of {' | '.join(TRANSPORTS)}, got {self.transport!r}")
        if self.backend not in get_args(GroupBackend):
            raise ValueError(f"weight group backend must be nccl | gloo, got {self.backend!r}")
        if self.bucket_bytes < 1 or self.timeout_s <= 0 or self.join_timeout_s <= 0:
            raise ValueError("a weight update needs bucket_bytes >= 1, timeout_s > 0 and join_timeout_s > 0")

    @classmethod
    def in_memory(cls) -> "WeightUpdate":
        return cls("state_dict")

    @classmethod
    def from_disk(cls) -> "WeightUpdate":
        return cls("disk")

    @classmethod
    def adapter(cls) -> "WeightUpdate":
        return cls("adapter")

    @classmethod
    def broadcast(cls, backend: GroupBackend, master_address: str | None = None, bucket_mb: int = 1024,
                  timeout_s: float = 300.0, join_timeout_s: float = 30.0) -> "WeightUpdate":
        return cls("broadcast", bucket_bytes=bucket_mb << 20, backend=backend, master_address=master_address,
                   timeout_s=timeout_s, join_timeout_s=join_timeout_s)

    def check_payload(self, weights: Any) -> None:
        """The weights a push of this transport carries: a state dict, a directory, or buckets. Anything else
        is a caller's mistake, said in one line before anything is sent."""
        from paravt.core.weight_sync import WeightBuckets  # noqa: PLC0415

        want = {"state_dict": Mapping, "disk": (str, Path), "broadcast": WeightBuckets, "adapter": (str, Path)}[self.transport]
        if not isinstance(weights, want):
            names = {"state_dict": "a state dict", "disk": "a checkpoint directory", "broadcast": "WeightBuckets",
                     "adapter": "an adapter directory"}
            raise TypeError(f"a {self.transport} weight update carries {names[self.transport]}, got "
                            f"{type(weights).__name__}")
