"""torchrun's stderr, whole, in a log file under output_dir; on the terminal without torchrun's own report.

When a worker fails, torchrun (its elastic agent) prints its own traceback (``ChildFailedError`` raised in
``torch/distributed/launcher/api.py``), a ``FAILED`` block (root cause, rank, pid, exit code) and ``E…``
lines from ``torch/distributed/elastic`` around the one line a stage prints when it stops on purpose
(bad input: exit 2; lost work: exit 3). The launchers (``scripts/_common.sh:run_supervised``) pass
torchrun's stderr through this filter: every line goes to the log file; the terminal gets every line but
the agent's traceback, its failure block and the elastic package's error lines, and the launcher then
prints the log's path and the stage's line. A worker's own traceback (a crash) stays on the terminal.

    cmd 2> >(python -m paravt.core.launch_log FILE >&2)

Standard library only: it runs beside torchrun and must not hold a GIL-heavy import.
"""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path
from typing import IO, Iterable

# glog-style lines of torch's elastic agent: "E1203 21:18:47.834000 397 torch/distributed/elastic/...] ..."
ELASTIC_ERROR = re.compile(r"^E\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ torch/distributed/elastic/")
AGENT_FRAME = re.compile(r'^\s+File ".*(?:/bin/torchrun|torch/distributed/(?:run|launcher/api|elastic/)[^"]*)", line')
CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
RULE = "=" * 60


def terminal_lines(lines: Iterable[str]) -> Iterable[str]:
    """The lines of torchrun's stderr that go to the terminal (see the module docstring)."""
    held: str | None = None  # "Traceback (most recent call last):", until the next line says whose
    hiding, rules = False, 0
    for line in lines:
        if hiding:  # the agent's traceback (indented frames), then ChildFailedError's block between two rules
            if rules < 0:
                if line.startswith(CHILD_FAILED):
                    rules = 0
                elif not line[:1].isspace():  # another error of the agent's (a rendezvous timeout): its line shows
                    hiding = False
                    yield line
            elif line.rstrip("\n") == RULE:
                rules += 1
                hiding = rules < 2
            continue
        if held is not None:
            first, held = held, None
            if AGENT_FRAME.match(line):
                hiding, rules = True, -1  # -1: the rules count only once ChildFailedError is seen
                continue
            yield first
        if line.startswith("Traceback (most recent call last):"):
            held = line
            continue
        if ELASTIC_ERROR.match(line):
            continue
        yield line
    if held is not None:
        yield held


def run(log_path: Path, src: IO[str], dst: IO[str]) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", buffering=1) as log:
        def logged() -> Iterable[str]:
            for line in src:
                log.write(line)
                yield line
        for line in terminal_lines(logged()):
            dst.write(line)
            dst.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    a = sys.argv[1:] if argv is None else argv
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # Ctrl-C reaches the process group: this ends
        signal.signal(sig, signal.SIG_IGN)                       # at EOF, after torchrun's last line
    if len(a) != 1:
        print("usage: CMD 2> >(python -m paravt.core.launch_log LOG_FILE >&2)", file=sys.stderr)
        return 2
    src = open(sys.stdin.fileno(), errors="replace", closefd=False)  # noqa: SIM115 - stdin for the process' life
    return run(Path(a[0]), src, sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
