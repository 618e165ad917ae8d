"""The GPU split of ``run_rl.sh`` without a ``rollout.layout`` (:func:`paravt.rl.layout.plan` uses it): which
GPUs of this node train, and how many trainer ranks the whole run has, before torchrun starts (also
``python -m paravt.rl.launch NGPU ROLLOUT_GPUS``, ``-`` for an empty list).

* Recipe GPU numbers are the job's logical indices; a scheduler's ``CUDA_VISIBLE_DEVICES`` maps them
  to physical ones, so trainers get physical ids (the servers' launcher maps theirs the same way).
* The rollout servers run on the node of trainer rank 0 (node rank 0), which launches them; their GPUs
  are taken from the trainers there only. Every other node trains on all its GPUs. torch's c10d
  rendezvous numbers the nodes by address, so the launcher has the shared-folder check
  (:mod:`paravt.core.shared_fs`) stop a run whose global rank 0 is not on node 0 (``PARAVT_RANK0_NODE``).
"""

from __future__ import annotations

import os
import sys


def trainer_gpus(ngpu: int, rollout: list[int], visible: list[str], node_rank: int) -> list[str]:
    """Physical ids of this node's trainer GPUs."""
    ids = visible or [str(i) for i in range(ngpu)]
    taken = set(rollout) if node_rank == 0 else set()
    return [ids[i] for i in range(ngpu) if i not in taken]


def world_size(ngpu: int, rollout: list[int], nnodes: int, nproc: int | None) -> int:
    """Trainer ranks of the run: an explicit NPROC on every node, else node 0's GPUs less the rollout
    GPUs plus every GPU of the other nodes (nodes alike)."""
    if nproc:
        return nproc * nnodes
    return (ngpu - len(set(rollout))) + (nnodes - 1) * ngpu


def main(argv: list[str] | None = None) -> int:
    a = sys.argv[1:] if argv is None else argv
    ngpu = int(a[0])
    rollout = [int(x) for x in a[1].split(",")] if len(a) > 1 and a[1] not in ("", "-") else []
    visible = [x for x in os.environ.get("PARAVT_VISIBLE_DEVICES", "").split(",") if x.strip()]
    node_rank = int(os.environ.get("NODE_RANK", 0))
    nnodes = int(os.environ.get("NNODES", 1))
    nproc = int(os.environ["NPROC"]) if os.environ.get("NPROC") else None
    gpus = trainer_gpus(ngpu, rollout, visible, node_rank)
    print(",".join(gpus) or "-", nproc or len(gpus), world_size(ngpu, rollout, nnodes, nproc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
