"""LoRA adapters for the SFT and RL trainers (``lora.enabled``, off by default), through peft.

``attach(model, cfg)`` injects peft's LoRA layers into the loaded Qwen3-VL in place (``peft.get_peft_model``):
each adapted linear becomes ``<name>.base_layer`` (frozen) plus ``<name>.lora_A`` / ``lora_B`` (trained), and
every other parameter is frozen. The trainers keep training the model object they loaded (its class, methods,
FSDP2 groups and checkpoint keys stay those of Qwen3-VL); the ``PeftModel`` is kept beside it
(:func:`peft_model`) for what peft does: switching the adapter off (:func:`reference`: the frozen base, the RL
KL reference without a second model) and writing the adapter in its own format (:func:`save_adapter`:
``adapter_model.safetensors`` + ``adapter_config.json``, what vLLM and SGLang load).

Everything that leaves a trainer as a whole model (the ``hf/`` export of a checkpoint, a weight push) is the
**merged** model: :func:`merged` turns the stream of gathered parameters into that of a plain checkpoint,
each adapted weight ``W + (alpha / r) · B·A`` under its own name, so eval, RL and the engines load it as any
other checkpoint. This module imports neither torch nor peft until a function needs them, so the configs
that hold :class:`LoraConfig` stay light.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from paravt.core.config import check_choices, choice

#: The text decoder's linear layers an adapter may target (leaf names of ``model.language_model.layers.N``).
TEXT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: With ``vision: true``: the linear layers of every vision block (``model.visual.blocks.N``).
VISION_TARGETS = ("attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2")
ADAPTER = "default"  # peft's adapter name (one adapter per model here)
_HANDLE = "_paravt_peft"  # the PeftModel, kept in the model's __dict__ (not a submodule: no second parameter path)


@dataclass
class LoraConfig:
    """``lora.*`` of the SFT and RL recipes: low-rank adapters (peft) trained instead of every parameter."""

    enabled: bool = False  # train LoRA adapters on a frozen base (false: every parameter trains, as released)
    rank: int = 16  # r: the adapters' rank
    alpha: float = 32.0  # the adapters' output is scaled by alpha / rank
    dropout: float = 0.0  # dropout on each adapter's input while training
    # text decoder linears adapted, leaf names: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
    target_modules: list[str] = field(default_factory=lambda: list(TEXT_TARGETS))
    vision: bool = False  # also adapt every vision block's attn.qkv, attn.proj, mlp.linear_fc1 and mlp.linear_fc2
    # RL: auto (the adapter alone to rollout servers that load adapters at run time, else the merged weights) | merged
    push: str = choice("auto", "merged")

    def __post_init__(self):
        check_choices(self, "lora")
        if self.rank < 1 or self.alpha <= 0 or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.rank must be >= 1, lora.alpha > 0 and lora.dropout in [0, 1), got "
                             f"{self.rank}, {self.alpha}, {self.dropout}")
        bad = [t for t in self.target_modules if t not in TEXT_TARGETS]
        if bad or not self.target_modules:
            raise ValueError(f"lora.target_modules must be some of {' | '.join(TEXT_TARGETS)}, got "
                             f"{list(self.target_modules)}")


def target_pattern(cfg: LoraConfig) -> str:
    """The regular expression of the adapted modules' full names (peft matches it against each whole name)."""
    text = rf"model\.language_model\.layers\.\d+\.(self_attn|mlp)\.({'|'.join(map(re.escape, cfg.target_modules))})"
    if cfg.vision:
        text += rf"|model\.visual\.blocks\.\d+\.({'|'.join(map(re.escape, VISION_TARGETS))})"
    return text


def attach(model: Any, cfg: LoraConfig, empty: bool = False) -> Any:
    """Inject ``cfg``'s adapters into ``model`` in place (every other parameter frozen); returns the PeftModel,
    also reachable as :func:`peft_model` of ``model``. Works on a meta-device model too (sharded start-up).
    ``empty``: the adapters are made on the meta device (peft's ``low_cpu_mem_usage``) for a caller that
    allocates them itself (the dry run, whose fake tensors cannot be moved in place)."""
    import warnings  # noqa: PLC0415

    import peft  # noqa: PLC0415

    pc = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                         target_modules=target_pattern(cfg), bias="none")
    with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
        warnings.simplefilter("ignore", FutureWarning)
        pm = peft.get_peft_model(model, pc, low_cpu_mem_usage=empty)
    object.__setattr__(model, _HANDLE, pm)
    return pm


def peft_model(model: Any) -> Any:
    """The PeftModel of a model :func:`attach` adapted (a DDP wrapper's module too), else None."""
    inner = getattr(model, "module", model)
    return getattr(inner, "__dict__", {}).get(_HANDLE)


@contextmanager
def reference(model: Any) -> Iterator[None]:
    """Context: ``model`` as its frozen base, the adapters switched off (peft's ``disable_adapter``); a no-op
    for a model without adapters. The adapters keep ``requires_grad`` inside it: peft's switch-off also freezes
    them, and FSDP2 reads ``requires_grad`` once, at its lazy init in the model's first forward; when that
    forward is the reference's, every adapter group looks frozen to it, gets no original dtype, and under mixed
    precision its bf16 gradients are never cast back to the fp32 parameters (the first backward fails)."""
    pm = peft_model(model)
    if pm is None:
        yield
        return
    trainable = [p for p in model.parameters() if p.requires_grad]
    with pm.disable_adapter():
        for p in trainable:
            p.requires_grad_(True)
        yield


