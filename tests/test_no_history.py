"""The repository speaks to its users: no development history (work-period labels, issue numbers)
in the README, the docs, the code, comments, help texts or the tests. History is in git."""

from __future__ import annotations

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
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if not p.is_file() or p.suffix not in SUFFIXES or any(part in SKIP_DIRS or part.startswith(".venv")
                                                                for part in rel.parts):
            continue
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
