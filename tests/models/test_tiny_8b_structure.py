"""The tiny model with Qwen3-VL-8B's structure (``paravt.models.tiny.tiny_8b_structure_shape``) has the
8B's structure where the fast paths' equality tests depend on it, at tiny width."""

from __future__ import annotations

import json

import torch

from paravt.models.reference_shapes import qwen3vl_8b_config
from paravt.models.tiny import tiny_8b_structure_shape


def test_the_shape_has_the_8bs_structure():
    ref = qwen3vl_8b_config()
    t, v = ref.text_config, ref.vision_config
    s = tiny_8b_structure_shape()
    assert not s.tie_word_embeddings and not ref.tie_word_embeddings
    assert s.head_dim == t.head_dim == 128
    assert s.num_attention_heads // s.num_key_value_heads == t.num_attention_heads // t.num_key_value_heads == 4
    assert s.mrope_section == t.rope_parameters["mrope_section"] and s.rope_theta == t.rope_parameters["rope_theta"]
    assert s.vision_hidden_size // s.vision_num_heads == v.hidden_size // v.num_heads == 72
    assert (s.patch_size, s.spatial_merge_size, s.temporal_patch_size) == (v.patch_size, v.spatial_merge_size,
                                                                           v.temporal_patch_size)
    # three deepstack levels from intermediate blocks (never the last), more text layers than levels
    assert len(s.deepstack_visual_indexes) == len(v.deepstack_visual_indexes) == 3
    assert max(s.deepstack_visual_indexes) < s.vision_depth - 1 and max(v.deepstack_visual_indexes) < v.depth - 1
    assert s.num_hidden_layers > len(s.deepstack_visual_indexes)


def test_the_saved_model_has_a_separate_lm_head(tiny8b_dir):
    from paravt.models.loading import load_model

    cfg = json.loads((tiny8b_dir / "config.json").read_text())
    assert cfg["vision_config"]["deepstack_visual_indexes"] == tiny_8b_structure_shape().deepstack_visual_indexes
    m = load_model(tiny8b_dir)
    head, emb = m.get_output_embeddings().weight, m.get_input_embeddings().weight
    assert head.data_ptr() != emb.data_ptr() and not torch.equal(head, emb)
