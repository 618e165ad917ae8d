"""Every forward runs the vision tower, so that every rank enters the tower's collectives.

Sharded over several ranks (FSDP2), each vision module all-gathers its parameters in forward and
reduce-scatters its gradients in backward: collectives that every rank must enter. A rank whose batch holds
no image (a text-only SFT row, the tiny model's copy batches, a text-only sample) would skip them while the
other ranks wait in them: a hang, or the next module's collective matched with theirs. Under DDP the same
rank would leave the tower's parameters without a gradient to reduce.

:func:`install` makes such a forward run the tower on one image of the smallest grid (``1 × merge ×
merge`` patches of zeros) right after the input embeddings, where the model runs the tower for real
images, so the collectives come in the same order on every rank in forward and in backward. The tower's
outputs (merged features and every deepstack feature) are summed, multiplied by 0 and added to the
embeddings: the logits and the loss are unchanged (x + 0 = x), and the tower's parameters get a zero
gradient from this rank (FSDP and DDP then average the ranks' gradients as for any parameter). A forward
given ``inputs_embeds`` instead of token ids runs no embeddings and is left as it is.

One place serves every trainer: the hooks sit on the model, so the SFT passes, the RL log-probabilities
and the reference model's forward all run the tower without a change of their own.
"""

from __future__ import annotations

import torch

VISION_INPUTS = ("pixel_values", "pixel_values_videos")


def dummy_inputs(visual, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pixel_values, grid_thw)`` of one image of the smallest grid the tower accepts, all zeros."""
    cfg = visual.config
    merge = int(cfg.spatial_merge_size)
    dim = int(cfg.in_channels) * int(cfg.temporal_patch_size) * int(cfg.patch_size) ** 2
    grid = torch.tensor([[1, merge, merge]], dtype=torch.long, device=device)
    return torch.zeros(merge * merge, dim, device=device), grid


def zero_term(visual, device: torch.device) -> torch.Tensor:
    """0 × the sum of the tower's outputs on :func:`dummy_inputs`: a scalar 0 whose graph holds every
    module of the tower."""
    pixels, grid = dummy_inputs(visual, device)
    out = visual(pixels, grid_thw=grid, return_dict=True)
    total = out.pooler_output.float().sum()
    for feat in out.deepstack_features or ():
        total = total + feat.float().sum()
    return total * 0.0


def install(model) -> bool:
    """Hook ``model`` (a Qwen3-VL ``...ForConditionalGeneration`` or its inner model) so that a forward without
    images runs the tower on :func:`dummy_inputs`; idempotent. Returns whether a vision tower was found."""
    inner = getattr(model, "model", model)
    visual = getattr(inner, "visual", None)
    embed = inner.get_input_embeddings() if hasattr(inner, "get_input_embeddings") else None
    if visual is None or embed is None:
        return False
    if getattr(inner, "_paravt_vision_join", False):
        return True
    pending = [False]  # set for each forward of the inner model, consumed by the embeddings' hook

    def before(module, args, kwargs):
        pending[0] = (all(kwargs.get(k) is None for k in VISION_INPUTS) and not kwargs.get("mm_encoder_outputs")
                      and kwargs.get("inputs_embeds") is None)

    def after_embed(module, args, output):
        if not pending[0]:
            return None
        pending[0] = False
        return output + zero_term(visual, output.device).to(output.dtype)

    def after(module, args, kwargs, output):
        pending[0] = False

    inner.register_forward_pre_hook(before, with_kwargs=True)
    embed.register_forward_hook(after_embed)
    inner.register_forward_hook(after, with_kwargs=True, always_call=True)
    inner._paravt_vision_join = True
    return True
