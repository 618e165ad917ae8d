"""Sharded start-up (meta init, rank 0 reads the checkpoint, shards broadcast) gives the same model
as loading it whole on every rank: the same weights and buffers, then bitwise the same losses and
weights after 2 AdamW steps, on 2 FSDP2 ranks over gloo. The broadcast weight sync's buckets,
gathered from those shards, hold exactly the full weights."""

from __future__ import annotations

import json

from tests.helpers import torchrun_script


def test_sharded_startup_equals_whole_loading_on_two_ranks(tiny_dir, tmp_path):
    out = tmp_path / "result.json"
    r = torchrun_script("tests/models/fsdp2_startup_script.py", str(tiny_dir), str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["same_start"] and res["buffers_equal"]
    assert res["losses_sharded"] == res["losses_whole"]  # bitwise: the same floats
    assert res["same_end"]
    assert res["buckets_ok"] and res["n_buckets"] > 1

def test_weight_buckets_carry_the_checkpoint_names(tiny_dir):
    """The names a server's loader receives are the names save_pretrained writes (tied lm_head once)."""
    import torch
    from safetensors import safe_open

    from paravt.models import parallel
    from paravt.models.loading import load_model

    m = load_model(str(tiny_dir))
    keys = set()
    for f in tiny_dir.glob("*.safetensors"):
        with safe_open(str(f), "pt") as fh:
            keys |= set(fh.keys())
    b = parallel.weight_buckets(m, torch.bfloat16, 1 << 20, True)
    names = [x.name for bucket in b.plan for x in bucket]
    assert len(names) == len(set(names)) and set(names) == keys
    assert all(x.dtype == "bfloat16" for bucket in b.plan for x in bucket)
    assert sum(flat.numel() for flat in b) == b.nbytes
