"""Trainer rank 0's rollout engine and the weight push to it, for :class:`paravt.rl.trainer.RLTrainer`.

* :meth:`EngineSync.start` — the engine of ``rollout.engine`` (in-process, or
  servers launched / reached by URL / started by each node's launcher under ``rollout.layout``, SGLang's
  behind ``sglang-router`` and vLLM's behind ``vllm-router`` with ``rollout.router``) with its timeouts and the run's
  :class:`~paravt.engines.weight_update.WeightUpdate` (:func:`run_weight_update`; a broadcast's weight group
  is formed at the first push).
* :meth:`EngineSync.push` — every policy version to the engine; collective (every
  trainer rank gathers its shards), a failure checkpoints and stops the run (exit 3).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

from paravt.core.weight_sync import GatherError
from paravt.engines.factory import EngineHandle, build_engine
from paravt.engines.weight_update import WeightUpdate
from paravt.models import lora, parallel
from paravt.models.loading import resolve_dtype
from paravt.models.parallel import DistInfo
from paravt.models.stage_main import RunAborted
from paravt.rl.config import RLConfig
from paravt.rl.layout import discovered_servers


#: The name a LoRA run's rollout servers load each version's adapter under, and its requests give.
ADAPTER_NAME = "paravt-lora"


def pushes_adapter(cfg: RLConfig) -> bool:
    """A LoRA run pushes the adapter alone (``lora.push=auto``) to servers it launches whose backend loads
    adapters at run time (``EngineBackend.adapters``); every other engine gets the merged weights."""
    r = cfg.rollout
    return (cfg.lora.enabled and cfg.lora.push == "auto" and r.backend().adapters is not None and r.replicas > 0
            and not r.urls and not r.layout)


def run_weight_update(cfg: RLConfig, trainer_on_cuda: bool) -> WeightUpdate:
    """How weights reach the engine after a step: in memory (an in-process engine), the backend's
    transport of ``rollout.weight_sync`` (auto: the first it accepts) with its bucket size and group, or
    a LoRA run's adapter (:func:`pushes_adapter`)."""
    r = cfg.rollout
    b = r.backend()
    if pushes_adapter(cfg):
        return WeightUpdate.adapter()
    transport = b.transports[0] if r.weight_sync == "auto" or "state_dict" in b.transports else r.weight_sync
    if transport == "state_dict":
        return WeightUpdate.in_memory()
    if transport == "disk":
        return WeightUpdate.from_disk()  # each reload bounded by rollout.sync_timeout_s (EngineHandle.load_timeout_s)
    backend = r.sync_backend
    if backend == "auto":  # NCCL needs CUDA on both sides (the CPU vLLM build has none)
        _, settings = r.launch_settings()
        # under a layout the servers take the GPUs of their nodes (the settings' gpus are not read)
        servers_on_gpu = not b.gpus_need_cuda or bool(r.layout or (settings is not None and settings.gpus))
        backend = "nccl" if trainer_on_cuda and servers_on_gpu else "gloo"
    return WeightUpdate.broadcast(backend, r.sync_address, r.bucket_mb, r.sync_timeout_s,
                                  join_timeout_s=r.control_timeout_s)


