"""A checkpoint is COMPLETE only when every rank's files are visible to rank 0 (on several nodes they are
written by other hosts into one shared output_dir)."""

import pytest
import torch

from paravt.models.parallel import COMPLETE, DistInfo, mark_complete


def test_a_checkpoint_missing_a_ranks_file_is_never_marked_complete(tmp_path):
    d = DistInfo(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
    step = tmp_path / "step_000001"
    step.mkdir()
    (step / "trainer_state.json").write_text("{}")
    (step / "rank0.pt").write_bytes(b"x")
    with pytest.raises(RuntimeError, match="rank1.pt not visible after 0.2 s"):
        mark_complete(step, d, fs_timeout_s=0.2)
    assert not (step / COMPLETE).exists()
    (step / "rank1.pt").write_bytes(b"x")  # the other node's file arrives
    mark_complete(step, d, fs_timeout_s=0.2)
    assert (step / COMPLETE).exists()
