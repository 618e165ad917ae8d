"""Distributed training plumbing shared by the SFT and RL trainers.

* :func:`init_distributed`: torchrun's env (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``) or a
  single-process group, NCCL on CUDA and gloo on CPU, so one code path serves both.
* :func:`wrap_fsdp2`: ``fully_shard`` per group of :func:`paravt.models.fsdp_groups.shard_groups` (each
  decoder layer and vision block, the embeddings, the lm_head, the vision embeddings and mergers), then the
  root; bf16 compute with fp32 master weights when asked. One rank in fp32 trains the plain module. Over
  several ranks a forward without images still runs the vision tower (:mod:`paravt.models.vision_join`).
* :func:`save_resumable` / :func:`load_resumable`: model + optimizer through
  ``torch.distributed.checkpoint`` (sharded, any world size), plus a JSON of trainer state.
* :func:`export_hf`: the parameters gathered one by one to rank 0 (cast to the export dtype on the
  device) and written with ``save_pretrained`` (+ the processor), a directory the next stage loads.
* :func:`weight_buckets`: the same gathers packed into buckets for the ``broadcast`` weight sync.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from paravt.models import lora, vision_join
from paravt.models.fsdp_groups import shard_groups
from paravt.models.stage_main import RunAborted  # noqa: F401 - raised here, re-exported for callers

log = logging.getLogger(__name__)
COMPLETE = "COMPLETE"


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(timeout_s: int = 1800) -> DistInfo:
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a torchrun worker: end with the agent (kill -9 of the launcher too)
        from paravt.core.procs import die_with_parent  # noqa: PLC0415
        die_with_parent()
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank = int(os.environ.get("RANK", 0))
        world = int(os.environ.get("WORLD_SIZE", 1))
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        # NCCL is told this rank's GPU (else it guesses from the global rank and warns of a possible hang)
        kw = {"device_id": torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))} if backend == "nccl" else {}
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kw)
        else:  # a plain `python -m ...` run: a group of one
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                    timeout=timedelta(seconds=timeout_s), **kw)
    local = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    return DistInfo(rank, world, local, device)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(x: float | int | torch.Tensor) -> float:
    t = torch.as_tensor(x, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t)
    return float(t.item())


def all_reduce_sum_tensor(t: torch.Tensor) -> torch.Tensor:
    """Element-wise sum of a float64 vector over the ranks (one collective), returned on the CPU."""
    t = t.to(torch.float64).clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t)
    return t.cpu()


def all_reduce_max(x: float | int | torch.Tensor) -> float:
    t = torch.as_tensor(x, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def announce(key: str, error: str | None = None) -> None:
    """Rank 0 tells the others that a long step of its own (a rollout server's start) ended, and how."""
    if dist.is_initialized() and dist.get_world_size() > 1 and dist.get_rank() == 0:
        from torch.distributed import distributed_c10d as c10d  # noqa: PLC0415

        c10d._get_default_store().set(f"paravt/{key}", error or "ok")


def await_rank0(key: str, timeout_s: float) -> None:
    """The other ranks wait for :func:`announce` through the group's store, for as long as rank 0 may
    legitimately take (``timeout_s``, beyond the collectives' own timeout) instead of sitting in a
    collective until NCCL's watchdog kills them. Rank 0's error ends them with the same one line."""
    if not (dist.is_initialized() and dist.get_world_size() > 1) or dist.get_rank() == 0:
        return
    from torch.distributed import distributed_c10d as c10d  # noqa: PLC0415

    store = c10d._get_default_store()
    try:
        store.wait([f"paravt/{key}"], timedelta(seconds=timeout_s))
    except Exception:  # noqa: BLE001 - the store's timeout
        raise RunAborted(f"rank 0 did not finish {key} within {timeout_s:.0f} s") from None
    msg = store.get(f"paravt/{key}").decode()
    if msg != "ok":
        raise RunAborted(f"rank 0 failed {key}: {msg}")


def broadcast_object(obj: Any, src: int = 0) -> Any:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def wrap_fsdp2(model, dist_info: DistInfo, compute_dtype: torch.dtype | None = None,
               reshard_after_forward: bool = True, shard_one_rank: bool = False):
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: PLC0415

    mixed = compute_dtype is not None and compute_dtype != torch.float32
    if dist_info.world_size == 1 and not mixed and not shard_one_rank:
        # A group of one in fp32 (the embedded CPU default): nothing to shard and nothing to cast, so
        # fully_shard would only add DTensor hooks around every layer. The plain module gives the same
        # gradients and losses (bitwise, tested) in 5-10% less time per SFT step on 2 CPU cores.
        log.info("FSDP2 over one rank in fp32: training the plain module (same gradients, no sharding hooks)")
        return model
    mesh = init_device_mesh(dist_info.device.type, (dist_info.world_size,))
    kw: dict[str, Any] = {"mesh": mesh}
    if mixed:
        # No cast of the modules' inputs: each group computes in ``compute_dtype`` on the hidden states the
        # groups before it produced in that dtype (the patch embedding casts the pixels itself), while the
        # rotary (cos, sin) the vision tower computes in fp32 reach every block in fp32, as in transformers
        # and the inference engines (a cast to bf16 would round the angles of every block's rotary).
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32,
                                               cast_forward_inputs=False)
    for group in shard_groups(model):
        fully_shard(group, reshard_after_forward=reshard_after_forward, **kw)
    # The root without reshard_after_forward: torch's default keeps it gathered from forward to backward,
    # which begins with it (freeing it after forward would gather it again at once).
    fully_shard(model, **kw)
    if dist_info.world_size > 1:
        vision_join.install(model)  # every rank enters the vision tower's collectives, images or not
    return model


