"""torchrun's stderr: whole in the log file, on the terminal without the agent's own report
(``paravt.core.launch_log``), checked on what torch's elastic agent prints."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from paravt.core.launch_log import run, terminal_lines

AGENT_REPORT = """E1203 21:18:47.834000 397 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 3) local_rank: 0 (pid: 402) of binary: /v/bin/python3
Traceback (most recent call last):
  File "/v/bin/torchrun", line 8, in <module>
    sys.exit(main())
             ^^^^^^
  File "/v/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
paravt.rl.train FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  exitcode  : 3 (pid: 402)
============================================================
"""

WORKER_CRASH = """step 1 done
Traceback (most recent call last):
  File "/repo/paravt/rl/train.py", line 12, in <module>
    main()
ZeroDivisionError: division by zero
"""


def test_the_agents_report_is_kept_from_the_terminal_and_a_workers_crash_is_not():
    lines = (WORKER_CRASH + AGENT_REPORT + "after\n").splitlines(keepends=True)
    shown = "".join(terminal_lines(lines))
    assert shown == WORKER_CRASH + "after\n"


def test_another_agent_error_shows_its_last_line():
    text = ("Traceback (most recent call last):\n  File \"/v/bin/torchrun\", line 8, in <module>\n    sys.exit(main())\n"
            "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: join timed out\n")
    assert "".join(terminal_lines(text.splitlines(keepends=True))) == \
        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: join timed out\n"


def test_every_line_reaches_the_log(tmp_path):
    src, dst = io.StringIO(WORKER_CRASH + AGENT_REPORT), io.StringIO()
    run(tmp_path / "logs/torchrun.log", src, dst)
    assert (tmp_path / "logs/torchrun.log").read_text() == WORKER_CRASH + AGENT_REPORT
    assert dst.getvalue() == WORKER_CRASH


def test_on_the_real_torchrun_output(tmp_path):
    """torchrun itself (the pinned torch), a worker that exits 3: only the worker's line on the terminal."""
    (tmp_path / "failmod.py").write_text("import sys\nprint('the one line', file=sys.stderr)\nraise SystemExit(3)\n")
    torchrun = Path(sys.executable).with_name("torchrun")
    p = subprocess.run(f"{torchrun} --standalone --max-restarts=0 --nproc_per_node=1 failmod.py "
                       f"2> >({sys.executable} -m paravt.core.launch_log {tmp_path}/t.log >&2); wait",
                       shell=True, executable="/bin/bash", cwd=tmp_path, capture_output=True, text=True, timeout=120)
    log = (tmp_path / "t.log").read_text()
    assert "ChildFailedError" in log and "Root Cause" in log and "the one line" in log
    assert "the one line" in p.stderr and "ChildFailedError" not in p.stderr and "FAILED" not in p.stderr, p.stderr
