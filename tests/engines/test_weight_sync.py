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
    from paravt.core.weight_sync import TensorMeta, broadcast, destroy_weight_group, init_weight_group, unflatten
    port, rank, world = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    g = init_weight_group("127.0.0.1", port, rank, world, f"paravt_test_{port}", "gloo", 30)
    metas = [TensorMeta("x", "bfloat16", (64, 32)), TensorMeta("y", "bfloat16", (5,))]
    flat = torch.empty(sum(m.nbytes for m in metas), dtype=torch.uint8)
    broadcast(g, flat, 30)
    got = dict(unflatten(flat, metas))
    torch.save(got, sys.argv[4])
    # leave the group while rank 0 (the store's server) is still there: a receiver whose peer is gone
    # may abort in gloo's teardown
    destroy_weight_group(g)
    open(sys.argv[4] + ".done", "w").close()
""")


MESH_FAILED = "connectFullMesh failed"  # gloo's own connection between the ranks, before any group is returned


def _broadcast_to_two_receivers(tmp_path: Path) -> str | None:
    """Rank 0 here, ranks 1 and 2 in other processes, one group name per try (a failed group stays registered
    in this process). None when every receiver got the bucket exactly, else what went wrong."""
    from paravt.core.weight_sync import broadcast, destroy_weight_group, init_weight_group
    from paravt.models.parallel import free_port

    tmp_path.mkdir()
    port = free_port()
    script = tmp_path / "recv.py"
    script.write_text(RECEIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    logs = [tmp_path / f"r{r}.log" for r in (1, 2)]
    procs = [subprocess.Popen([sys.executable, str(script), str(port), str(r), "3", str(tmp_path / f"r{r}.pt")], env=env,
                              stdout=open(log, "w"), stderr=subprocess.STDOUT) for r, log in zip((1, 2), logs)]
    x = torch.randn(64, 32).to(torch.bfloat16)
    y = torch.arange(5).to(torch.bfloat16)
    try:
        try:
            g = init_weight_group("127.0.0.1", port, 0, 3, f"paravt_test_{port}", "gloo", 30)
            broadcast(g, flatten([x, y]), 30)
        except (RuntimeError, TimeoutError) as exc:
            for p in procs:
                p.wait(timeout=60)
            return f"{exc}\n" + "\n".join(log.read_text()[-1500:] for log in logs)
        codes = [p.wait(timeout=60) for p in procs]
        destroy_weight_group(g)
    finally:
        for p in procs:
            p.kill()
    if codes != [0, 0]:
        return f"receivers exited {codes}\n" + "\n".join(log.read_text()[-1500:] for log in logs)
    for r in (1, 2):
        got = torch.load(tmp_path / f"r{r}.pt")
        assert torch.equal(got["x"], x) and torch.equal(got["y"], y)
    return None


def test_the_group_broadcasts_a_bucket_to_every_receiver(tmp_path):
    """Rank 0 (this process, which already has no default group) and two receivers in other processes. On a
    loaded machine gloo's own mesh between the ranks can fail while they connect (a peer closes the connection
    before the group exists, seen once beside CI's other track): that failure alone, named by gloo, gets one more
    try with a fresh group; any other failure, or a second one, fails the test."""
    problem = _broadcast_to_two_receivers(tmp_path / "try1")
    if problem is not None and MESH_FAILED in problem:
        print(f"gloo's mesh failed on the first try, trying once more:\n{problem}")
        problem = _broadcast_to_two_receivers(tmp_path / "try2")
    assert problem is None, problem


def test_a_receiver_that_died_fails_the_broadcast_instead_of_hanging(tmp_path):
    from paravt.core.weight_sync import broadcast, init_weight_group
    from paravt.models.parallel import free_port

    port = free_port()
    script = tmp_path / "die.py"
    script.write_text(textwrap.dedent("""
        import os, sys, torch
        from paravt.core.weight_sync import broadcast, init_weight_group
        port = int(sys.argv[1])
        g = init_weight_group("127.0.0.1", port, 1, 2, f"paravt_test_{port}", "gloo", 30)
        broadcast(g, torch.zeros(1, dtype=torch.uint8), 30)  # both ends have joined
        os._exit(9)  # then gone before the transfer
    """))
    p = subprocess.Popen([sys.executable, str(script), str(port)], env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        g = init_weight_group("127.0.0.1", port, 0, 2, f"paravt_test_{port}", "gloo", 20)
        broadcast(g, torch.zeros(1, dtype=torch.uint8), 20)
        assert p.wait(timeout=60) == 9
        with pytest.raises(Exception):  # noqa: B017 - gloo's own error (connection closed or timeout), never a hang
            broadcast(g, torch.zeros(64 << 20, dtype=torch.uint8), 20)
    finally:
        p.kill()


LEAVES_GROUP_OPEN = textwrap.dedent("""
    import atexit, os, sys

    def gloo_threads():
        names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
        return sum(n.startswith(("pt_gloo", "gloo_")) for n in names)

    # registered before weight_sync's own hook, so it runs after it (atexit is last in, first out)
    atexit.register(lambda: print("gloo threads at exit:", gloo_threads(), flush=True))
    import torch
    from paravt.core.weight_sync import broadcast, init_weight_group
    rank = int(sys.argv[2])
    g = init_weight_group("127.0.0.1", int(sys.argv[1]), rank, 2, sys.argv[3], "gloo", 30)
    t = torch.arange(4, dtype=torch.uint8) if rank == 0 else torch.zeros(4, dtype=torch.uint8)
    broadcast(g, t, 30)
    print("gloo threads after the transfer:", gloo_threads(), flush=True)
    # no close: the group is left open, as a trainer or server that simply ends leaves it
