"""The configurations of Qwen3-VL-2B-, 4B- and 8B-Instruct (their published config.json files, written out),
for measuring a model's path without its weights: random init at full width, any depth, or the meta device
for names and shapes only (benchmarks, the GPU check, the dry run).

The three share the token ids, the vocabulary (151,936), head_dim 128 with 8 KV heads, the M-RoPE settings
(theta 5e6, sections 24/20/20 interleaved), patch 16, spatial merge 2 and temporal patch 2. They differ in:

========  ======  ======  =====  ============  =====  ==============================  ============  ===========
model     hidden  layers  heads  intermediate  tied   vision (depth x width, MLP)     deepstack     parameters
========  ======  ======  =====  ============  =====  ==============================  ============  ===========
2B        2048    28      16     6144          yes    24 x 1024, 4096 -> out 2048     5, 11, 17     2,127,532,032
4B        2560    36      32     9728          yes    24 x 1024, 4096 -> out 2560     5, 11, 17     4,437,815,808
8B        4096    36      32     12288         no     27 x 1152, 4304 -> out 4096     8, 16, 24     8,767,123,696
========  ======  ======  =====  ============  =====  ==============================  ============  ===========

Sources: each model's config.json in its Hugging Face repository (``Qwen/Qwen3-VL-{2B,4B,8B}-Instruct``); the
2B's and 4B's numbers as copies of those files in public code spell them out (OpenVINO GenAI's Qwen3-VL config
test for the 2B, text-encoder loaders that build Qwen3-VL-4B-Instruct from its config for the 4B), and their
parameter counts (``param_shapes``) equal to the published sizes, 2.13 B and 4.44 B. The 2B and 4B tie
``lm_head`` to the input embeddings (``tie_word_embeddings: true``, top level and text config): the checkpoints
hold one matrix, ``named_parameters`` lists it once, and FSDP2 shards it in one group
(:mod:`paravt.models.fsdp_groups`).
"""

from __future__ import annotations

import re

_ROPE = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20], "mrope_interleaved": True}
_TOKENS = {"image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
           "vision_end_token_id": 151653}

# name -> (text: hidden, layers, heads, intermediate, tied; vision: depth, width, MLP, heads, deepstack indexes)
PUBLISHED = {
    "2b": {"hidden": 2048, "layers": 28, "heads": 16, "intermediate": 6144, "tied": True,
           "v_depth": 24, "v_hidden": 1024, "v_intermediate": 4096, "v_heads": 16, "deepstack": (5, 11, 17)},
    "4b": {"hidden": 2560, "layers": 36, "heads": 32, "intermediate": 9728, "tied": True,
           "v_depth": 24, "v_hidden": 1024, "v_intermediate": 4096, "v_heads": 16, "deepstack": (5, 11, 17)},
    "8b": {"hidden": 4096, "layers": 36, "heads": 32, "intermediate": 12288, "tied": False,
           "v_depth": 27, "v_hidden": 1152, "v_intermediate": 4304, "v_heads": 16, "deepstack": (8, 16, 24)},
}
# the published checkpoints' parameter counts (bf16 safetensors), which param_shapes of each config gives
PUBLISHED_PARAMS = {"2b": 2_127_532_032, "4b": 4_437_815_808, "8b": 8_767_123_696}


def qwen3vl_config(size: str, num_hidden_layers: int | None = None, vision_depth: int | None = None):
    """``Qwen3VLConfig`` of Qwen3-VL-``size`` ("2b", "4b" or "8b": :data:`PUBLISHED`), optionally at
    reduced text depth and vision depth (deepstack indexes beyond the depth dropped; none left: the last block)."""
    from transformers import Qwen3VLConfig  # noqa: PLC0415

    p = PUBLISHED[size.lower()]
    layers = p["layers"] if num_hidden_layers is None else num_hidden_layers
    depth = p["v_depth"] if vision_depth is None else vision_depth
    deep = [i for i in p["deepstack"] if i < depth] or [depth - 1]
    return Qwen3VLConfig(
        text_config={"hidden_size": p["hidden"], "num_hidden_layers": layers, "num_attention_heads": p["heads"],
                     "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": p["intermediate"],
                     "vocab_size": 151936, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
                     "hidden_act": "silu", "rope_parameters": dict(_ROPE), "tie_word_embeddings": p["tied"]},
        vision_config={"depth": depth, "hidden_size": p["v_hidden"], "intermediate_size": p["v_intermediate"],
                       "num_heads": p["v_heads"], "out_hidden_size": p["hidden"], "patch_size": 16,
                       "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 2304,
                       "deepstack_visual_indexes": deep, "in_channels": 3},
        **_TOKENS, tie_word_embeddings=p["tied"])


