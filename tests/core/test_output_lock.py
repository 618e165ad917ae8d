"""``OutputLock``: one run per output directory, and a filesystem without flock (Lustre mounted without it)
that warns once, naming the folder, and lets the run go on without the lock."""

from __future__ import annotations

import errno
import fcntl

import pytest

from paravt.core import procs
from paravt.core.procs import OutputLock, OutputLockBusy


def test_a_second_lock_on_the_same_folder_is_refused_with_the_holders_pid(tmp_path):
    with OutputLock(tmp_path):
        with pytest.raises(OutputLockBusy, match=r"is in use by another run \(pid \d+\)"):
            OutputLock(tmp_path).acquire()
    with OutputLock(tmp_path):  # released: free again
        pass


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK])
def test_a_filesystem_without_flock_warns_once_and_goes_on(tmp_path, monkeypatch, capsys, code):
    def no_flock(fd, op):
        raise OSError(code, "flock not supported")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.setattr(procs, "_WARNED", set())
    for _ in range(3):  # every acquire of the folder goes on; one line in all
        with OutputLock(tmp_path / "out") as lock:
            assert lock.path.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: {tmp_path / 'out'} is on a filesystem without flock"), err


def test_another_flock_error_is_still_raised(tmp_path, monkeypatch):
    def broken(fd, op):
        raise OSError(errno.EIO, "input/output error")

    monkeypatch.setattr(fcntl, "flock", broken)
    with pytest.raises(OSError, match="input/output error"):
        OutputLock(tmp_path).acquire()
