"""The RL trainer's forwards, packed: several samples in one row, each image's vision features once.

One forward per sample ran the vision tower on every rollout's copy of its prompt's overview (8
rollouts of a group: 8 identical 64-frame encodings, for the actor and again for the reference) and
paid a kernel launch per sample and layer. :func:`bins` groups a rank's samples into packs of at
most ``budget`` tokens, in order, so a prompt group's rollouts (consecutive in a batch) share a pack;
:func:`packed_logps` runs one forward per pack:

- the ids of its samples one after another, each with its own text and M-RoPE positions (the
  model's ``get_rope_index`` per sample, as SFT's ``collate_packed``), the attention within each
  sample (:func:`paravt.models.packed_attention.packed_call`);
- the pixels of each distinct image once (images keyed by their content), their features reused for
  every sample that shows them (``shared_image_index``, :mod:`paravt.models.vision_attention`);
- logits at the positions whose next token the loss reads only, scored once for the whole pack by
  :func:`paravt.rl.logps.kept_logps` (the same code as the one-sample path), then split per sample.

Each sample's outputs equal its own forward's (``tests/rl/test_packing.py``): the same tokens, the
same positions, attention restricted to the sample, the same image features.

A step over several ranks: every rank holds the step's whole sample list, and each minibatch of it
is cut into one consecutive run per rank of about equal token counts (:func:`split_by_tokens`:
uneven sample counts, a group's rollouts together). FSDP's collectives need every rank to run as
many forwards and backwards, so a rank's packs are split, then filled up with zero-mask copies of
a sample (:func:`padding_sample`, :func:`equalize`) to the largest rank's count. Without FSDP
(``trainer.strategy=none``) :func:`average_gradients` does what FSDP's gradient reduction does.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Sequence

import torch
import torch.distributed as dist

from paravt.models import parallel

from paravt.models.packed_attention import packed_call
from paravt.models.vision_attention import SHARED_KWARG
from paravt.models.positions import mrope_positions
from paravt.rl.logps import kept_logps, scatter


def bins(samples: Sequence, budget: int) -> list[list]:
    """Consecutive samples in packs of at most ``budget`` tokens (a longer sample alone)."""
    out: list[list] = []
    size = 0
    for s in samples:
        n = len(s.input_ids)
        if out and size + n <= budget:
            out[-1].append(s)
            size += n
        else:
            out.append([s])
            size = n
    return out


def equalize(packs: list[list], count: int, pad) -> list[list]:
    """``packs`` made ``count`` packs, so every rank runs as many forwards: the most populous pack halved
    while one holds two samples, then packs of ``pad`` alone (a zero-mask sample: its forward and backward
    add nothing to the loss)."""
    packs = [list(p) for p in packs]
    while len(packs) < count:
        i = max(range(len(packs)), key=lambda j: len(packs[j]), default=None)
        if i is None or len(packs[i]) < 2:
            packs.append([pad])
            continue
        half = len(packs[i]) // 2
        packs[i:i + 1] = [packs[i][:half], packs[i][half:]]
    return packs


def split_by_tokens(samples: Sequence, parts: int) -> list[list]:
    """``samples`` in ``parts`` consecutive runs of about equal token counts: run r ends at the sample
    boundary nearest r/parts of the tokens, so each run's count is within one sample's length of the
    mean and a prompt group's rollouts (consecutive) share a rank. Counts may differ; a run is empty
    where there are fewer samples than parts."""
    if parts < 1:
        raise ValueError(f"cannot split samples over {parts} ranks")
    prefix = [0]
    for s in samples:
        prefix.append(prefix[-1] + len(s.input_ids))
    cuts = [0]
    for r in range(1, parts):  # |parts·prefix[j] − r·total| in integers: the boundary nearest r/parts
        cuts.append(min(range(cuts[-1], len(samples) + 1), key=lambda j: abs(parts * prefix[j] - r * prefix[-1])))
    cuts.append(len(samples))
    return [list(samples[a:b]) for a, b in zip(cuts, cuts[1:])]


def padding_sample(samples: Sequence):
    """A zero-mask copy of the shortest of ``samples`` that has images (of the shortest when none has):
    the forward that fills a rank up to the others' count, running the same modules as theirs (the
    vision tower's blocks are sharded too, so they join the collectives)."""
    with_images = [s for s in samples if s.images is not None and len(s.images)]
    src = min(with_images or list(samples), key=lambda s: len(s.input_ids))
    return replace(src, loss_mask=[0] * len(src.loss_mask), advantage=0.0, kind="pad", think_mask=None)


