"""The FSDP2 groups of a Qwen3-VL model: which modules gather their parameters in one collective.

Each group is all-gathered just before it runs and freed after (``reshard_after_forward``), so a group's
size is the memory it holds while it runs and the collective that the previous group's compute can hide.
Below the root: every text decoder layer and vision block; the input embeddings; the untied ``lm_head``; the
vision patch + position embeddings (one group: they run back to back); the vision merger; each deepstack
merger. The root keeps what is left (the final norm), so its gather at the start of forward is small; for
Qwen3-VL-8B the embeddings, the untied ``lm_head``, the patch/position embeddings and the mergers hold about
1.4 B parameters, which in the root would be one ~2.8 GB bf16 gather before any compute.

A tied ``lm_head`` shares its weight with the input embeddings: both go in one group
(``fully_shard([embed_tokens, lm_head])``), gathered when the embeddings run and freed after the head has
run, since FSDP2 manages a parameter in one group only.
"""

from __future__ import annotations

import torch


def decoder_layers(model) -> list[torch.nn.Module]:
    """Transformer blocks to shard one by one (text decoder layers + vision blocks)."""
    inner = getattr(model, "model", model)
    layers = list(getattr(getattr(inner, "language_model", inner), "layers", []))
    visual = getattr(inner, "visual", None)
    if visual is not None:
        layers += list(getattr(visual, "blocks", []))
    if not layers:
        raise ValueError(f"cannot find decoder layers in {type(model).__name__}")
    return layers


def _shares_weight(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    wa, wb = getattr(a, "weight", None), getattr(b, "weight", None)
    return wa is not None and wa is wb


def shard_groups(model) -> list[torch.nn.Module | list[torch.nn.Module]]:
    """The groups below the root, in the order to ``fully_shard`` them (a list: one group of several
    modules). Modules the model does not have are left out."""
    groups: list[torch.nn.Module | list[torch.nn.Module]] = list(decoder_layers(model))
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    emb = get_in() if get_in is not None else None
    head = get_out() if get_out is not None else None
    if emb is not None and head is not None and _shares_weight(emb, head):
        groups.append([emb, head])
    else:
        groups += [m for m in (emb, head) if m is not None]
    visual = getattr(getattr(model, "model", model), "visual", None)
    if visual is not None:
        embeddings = [m for m in (getattr(visual, "patch_embed", None), getattr(visual, "pos_embed", None))
                      if m is not None and any(True for _ in m.parameters())]
        if embeddings:
            groups.append(embeddings if len(embeddings) > 1 else embeddings[0])
        if getattr(visual, "merger", None) is not None:
            groups.append(visual.merger)
        groups += list(getattr(visual, "deepstack_merger_list", []))
    return groups