def load_fsdp2(path: str | Path, dist_info: DistInfo, *, dtype: str = "float32", attn_implementation: str | None = None,
               compute_dtype: torch.dtype | None = None, reshard_after_forward: bool = True, prepare=None,
               sharded: bool = True):
    """The model at ``path`` wrapped with :func:`wrap_fsdp2` on every rank, loaded **sharded**: each
    rank builds it on the meta device and shards it; rank 0 alone reads the checkpoint (one copy in
    host memory), and each parameter is broadcast from it with every rank keeping only its shard
    (``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)``). A rank's peak is its
    shards plus one parameter, not the whole model (8B fp32: ~35 GB per rank before). Buffers outside
    the state dict (rotary frequencies) come from rank 0 too. ``prepare(model)`` runs before
    sharding (gradient checkpointing, config flags). One rank, or ``sharded=False``: the model is
    loaded whole on each rank and wrapped (the same weights, bitwise)."""
    from paravt.models import vision_attention  # noqa: PLC0415
    from paravt.models.loading import load_model, resolve_dtype  # noqa: PLC0415

    if dist_info.world_size == 1 or not sharded:
        model = load_model(path, dtype=dtype, attn_implementation=attn_implementation)
        if prepare is not None:
            prepare(model)
        model.to(dist_info.device)
        return wrap_fsdp2(model, dist_info, compute_dtype, reshard_after_forward)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict  # noqa: PLC0415
    from transformers import AutoConfig, AutoModelForImageTextToText  # noqa: PLC0415

    full = load_model(path, dtype=dtype, attn_implementation=attn_implementation) if dist_info.is_main else None
    if full is not None and prepare is not None:
        prepare(full)  # the same parameters as the sharded model's (LoRA adapters: their start values come from here)
    config = full.config if full is not None else AutoConfig.from_pretrained(str(path))
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config, dtype=resolve_dtype(dtype),
                                                        attn_implementation=full.config._attn_implementation
                                                        if full is not None else attn_implementation)
    vision_attention.install(model)
    if prepare is not None:
        prepare(model)
    wrap_fsdp2(model, dist_info, compute_dtype, reshard_after_forward)
    model.to_empty(device=dist_info.device)
    sd = full.state_dict() if full is not None else {}
    set_model_state_dict(model, sd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    src_buffers = dict(full.named_buffers()) if full is not None else {}
    del sd, full
    with torch.no_grad():
        for name, buf in model.named_buffers():
            t = src_buffers[name].to(dist_info.device) if dist_info.is_main else torch.empty_like(buf)
            dist.broadcast(t, src=0)
            buf.copy_(t)
    model.eval()  # as from_pretrained leaves it (the trainers switch modes themselves)
    return model


def adamw_kwargs(device: torch.device) -> dict[str, Any]:
    """AdamW's implementation: fused on CUDA (one kernel for every parameter), torch's default elsewhere."""
    return {"fused": True} if device.type == "cuda" else {}


def clip_grad_norm(params, max_norm: float) -> float:
    norm = torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


# ---------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------

def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def latest_complete(root: str | Path) -> Path | None:
    root = Path(root)
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step_*") if (p / COMPLETE).exists())
    return done[-1] if done else None


def save_resumable(path: Path, model, optimizer, trainer_state: dict[str, Any], dist_info: DistInfo,
                   extra_rank_state: dict[str, Any] | None = None) -> None:
    """Model + optimizer (DCP, sharded), trainer state JSON, per-rank RNG/data state."""
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415
    from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: PLC0415

    path.mkdir(parents=True, exist_ok=True)
    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path / "dcp"))
    rank_state = {"torch_rng": torch.get_rng_state(), **(extra_rank_state or {})}
    if torch.cuda.is_available():
        rank_state["cuda_rng"] = torch.cuda.get_rng_state()
    torch.save(rank_state, path / f"rank{dist_info.rank}.pt")
    barrier()
    if dist_info.is_main:
        (path / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2, sort_keys=True))
    barrier()


