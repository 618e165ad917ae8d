"""The configuration of Qwen3-VL-8B-Instruct (its published config.json, written out), for measuring
the 8B path without its weights: random init at full width, any depth, or the meta device for
names and shapes only (benchmarks, the GPU check)."""

from __future__ import annotations


def qwen3vl_8b_config(num_hidden_layers: int = 36, vision_depth: int = 27):
    """``Qwen3VLConfig`` of Qwen3-VL-8B (text: hidden 4096, 36 layers, 32 heads, 8 KV heads, head_dim
    128, intermediate 12288, vocab 151936, untied lm_head; vision: 27 blocks of width 1152, patch
    16, spatial merge 2, deepstack at 8/16/24), optionally at reduced depth."""
    from transformers import Qwen3VLConfig  # noqa: PLC0415

    deep = [i for i in (8, 16, 24) if i < vision_depth] or [vision_depth - 1]
    return Qwen3VLConfig(
        text_config={"hidden_size": 4096, "num_hidden_layers": num_hidden_layers, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
                     "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "hidden_act": "silu",
                     "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                         "mrope_section": [24, 20, 20], "mrope_interleaved": True},
                     "tie_word_embeddings": False},
        vision_config={"depth": vision_depth, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                       "out_hidden_size": 4096, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "num_position_embeddings": 2304, "deepstack_visual_indexes": deep, "in_channels": 3},
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        tie_word_embeddings=False)


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
