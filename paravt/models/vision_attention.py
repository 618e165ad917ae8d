"""The Qwen3-VL vision tower's attention: one kernel call per block for frames of one size, and the
patch embedding as a linear.

transformers' vision attention (``Qwen3VLVisionAttention``) attends within each frame (each
temporal patch of ``grid_thw``). Without flash-attention it splits the patches by frame with
``cu_seqlens.tolist()`` (a host sync in every block) and calls SDPA once per frame: 8 calls per
block for 16 frames, ~10k small kernels per 8B SFT step at 128 frames × 27 blocks × (forward,
recompute, backward). Here the frame layout is read from ``grid_thw`` once per vision forward (a
forward pre-hook on the tower, where transformers already reads the grid on the host) and passed to
every block as the keyword ``frame_runs``: runs of consecutive frames of one size, ``(start token,
frames, tokens per frame)``. Each block then calls SDPA once per run with the frames as the batch
dimension, ``(frames, heads, tokens, head_dim)``: the same attention, since a frame's tokens attend
only to each other either way. One video's frames (or a prompt's overview frames, one image each,
all of one size) are one run: one call per block.

With ``flash_attention_2`` transformers' own path already makes one varlen call; it is kept.

The patch embedding is a ``Conv3d`` whose stride equals its kernel, over inputs that are already
flattened patches: a linear map by the kernel viewed as a matrix. cuDNN has slow paths for that
convolution; ``F.linear`` with ``weight.view(out, -1)`` computes the same sums without them. The
parameter stays the Conv3d's (same names, shapes and checkpoints; weight pushes and FSDP shards
unchanged), unlike transformers' own ``fusion_config={"patch_embeddings": True}``, which renames it.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

RUNS_KWARG = "frame_runs"
FAST_IMPLEMENTATIONS = ("sdpa", "sdpa_varlen", "torch_varlen")  # the vision attention implementations this path replaces


def frame_runs(grid_thw: torch.Tensor) -> tuple[tuple[int, int, int], ...]:
    """Runs of consecutive frames of one size: ``(start token, frames, tokens per frame)``, in the order
    transformers lays the patches out (every entry's ``t`` frames of ``h·w`` patches, entry by entry)."""
    runs: list[list[int]] = []
    start = 0
    for t, h, w in grid_thw.tolist():
        n = h * w
        if runs and runs[-1][2] == n:
            runs[-1][1] += t
        else:
            runs.append([start, t, n])
        start += t * n
    return tuple(tuple(r) for r in runs)


# The text model's packed-row keywords (paravt.models.packed_attention.varlen_kwargs): they reach the tower
# with the forward's other keywords, and transformers' flash-attention vision path passes its own
# cu_seq_lens_* beside **kwargs (a second value for the same keyword would be a TypeError).
TEXT_PACK_KWARGS = ("packed_bounds", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _add_runs(module, args, kwargs):
    """Forward pre-hook of the vision tower: the frame layout, once per forward, for every block; the text
    model's packed-row keywords dropped (:data:`TEXT_PACK_KWARGS`)."""
    for name in TEXT_PACK_KWARGS:
        kwargs.pop(name, None)
    kwargs.pop(SHARED_KWARG, None)
    if RUNS_KWARG not in kwargs:
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
        if grid is not None:
            kwargs[RUNS_KWARG] = frame_runs(grid)
    return args, kwargs


@lru_cache(maxsize=None)
def _attention_class(base: type) -> type:
    def forward(self, hidden_states, cu_seqlens, position_embeddings=None, **kwargs):
        runs = kwargs.pop(RUNS_KWARG, None)
        if runs is None or self.config._attn_implementation not in FAST_IMPLEMENTATIONS:
            return base.forward(self, hidden_states, cu_seqlens, position_embeddings=position_embeddings, **kwargs)
        from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision  # noqa: PLC0415

        n_tok = hidden_states.shape[0]
        q, k, v = self.qkv(hidden_states).reshape(n_tok, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
        dropout = self.attention_dropout if self.training else 0.0
        outs = []
        for start, frames, length in runs:  # (tokens, heads, d) -> (frames, heads, length, d)
            sl = slice(start, start + frames * length)
            qf, kf, vf = (x[sl].reshape(frames, length, self.num_heads, -1).transpose(1, 2) for x in (q, k, v))
            o = F.scaled_dot_product_attention(qf, kf, vf, dropout_p=dropout, scale=self.scaling)
            outs.append(o.transpose(1, 2).reshape(frames * length, -1))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, 0)
        return self.proj(out)

    return type(f"Batched{base.__name__}", (base,), {"forward": forward, "__module__": __name__})


@lru_cache(maxsize=None)
def _patch_embed_class(base: type) -> type:
    def forward(self, hidden_states):
        w = self.proj.weight
        x = hidden_states.reshape(-1, w[0].numel()).to(w.dtype)
        return F.linear(x, w.reshape(w.shape[0], -1), self.proj.bias)

    return type(f"Linear{base.__name__}", (base,), {"forward": forward, "__module__": __name__})


SHARED_KWARG = "shared_image_index"


@lru_cache(maxsize=None)
def _shared_images_class(base: type) -> type:
    """``get_image_features`` that runs the tower once per distinct image: with ``shared_image_index``
    (a tuple: for each image of the batch, in placeholder order, its index among the distinct images
    given as ``pixel_values``) each distinct image's features are reused wherever it recurs (the
    overview frames every rollout of a GRPO group shares). Called inside the model's forward, so FSDP
    gathers the root parameters as for any forward; a shared image's gradient adds up."""
    def get_image_features(self, pixel_values, image_grid_thw=None, **kwargs):
        index = kwargs.pop(SHARED_KWARG, None)
        out = base.get_image_features(self, pixel_values, image_grid_thw, **kwargs)
        if index is not None:
            out.pooler_output = tuple(out.pooler_output[i] for i in index)
            out.deepstack_features = [tuple(f[i] for i in index) for f in out.deepstack_features]
        return out

    return type(f"SharedImages{base.__name__}", (base,), {"get_image_features": get_image_features,
                                                          "__module__": __name__, "_paravt_shared": True})


def install(model) -> bool:
    """Give ``model``'s Qwen3-VL vision tower (if it has one) the batched attention, the linear patch
    embedding and the shared-image features (:func:`_shared_images_class`), in place (module classes swapped, no parameter touched); idempotent. Returns whether
    a vision tower was found."""
    visual = getattr(getattr(model, "model", None), "visual", None) or getattr(model, "visual", None)
    if visual is None or not hasattr(visual, "blocks"):
        return False
    for blk in visual.blocks:
        if not getattr(type(blk.attn), "_paravt_batched", False):
            cls = _attention_class(type(blk.attn))
            cls._paravt_batched = True
            blk.attn.__class__ = cls
    pe = getattr(visual, "patch_embed", None)
    proj = getattr(pe, "proj", None)
    if (isinstance(proj, torch.nn.Conv3d) and proj.stride == proj.kernel_size and proj.padding == (0, 0, 0)
            and proj.dilation == (1, 1, 1) and proj.groups == 1 and not getattr(type(pe), "_paravt_linear", False)):
        cls = _patch_embed_class(type(pe))
        cls._paravt_linear = True
        pe.__class__ = cls
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "get_image_features") and not getattr(type(inner), "_paravt_shared", False):
        inner.__class__ = _shared_images_class(type(inner))
    if not getattr(visual, "_paravt_runs_hook", False):
        visual.register_forward_pre_hook(_add_runs, with_kwargs=True)
        visual._paravt_runs_hook = True
    return True