def mark_complete(path: Path, dist_info: DistInfo, keep_last: int | None = None, fs_timeout_s: float = 60.0) -> None:
    """Mark ``path`` COMPLETE once every rank's files are written and visible to rank 0 (on several nodes a
    shared filesystem may show another node's file late: waited for up to ``fs_timeout_s``); then prune to
    the ``keep_last`` newest complete checkpoints."""
    barrier()
    if dist_info.is_main:
        wanted = [path / "trainer_state.json", *(path / f"rank{r}.pt" for r in range(dist_info.world_size))]
        deadline = time.monotonic() + fs_timeout_s
        while (missing := [f.name for f in wanted if f.name not in os.listdir(f.parent)]) and time.monotonic() < deadline:
            time.sleep(0.5)  # the folder listed afresh each time (NFS caches lookups)
        if missing:
            raise RuntimeError(f"checkpoint {path} is not complete: {', '.join(missing)} not visible after "
                               f"{fs_timeout_s:g} s (every rank writes its files under one shared output_dir)")
        (path / COMPLETE).write_text("ok\n")
        if keep_last:
            done = sorted(p for p in path.parent.glob("step_*") if (p / COMPLETE).exists())
            for old in done[:-keep_last]:
                shutil.rmtree(old, ignore_errors=True)
    barrier()


def load_resumable(path: Path, model, optimizer, dist_info: DistInfo) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: PLC0415

    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(path / "dcp"))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    trainer_state = json.loads((path / "trainer_state.json").read_text())
    rank_file = path / f"rank{dist_info.rank}.pt"
    rank_state = torch.load(rank_file, weights_only=False) if rank_file.exists() else {}
    if "torch_rng" in rank_state:
        torch.set_rng_state(rank_state["torch_rng"])
    if "cuda_rng" in rank_state and torch.cuda.is_available():
        torch.cuda.set_rng_state(rank_state["cuda_rng"])
    return trainer_state, rank_state


def full_state_dict(model) -> dict[str, torch.Tensor] | None:
    """The full (unsharded) state dict on rank 0 (None elsewhere), on CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # noqa: PLC0415

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = lora.merge_state_dict(model, get_model_state_dict(model, options=opts))  # LoRA: the merged model's
    return sd if (not dist.is_initialized() or dist.get_rank() == 0) else None


def iter_full_params(model, dtype: torch.dtype | None = None):
    """(checkpoint name, full tensor) for each parameter, one at a time: an FSDP2 shard is cast to
    ``dtype`` on its device, then gathered (``full_tensor``, a collective: every rank iterates), so the
    gather moves the target dtype's bytes (fp32 shards pushed as bf16: half the traffic; the cast is
    elementwise, so the result is bit-identical to gathering first) and no rank ever holds more than
    one full parameter beyond its shards. Tied parameters come once (the names ``save_pretrained``
    writes); every rank yields the tensors (only the sender keeps them). A model with LoRA adapters
    yields the merged model's (:func:`paravt.models.lora.merged`)."""
    def gathered():
        for name, p in model.named_parameters():
            t = p.detach()
            if dtype is not None and t.is_floating_point() and t.dtype != dtype:
                t = t.to(dtype)  # a DTensor casts its local shard and keeps its placements
            yield name, (t.full_tensor() if hasattr(t, "full_tensor") else t)
    return lora.merged(model, gathered())


def weight_buckets(model, dtype: torch.dtype, bucket_bytes: int, is_sender: bool):
    """The policy as :class:`~paravt.core.weight_sync.WeightBuckets` for the ``broadcast``
    transport: bucket plan from the parameters' global shapes (no communication), then per bucket
    its parameters gathered one by one, cast to ``dtype`` and packed on the sender (None elsewhere).
    Peak on the sender: one bucket plus one full parameter."""
    from paravt.core.weight_sync import TensorMeta, WeightBuckets, dtype_name, plan_buckets  # noqa: PLC0415

    metas = [TensorMeta(n, dtype_name(dtype if p.is_floating_point() else p.dtype), tuple(p.shape))
             for n, p in lora.merged_params(model)]  # a LoRA model's: the merged names and shapes
    plan = plan_buckets(metas, bucket_bytes)
    params = iter_full_params(model, dtype)  # one pass, in plan order, on every rank

    def gather(i: int):
        tensors = []
        for m in plan[i]:
            name, t = next(params)
            if name != m.name:
                raise RuntimeError(f"parameter order changed while pushing: {name} != {m.name}")
            if is_sender:
                tensors.append(t)
            del t
        return tensors if is_sender else None

    return WeightBuckets(plan, gather)


def export_hf(model, processor, out: str | Path, dist_info: DistInfo, dtype: torch.dtype | None = None) -> Path:
    """A ``save_pretrained`` directory (model + processor) that the next stage loads."""
    out = Path(out)
    # Parameter by parameter, cast on the device before it reaches host memory: rank 0 holds one copy
    # in the export dtype (8B in bf16: ~17.5 GB), never the fp32 state dict beside it. Persistent
    # buffers (none in Qwen3-VL) follow the same way.
    sd = {}
    for name, t in iter_full_params(model, dtype):
        if dist_info.is_main:
            sd[name] = t.cpu()
        del t
    params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    for name, b in model.state_dict().items():
        if name not in params:
            b = b.full_tensor() if hasattr(b, "full_tensor") else b
            if dist_info.is_main:
                sd[name] = (b.to(dtype) if dtype is not None and b.is_floating_point() else b).cpu()
    if dist_info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        # save_pretrained empties the dict it is given (transformers 5.x): hand it a copy
        model.save_pretrained(out, state_dict=dict(sd), safe_serialization=True)
        processor.save_pretrained(out)
    barrier()
    return out
