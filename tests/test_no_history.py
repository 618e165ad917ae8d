"""The repository speaks to its users: no development history (work-period labels, issue numbers)
in the README, the docs, the code, comments, help texts or the tests. History is in git."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A work period (the word session with a number, or "this" + "session") or an issue number ("#" with 1-3 digits); CSS colours and
# Markdown headings are not history.
PATTERN = re.compile(r"(?i)\bsessions? ?-?\d+|\bthis session\b|(?<![\w&#/:'\"])#\d{1,3}\b(?![;'\")])")
SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".txt", ".toml", ".cfg", ".example"}
SKIP_DIRS = {".git", "runs", "node_modules", "__pycache__", ".cache"}


def history_mentions(root: Path = ROOT) -> list[str]:
    hits = []
    files = []
    for d, dirs, names in os.walk(root):
        # pruned while walking: the virtual environments alone hold ~10^5 files
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith(".venv"))
        files += [Path(d) / n for n in names if Path(n).suffix in SUFFIXES]
    for p in sorted(files):
        rel = p.relative_to(root)
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            m = PATTERN.search(line)
            if m:
                hits.append(f"{rel}:{i}: {m.group(0)!r} in {line.strip()[:100]}")
    return hits


def test_no_work_periods_or_issue_numbers_anywhere():
    assert history_mentions() == []


def test_the_check_finds_them(tmp_path):
    (tmp_path / "a.py").write_text("x = 1  # fixed in " + "sess" + "ion 14\ncolor = '#f4f5f7'\ncss = 'color:#222;fill:#555'\n")
    issue, period = "#" + "25", "Sess" + "ions 1-13"  # built here so this file holds no such text itself
    (tmp_path / "b.md").write_text(f"As {issue} asked.\n## Heading\n{period} used it.\n")
    hits = history_mentions(tmp_path)
    assert [h.split(":")[0] + ":" + h.split(":")[1] for h in hits] == ["a.py:1", "b.md:1", "b.md:3"]