def prune_weight_dirs(root: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest ``vNNNNNN`` weight exports (8B: 16 GB each in bf16).
    The server has loaded a version once ``update_weights`` returned; rollouts in flight use the
    weights in GPU memory, not the files. Returns the deleted directories."""
    import shutil  # noqa: PLC0415

    dirs = sorted(p for p in Path(root).glob("v[0-9]*") if p.is_dir())
    gone = dirs[: max(0, len(dirs) - max(1, keep))]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


class EngineSync:
    """Trainer rank 0's rollout engine and the way every policy version reaches it. Built on every rank
    (each takes part in a push); ``start`` runs on rank 0 only."""

    def __init__(self, cfg: RLConfig, dist: DistInfo, out: Path, processor: Any, save: Callable[[], Any]):
        """``out``: the run's folder (server logs, ``weights/`` exports); ``save()``: a checkpoint of the
        trainer, written before a failed push ends the run (collective, returns its directory)."""
        self.cfg, self.dist, self.out, self.processor, self.save = cfg, dist, Path(out), processor, save
        self.update = run_weight_update(cfg, dist.device.type == "cuda")
        self.handle: EngineHandle | None = None
        self.push_bytes: dict[str, float] = {}  # LoRA runs: the last push's bytes beside a whole model's

    def start(self, weights: str, version: int) -> EngineHandle:
        """Rank 0: the engine (``rollout.engine``) loaded with ``weights`` (policy ``version``); servers launched
        and healthy."""
        r = self.cfg.rollout
        # a layout: every node's launcher started its own servers; rank 0 launches none and finds them all
        found = discovered_servers() if r.layout else None
        replicas = 0 if found is not None else r.replicas
        # the launch settings also name the served model and its reload method, for servers launched elsewhere too
        _, server = r.launch_settings()
        if server is not None and replicas and not server.log_file:
            server = dataclasses.replace(server, log_file=str(self.out / f"rollout_{r.engine}.log"))
        adapter = None
        if self.update.transport == "adapter":  # servers of the base model that load each version's adapter
            server, weights, adapter = r.backend().adapters(server, self.cfg.lora.rank, self.cfg.lora.vision), \
                self.cfg.model_path, ADAPTER_NAME
        router = None
        if r.router and r.backend().routed:
            from paravt.engines.router import RouterConfig  # noqa: PLC0415

            router = RouterConfig(log_file=str(self.out / "rollout_router.log"))
        self.handle = build_engine(r.engine, weights, self.processor, dtype=r.dtype, seed=self.cfg.seed,
                                   batch_wait_s=r.batch_wait_s, server=server, urls=[*(found or []), *r.urls],
                                   replicas=replicas, log_file=self.out / "rollout_server.log",
                                   weight_version=version, router=router, weight_update=self.update, adapter=adapter,
                                   health_interval_s=r.health_interval_s, health_misses=r.health_misses)
        self.handle.control_timeout_s = r.control_timeout_s
        self.handle.load_timeout_s = r.sync_timeout_s
        self.handle.verify_first_push = r.verify_first_push
        return self.handle

    def push(self, actor: Any, version: int) -> float:
        """The ``actor``'s weights → the engine, tagged ``version``; returns the seconds it took. Collective:
        every rank calls it. ``self.update.transport`` says how:
        * ``state_dict`` (in-process engine): the full state dict, handed over in memory.
        * ``broadcast`` (servers): buckets of parameters gathered one by one from the FSDP2 shards,
          cast to the trainer's dtype and streamed by rank 0 over the weight group
          (:func:`paravt.models.parallel.weight_buckets` → :meth:`EngineHandle.push_weights` →
          :class:`~paravt.engines.weight_push.BroadcastPush` → each server's loader).
        * ``disk`` (servers): an HF export (``weights/vNNNNNN``) each server reloads.

        A push that fails (a server died, rejected the weights, or the transfer stalled past
        ``rollout.sync_timeout_s``) checkpoints and ends the run: :class:`RunAborted`, exit 3."""
        t0 = time.perf_counter()
        mode = self.update.transport
        dtype = resolve_dtype(self.cfg.trainer.dtype)  # bf16 for the 8B: half the bytes of fp32
        err = None
        if mode == "state_dict":
            sd = parallel.full_state_dict(actor)
            if self.dist.is_main:
                self.handle.push_weights(sd, version)
        elif mode == "broadcast":
            buckets = parallel.weight_buckets(actor, dtype, self.update.bucket_bytes, self.dist.is_main)
            try:
                if self.dist.is_main:
                    err = self._try_push(buckets, version)
                buckets.drain()  # the other ranks' gathers of the buckets a failed push did not send
            except GatherError as exc:
                # This rank left the gathers mid-way; the others wait in one nobody will complete, so
                # no collective (not even a checkpoint) can follow. Exit 3 at once: torchrun ends the
                # other ranks, the launcher reports this line, and the newest complete checkpoint
                # resumes the run.
                raise RunAborted(f"rank {self.dist.rank}: the weight push of version {version} failed {exc}; the "
                                 f"trainer ranks' collectives are out of step, so the newest complete checkpoint "
                                 f"(resume=auto) is where the run continues", collectives_broken=True,
                                 consequence=exc.from_peer) from None
        elif mode == "adapter":  # LoRA: the adapter alone, in peft's format, loaded over the served base
            root = self.out / "weights" / "lora"
            pushed = lora.save_adapter(actor, root / f"v{version:06d}", self.dist.is_main, dtype=dtype,
                                       base_model=self.cfg.model_path)
            if self.dist.is_main:
                err = self._try_push(root / f"v{version:06d}", version)
                prune_weight_dirs(root, keep=self.cfg.grpo.max_staleness + 1)
        else:
            path = parallel.export_hf(actor, self.processor, self.out / "weights" / f"v{version:06d}", self.dist,
                                      dtype=dtype)
            if self.dist.is_main:
                err = self._try_push(path, version)
                prune_weight_dirs(self.out / "weights", keep=self.cfg.grpo.max_staleness + 1)
        if mode != "state_dict":
            err = parallel.broadcast_object(err)
            if err is not None:
                done = self.save()
                raise RunAborted(f"the weight push of version {version} to the rollout server(s) failed: "
                                          f"{err}; checkpoint {done} (resume=auto continues from it)")
        if self.cfg.lora.enabled:  # a whole push moves the merged model (the in-process engine: its state dict)
            full = lora.full_bytes(actor, None if mode == "state_dict" else dtype)
            self.push_bytes = {"sync/push_bytes": float(pushed if mode == "adapter" else full),
                               "sync/full_push_bytes": float(full)}
        parallel.barrier()
        return time.perf_counter() - t0

    def stop(self) -> None:
        """Stop the servers rank 0 launched (and leave the weight group)."""
        if self.handle is not None:
            self.handle.stop()

    def _try_push(self, source, version: int) -> str | None:
        try:
            self.handle.push_weights(source, version)
        except GatherError:
            raise
        except Exception as exc:  # noqa: BLE001 - a dead or broken server: stop, never train on
            return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        return None