""")


def test_a_group_left_open_is_closed_before_the_interpreter_shuts_down(tmp_path):
    """Gloo's worker threads must end while Python still runs: one that releases the last reference to
    a sent tensor during interpreter shutdown aborts the process ("terminate called without an active
    exception", exit -6) after its work is done. Both ends exit 0 with no gloo thread left at exit."""
    from paravt.models.parallel import free_port

    port = free_port()
    script = tmp_path / "open.py"
    script.write_text(LEAVES_GROUP_OPEN)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, str(script), str(port), str(r), "paravt_test"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        assert "gloo threads after the transfer: 0" not in out  # the threads existed
        assert "gloo threads at exit: 0" in out, out


def test_close_ends_the_groups_threads_and_is_idempotent(tmp_path):
    from paravt.core.weight_sync import broadcast, destroy_weight_group, init_weight_group
    from paravt.models.parallel import free_port

    def gloo_threads():  # this process may hold other tests' groups: count, before and after
        names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
        return sum(n.startswith(("pt_gloo", "gloo_")) for n in names)

    before = gloo_threads()
    port = free_port()
    script = tmp_path / "open.py"
    script.write_text(LEAVES_GROUP_OPEN)
    p = subprocess.Popen([sys.executable, str(script), str(port), "1", "paravt_close"], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         stdout=subprocess.PIPE, text=True)
    g = init_weight_group("127.0.0.1", port, 0, 2, "paravt_close", "gloo", 30)
    broadcast(g, torch.arange(4, dtype=torch.uint8), 30)
    p.communicate(timeout=120)
    assert gloo_threads() > before
    destroy_weight_group(g)
    destroy_weight_group(g)
    assert gloo_threads() == before
    with pytest.raises(RuntimeError, match="closed"):
        broadcast(g, torch.zeros(4, dtype=torch.uint8), 5)


SENDER_UNDER_TORCHRUN = textwrap.dedent("""
    import os, sys, time, torch
    from paravt.core.weight_sync import broadcast, destroy_weight_group, init_weight_group
    port, done = int(sys.argv[1]), sys.argv[2]
    g = init_weight_group("127.0.0.1", port, 0, 2, f"paravt_test_{port}", "gloo", 30, join_timeout_s=60)
    broadcast(g, torch.arange(5).to(torch.bfloat16).view(torch.uint8).clone(), 30)
    print("sent under", os.environ.get("TORCHELASTIC_USE_AGENT_STORE"))
    deadline = time.monotonic() + 60  # the receiver leaves first (see RECEIVER)
    while not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(0.05)
    destroy_weight_group(g)
""")


@pytest.mark.launcher
def test_the_group_forms_when_rank_0_runs_under_torchrun(tmp_path):
    """torchrun sets TORCHELASTIC_USE_AGENT_STORE=True in its workers; torch's tcp:// rendezvous then
    makes rank 0 a store client too and nobody serves the store. Rank 0 here is a torchrun worker, the
    receiver a plain process (as a rollout server's worker is)."""
    from paravt.models.parallel import free_port

    port = free_port()
    (tmp_path / "send.py").write_text(SENDER_UNDER_TORCHRUN)
    (tmp_path / "recv.py").write_text(RECEIVER.replace('TensorMeta("x", "bfloat16", (64, 32)), ', ""))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    recv = subprocess.Popen([sys.executable, str(tmp_path / "recv.py"), str(port), "1", "2", str(tmp_path / "r.pt")],
                            env=env)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                        str(tmp_path / "send.py"), str(port), str(tmp_path / "r.pt.done")], env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "sent under True" in r.stdout
    assert recv.wait(timeout=60) == 0
    assert torch.equal(torch.load(tmp_path / "r.pt")["y"], torch.arange(5).to(torch.bfloat16))


def test_a_join_nobody_answers_fails_within_its_timeout_naming_the_address(monkeypatch):
    """Rank 0 waits for a server that never joins: one TimeoutError naming the address, after the
    join timeout (not the transfers' timeout), also as a torchrun worker would see it."""
    from paravt.core.weight_sync import init_weight_group
    from paravt.models.parallel import free_port

    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    port = free_port()
    with pytest.raises(TimeoutError, match=f"127.0.0.1:{port}.*within 2 s"):
        init_weight_group("127.0.0.1", port, 0, 2, "paravt_test_nobody", "gloo", 600, join_timeout_s=2)
    nobody = free_port()  # a client whose store nobody serves
    with pytest.raises(TimeoutError, match=f"127.0.0.1:{nobody}: rank 1 of 2 could not join within 2 s"):
        init_weight_group("127.0.0.1", nobody, 1, 2, "paravt_test_none", "gloo", 600, join_timeout_s=2)
