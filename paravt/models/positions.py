"""Qwen3-VL's M-RoPE positions of one sequence, computed on the host.

Left to itself, the model computes them inside ``forward`` from the ids on the accelerator: a
``tolist()`` of the token types and three ``.item()`` per image, each a host sync (~200 for a 64-frame
prompt). The trainers compute them here, on CPU tensors, before the forward, and pass ``position_ids``;
the model then computes none. The values are the model's own (its ``get_rope_index``).
"""

from __future__ import annotations

import torch


def mrope_positions(model, input_ids: torch.Tensor, image_token_id: int,
                    image_grid_thw: torch.Tensor | None) -> torch.Tensor:
    """(3, 1, L) temporal/height/width positions of a (1, L) row of ids on the CPU (its images' grids in
    ``image_grid_thw``, on the CPU): what ``model`` would compute from them; text-only rows count 0..L-1."""
    ids = input_ids.cpu()
    if image_grid_thw is None:
        return torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, 1, -1)
    mm = (ids == image_token_id).long()
    rope, _ = model.model.get_rope_index(ids, mm, image_grid_thw=image_grid_thw.cpu())
    return rope