def qwen3vl_2b_config(num_hidden_layers: int = 28, vision_depth: int = 24):
    """``Qwen3VLConfig`` of Qwen3-VL-2B (text: hidden 2048, 28 layers, 16 heads, 8 KV heads, head_dim 128,
    intermediate 6144, vocab 151936, lm_head tied to the input embeddings; vision: 24 blocks of width 1024,
    MLP 4096, merged to 2048, deepstack at 5/11/17), optionally at reduced depth."""
    return qwen3vl_config("2b", num_hidden_layers, vision_depth)


def qwen3vl_4b_config(num_hidden_layers: int = 36, vision_depth: int = 24):
    """``Qwen3VLConfig`` of Qwen3-VL-4B (text: hidden 2560, 36 layers, 32 heads, 8 KV heads, head_dim 128,
    intermediate 9728, vocab 151936, lm_head tied to the input embeddings; vision: 24 blocks of width 1024,
    MLP 4096, merged to 2560, deepstack at 5/11/17), optionally at reduced depth."""
    return qwen3vl_config("4b", num_hidden_layers, vision_depth)


def qwen3vl_8b_config(num_hidden_layers: int = 36, vision_depth: int = 27):
    """``Qwen3VLConfig`` of Qwen3-VL-8B (text: hidden 4096, 36 layers, 32 heads, 8 KV heads, head_dim
    128, intermediate 12288, vocab 151936, untied lm_head; vision: 27 blocks of width 1152, patch
    16, spatial merge 2, deepstack at 8/16/24), optionally at reduced depth."""
    return qwen3vl_config("8b", num_hidden_layers, vision_depth)


_NAME = re.compile(r"qwen3[-_ ]?vl[-_ ]?(\d+)b(?![a-z0-9])", re.IGNORECASE)


def reference_size(name: str | None) -> str | None:
    """The reference config a model name or path names ("2b", "4b", "8b"), or None: the last
    ``Qwen3-VL-<N>B`` in it (``Qwen/Qwen3-VL-2B-Instruct``, ``runs/sft_qwen3vl_4b/final``; case, ``-`` and
    ``_`` free), when N is one of :data:`PUBLISHED`."""
    found = [m.group(1) + "b" for m in _NAME.finditer(str(name or ""))]
    return found[-1] if found and found[-1] in PUBLISHED else None


def param_shapes(config) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter, in ``named_parameters`` order, built on the meta device
    (no memory)."""
    import torch  # noqa: PLC0415
    from transformers import AutoModelForImageTextToText  # noqa: PLC0415

    with torch.device("meta"):
        m = AutoModelForImageTextToText.from_config(config)
    return [(n, tuple(p.shape)) for n, p in m.named_parameters()]


def vision_train_flops(vision_config, grids) -> dict[str, float]:
    """FLOPs of one training step (forward + backward = 3 × forward, 2 × for the patch embedding, whose
    input needs no gradient; activation recompute not counted, as MFU counts) of the Qwen3-VL vision tower on images/videos of ``grids`` ((t, h, w) patches each),
    per layer on the tokens that layer sees: the patch embedding and the blocks on every patch (the
    attention within each frame: 4·d·n² a frame of n patches, forward), the merger and each deepstack
    merger on the merged tokens (a ``spatial_merge_size²`` of the patches). Matmuls only (norms,
    activations and biases are < 1%)."""
    v = vision_config
    d, inter, out = v.hidden_size, v.intermediate_size, v.out_hidden_size
    m = v.spatial_merge_size ** 2
    p_in = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    frames = [(int(t), int(h) * int(w)) for t, h, w in grids]
    n = sum(t * hw for t, hw in frames)
    sq = sum(t * hw * hw for t, hw in frames)
    fwd = {"patch_embed": 2.0 * p_in * d * n,
           "blocks": v.depth * 2.0 * (4 * d * d + 2 * d * inter) * n,
           "attention": v.depth * 4.0 * d * sq,
           "mergers": (1 + len(v.deepstack_visual_indexes)) * 2.0 * ((d * m) ** 2 + d * m * out) * (n / m)}
    res = {k: 3.0 * x for k, x in fwd.items()}
    res["patch_embed"] = 2.0 * fwd["patch_embed"]  # no gradient for the pixels: forward + weight gradient
    res["total"] = sum(res.values())
    res["patches"] = float(n)
    return res
