"""The broadcast transport's own parts: the bucket plan and layout (SGLang's flattened_bucket:
bytes back to back, one dtype per bucket so every tensor is aligned), and the weight-update group
between two real processes over gloo, built as SGLang builds its side."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from paravt.core.weight_sync import TensorMeta, flatten, plan_buckets, unflatten

ROOT = Path(__file__).resolve().parents[2]


def test_buckets_keep_order_size_and_one_dtype():
    metas = [TensorMeta("a", "bfloat16", (4, 4)), TensorMeta("b", "bfloat16", (8,)), TensorMeta("c", "float32", (2,)),
             TensorMeta("d", "bfloat16", (100,)), TensorMeta("e", "bfloat16", (1,))]
    plan = plan_buckets(metas, bucket_bytes=48)
    assert [[m.name for m in b] for b in plan] == [["a", "b"], ["c"], ["d"], ["e"]]  # d alone: larger than a bucket
    assert all(len({m.dtype for m in b}) == 1 for b in plan)
    with pytest.raises(ValueError):
        plan_buckets(metas, 0)


def test_flatten_and_unflatten_round_trip_exactly():
    g = torch.Generator().manual_seed(0)
    ts = {"w": torch.randn(3, 5, generator=g).to(torch.bfloat16), "v": torch.randn(7, generator=g).to(torch.bfloat16)}
    metas = [TensorMeta(k, "bfloat16", tuple(t.shape)) for k, t in ts.items()]
    flat = flatten(list(ts.values()))
    assert flat.dtype == torch.uint8 and flat.numel() == sum(m.nbytes for m in metas)
    back = dict(unflatten(flat, metas))
    assert all(torch.equal(back[k], ts[k]) for k in ts)
    with pytest.raises(ValueError, match="bytes"):
        list(unflatten(flat[:-2], metas))


RECEIVER = textwrap.dedent("""
    import sys, torch
    from paravt.core.weight_sync import TensorMeta, broadcast, init_weight_group, unflatten
    port, rank, world = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    g = init_weight_group("127.0.0.1", port, rank, world, "paravt_test", "gloo", 30)
    metas = [TensorMeta("x", "bfloat16", (64, 32)), TensorMeta("y", "bfloat16", (5,))]
    flat = torch.empty(sum(m.nbytes for m in metas), dtype=torch.uint8)
    broadcast(g, flat, 30)
    got = dict(unflatten(flat, metas))
    torch.save(got, sys.argv[4])
""")


def test_the_group_broadcasts_a_bucket_to_every_receiver(tmp_path):
    """Rank 0 (this process, which already has no default group) and two receivers in other processes."""
    from paravt.core.weight_sync import broadcast, destroy_weight_group, init_weight_group
    from paravt.models.parallel import free_port

    port = free_port()
    script = tmp_path / "recv.py"
    script.write_text(RECEIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, str(script), str(port), str(r), "3", str(tmp_path / f"r{r}.pt")], env=env)
             for r in (1, 2)]
    g = init_weight_group("127.0.0.1", port, 0, 3, "paravt_test", "gloo", 30)
    x = torch.randn(64, 32).to(torch.bfloat16)
    y = torch.arange(5).to(torch.bfloat16)
    broadcast(g, flatten([x, y]), 30)
    for p in procs:
        assert p.wait(timeout=60) == 0
    destroy_weight_group(g)
    for r in (1, 2):
        got = torch.load(tmp_path / f"r{r}.pt")
        assert torch.equal(got["x"], x) and torch.equal(got["y"], y)


def test_a_receiver_that_died_fails_the_broadcast_instead_of_hanging(tmp_path):
    from paravt.core.weight_sync import broadcast, init_weight_group
    from paravt.models.parallel import free_port

    port = free_port()
    script = tmp_path / "die.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        from paravt.core.weight_sync import init_weight_group
        init_weight_group("127.0.0.1", int(sys.argv[1]), 1, 2, "paravt_test", "gloo", 30)
        os._exit(9)  # joined, then gone before the transfer
    """))
    p = subprocess.Popen([sys.executable, str(script), str(port)], env={**os.environ, "PYTHONPATH": str(ROOT)})
    g = init_weight_group("127.0.0.1", port, 0, 2, "paravt_test", "gloo", 20)
    p.wait(timeout=60)
    with pytest.raises(Exception):  # noqa: B017 - gloo's own error (connection closed or timeout), never a hang
        broadcast(g, torch.zeros(64 << 20, dtype=torch.uint8), 20)