def trainable_counts(model: Any) -> tuple[int, int]:
    """(trainable parameters, all parameters) of ``model`` (global sizes, sharded or not)."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def _layers(model: Any) -> dict[str, float]:
    """{adapted module's name: its scaling} of ``model`` (empty without adapters)."""
    if peft_model(model) is None:
        return {}
    from peft.tuners.lora import LoraLayer  # noqa: PLC0415

    inner = getattr(model, "module", model)
    return {n: m.scaling[ADAPTER] for n, m in inner.named_modules() if isinstance(m, LoraLayer)}


def merge_weight(w, a, b, scaling: float):
    """``w + scaling · b @ a`` computed in fp32, in ``w``'s dtype (peft's ``get_delta_weight`` for a Linear)."""
    return (w.float() + scaling * (b.float() @ a.float())).to(w.dtype)


_ADAPTER_PARAM = re.compile(rf"^(?P<module>.*)\.lora_(?P<ab>[AB])\.{ADAPTER}\.weight$")


def merged(model: Any, named: Iterable[tuple[str, Any]],
           combine: Callable[[Any, Any, Any, float], Any] = merge_weight) -> Iterator[tuple[str, Any]]:
    """The (name, tensor) stream of ``model``'s parameters in ``named_parameters`` order (full tensors) as that of
    the merged model: each adapted module's ``weight`` = ``combine(base weight, A, B, scaling)`` under the plain
    checkpoint's name (``base_layer`` dropped), its bias renamed, the adapters' own tensors dropped. A model
    without adapters streams unchanged. One adapted module's tensors are held at a time."""
    layers = _layers(model)
    if not layers:
        yield from named
        return
    held: dict[str, dict[str, Any]] = {}
    for name, t in named:
        module, _, leaf = name.rpartition(".base_layer.")
        m = None if module in layers else _ADAPTER_PARAM.match(name)
        if module in layers:
            held.setdefault(module, {})[leaf] = t
            continue
        if m is None or m["module"] not in layers:
            yield name, t
            continue
        parts = held.setdefault(m["module"], {})
        parts[m["ab"]] = t
        if "A" in parts and "B" in parts:
            del held[m["module"]]
            yield f"{m['module']}.weight", combine(parts["weight"], parts["A"], parts["B"], layers[m["module"]])
            if "bias" in parts:
                yield f"{m['module']}.bias", parts["bias"]
    if held:
        raise RuntimeError(f"adapted modules without both adapter matrices: {sorted(held)[:3]}")


def merged_params(model: Any) -> list[tuple[str, Any]]:
    """(name, parameter) of the merged model, in the order :func:`merged` streams it: an adapted module's base
    parameters under the plain names (their shapes and dtypes are the merged tensors')."""
    return list(merged(model, model.named_parameters(), combine=lambda w, a, b, s: w))


def merge_state_dict(model: Any, sd: dict[str, Any]) -> dict[str, Any]:
    """A full state dict of an adapted ``model`` (in its ``named_parameters`` order, buffers after) as the merged
    checkpoint's (the in-process engine's push)."""
    return dict(merged(model, sd.items())) if _layers(model) else sd


def is_adapter_param(name: str) -> bool:
    return _ADAPTER_PARAM.match(name) is not None


def adapter_tensors(model: Any, dtype=None) -> dict[str, Any]:
    """The adapters' full tensors (cast to ``dtype`` before the gather) under the names of the model's own
    parameters. Collective under FSDP2: every rank calls it and gets them."""
    out = {}
    inner = getattr(model, "module", model)
    for name, p in inner.named_parameters():
        if not is_adapter_param(name):
            continue
        t = p.detach()
        if dtype is not None and t.dtype != dtype:
            t = t.to(dtype)
        out[name] = (t.full_tensor() if hasattr(t, "full_tensor") else t).cpu()
    return out


def save_adapter(model: Any, out: str | Path, is_main: bool, dtype=None, base_model: str | None = None) -> int:
    """The adapters in peft's format under ``out`` (``adapter_model.safetensors``, ``adapter_config.json``):
    what ``PeftModel.from_pretrained``, vLLM's ``/v1/load_lora_adapter`` and SGLang's load. Collective (every
    rank gathers); rank ``is_main`` writes. Returns the adapter's bytes (the tensors' own)."""
    pm = peft_model(model)
    if pm is None:
        raise ValueError("save_adapter: the model has no LoRA adapters (lora.enabled=false)")
    tensors = adapter_tensors(model, dtype)
    if is_main:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        cfg = pm.peft_config[ADAPTER]
        if base_model is not None:
            cfg.base_model_name_or_path = str(base_model)
        # PeftModel's keys are the model's own under "base_model.model."; peft strips the adapter name
        pm.save_pretrained(str(out), state_dict={f"base_model.model.{k}": v for k, v in tensors.items()})
        (out / "README.md").unlink(missing_ok=True)  # peft's model card template: nothing a loader reads
    return sum(t.numel() * t.element_size() for t in tensors.values())


def full_bytes(model: Any, dtype=None) -> int:
    """The bytes of a whole-model push of ``model`` (merged, in ``dtype`` where floating): what an adapter push
    saves against."""
    import torch  # noqa: PLC0415

    def size(p) -> int:
        d = dtype if dtype is not None and p.is_floating_point() else p.dtype
        return p.numel() * torch.empty((), dtype=d).element_size()
    return sum(size(p) for _, p in merged_params(model))
