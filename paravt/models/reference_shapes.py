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