def average_gradients(params) -> None:
    """Each gradient made its mean over the ranks, as FSDP's reduction leaves it, for a model that is not
    sharded (``trainer.strategy=none`` on several ranks), in one all-reduce of the flattened gradients. A
    parameter without a gradient on some rank counts as zero there; one without on every rank keeps none."""
    params = [p for p in params if p.requires_grad]
    has = parallel.all_reduce_sum_tensor(torch.tensor([float(p.grad is not None) for p in params]))
    params = [p for p, n in zip(params, has.tolist()) if n]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.grad.numel()].view_as(p.grad))
        offset += p.grad.numel()


def _image_key(im) -> tuple:
    return im.size, im.mode, hashlib.blake2b(im.tobytes(), digest_size=16).digest()


def _distinct_images(samples, processor):
    """(pixel_values, grid) of the distinct images of ``samples`` (first-seen order), each sample's
    grids, and the index of every image (samples in order) among the distinct ones."""
    keys: dict[tuple, int] = {}
    pix, grids, index, per_sample = [], [], [], []
    for s in samples:
        if s.images is None or not len(s.images):
            per_sample.append(None)
            continue
        pv, grid = s.images.tensors(processor)
        per_sample.append(grid)
        offsets = torch.cumsum(grid.prod(-1), 0).tolist()
        for i, im in enumerate(s.images.images):
            k = _image_key(im)
            if k not in keys:
                keys[k] = len(keys)
                start = offsets[i - 1] if i else 0
                pix.append(pv[start:offsets[i]])
                grids.append(grid[i])
            index.append(keys[k])
    if not pix:
        return None, None, per_sample, ()
    return torch.cat(pix), torch.stack(grids), per_sample, tuple(index)


def packed_logps(model, samples: Sequence, processor, image_token_id: int, vision_ids: torch.Tensor,
                 temperature: float, device: torch.device, positions: Sequence[Sequence[int]],
                 with_entropy: bool = False) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(log p, entropy or None) per sample, as :func:`paravt.rl.logps.forward_logps` with ``positions``
    returns them for that sample alone, from one forward of the pack."""
    ids_l, pos_l, keep, counts = [], [], [], []
    offset = 0
    pv, grid, grids, index = _distinct_images(samples, processor)
    for s, g, pos in zip(samples, grids, positions):
        ids = torch.tensor([list(s.input_ids)])
        rope = mrope_positions(model, ids, image_token_id, g)
        ids_l.append(ids[0])
        pos_l.append(torch.cat([torch.arange(ids.shape[1])[None], rope[:, 0]], 0))
        keep.extend(offset + t for t in pos)
        counts.append(len(pos))
        offset += ids.shape[1]
    input_ids = torch.cat(ids_l)[None].to(device)
    kept = torch.tensor(keep, dtype=torch.long, device=device)
    kw = {"input_ids": input_ids, "position_ids": torch.cat(pos_l, 1)[:, None, :].to(device),
          "mm_token_type_ids": (input_ids == image_token_id).long(), "use_cache": False, "logits_to_keep": kept}
    if pv is not None:
        kw.update(pixel_values=pv.to(device), image_grid_thw=grid.to(device), **{SHARED_KWARG: index})
    logits = packed_call(model, **kw).logits.squeeze(0)  # a view: its backward allocates nothing
    # log p over the pack's kept rows at once, then split: a slice of the logits per sample would give
    # each sample's backward a zero gradient the size of the whole pack's logits
    logp, ent = kept_logps(logits, input_ids[0, kept + 1], vision_ids, temperature, with_entropy)
    out = []
    for s, pos, lp, e in zip(samples, positions, logp.split(counts),
                             ent.split(counts) if ent is not None else [None] * len(counts)):
        idx = torch.tensor(list(pos), dtype=torch.long, device=device)
        n = len(s.input_ids) - 1
        out.append((scatter(lp, idx, n), None if e is None else scatter(e, idx, n)))
    return out
