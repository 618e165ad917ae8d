"""The dry run's FLOPs of an SFT step equal the analytic count: the vision tower's
(``reference_shapes.vision_train_flops``) plus the text model's 6 x matmul parameters x tokens, causal
attention per packed sequence (3 x 4·q·len²/2 a layer) and the head on the supervised positions only."""

from __future__ import annotations

from tests.dryrun.conftest import TEXT, VISION, dry_run


def analytic(work: dict) -> float:
    from transformers import Qwen3VLConfig

    from paravt.models.reference_shapes import vision_train_flops

    h, inter = TEXT["hidden_size"], TEXT["intermediate_size"]
    layers, vocab = TEXT["num_hidden_layers"], TEXT["vocab_size"]
    q = TEXT["num_attention_heads"] * TEXT["head_dim"]
    kv = TEXT["num_key_value_heads"] * TEXT["head_dim"]
    tokens = sum(work["examples"])
    matmul_params = h * q + 2 * h * kv + q * h + 3 * h * inter
    text = 6 * matmul_params * tokens * layers
    attention = layers * 3 * 4 * q * sum(n * n for n in work["examples"]) / 2
    head = 6 * h * vocab * work["supervised_tokens_per_pack"]
    vc = Qwen3VLConfig(text_config=TEXT, vision_config=VISION).vision_config
    grids = [[1, *work["frame_grid"]]] * sum(work["frames"])
    return text + attention + head + vision_train_flops(vc, grids)["total"]


def test_sft_step_flops_equal_the_analytic_count(small_config, tmp_path):
    proc, res = dry_run("configs/sft/qwen3vl_8b.yaml", "--model-config", str(small_config), "--gpus", "2",
                        "global_batch_size=2", "max_length=2048", "video.max_frames=4", "--answer-tokens", "64",
                        json_out=tmp_path / "sft.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    work, f = res["work"], res["figures"]
    assert work["packs_per_rank"] == 1 and sum(work["examples"]) == 2048 and sum(work["frames"]) > 4
    want = analytic(work)
    assert abs(f["flops.model"] / want - 1) < 0.02, (f["flops.model"], want)
    # activation recompute runs the checkpointed blocks' forward again: executed > model FLOPs
    assert f["flops.executed"] > f["flops.model"]
