"""The dry run's host/device bookkeeping: a host tensor moved to the device keeps its value beside the
fake tensor, so reading it back returns the true value and counts one host sync (a whole ``tolist`` one);
a value no fake tensor has reads as a placeholder and its call site is listed."""

from __future__ import annotations

import torch

from paravt.dryrun.fake import MARKER, HostMode, make_fake_mode


def test_reads_of_device_values():
    fm = make_fake_mode()
    host = HostMode(fm)
    with fm, host:
        ids = torch.tensor([[3, 7, 7, 1]]).to(MARKER)  # a host-to-device copy
        mask = ids == 7
        assert int(mask.sum()) == 2
        assert ids[0].tolist() == [3, 7, 7, 1]
        hidden = torch.zeros(1, 4, 8)  # made on the device: no value
        assert hidden[mask].shape == (2, 8)  # a boolean index with known values: a read
        unknown = float(hidden.sum())
        host_only = torch.tensor([1, 2, 3]).sum().item()  # the host's own tensors: no sync
    assert unknown == 1 and host_only == 6
    assert host.syncs == 4 and host.reads == 1 + 4 + 1 + 1
    assert sum(host.placeholders.values()) == 1
    assert any("test_host.py" in site for site in host.placeholders)
