"""The README is the front page: short, its first screen gives the two commands, CI runs the one it shows,
and every link in the user-facing documents leads to a file and a heading that exist."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/GUIDE.md", "docs/RESULTS.md", "benchmarks/README.md", "requirements/README.md",
        "experiments/README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in md.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        slug = github_slug(line.lstrip("#"))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_slug_matches_github():
    assert github_slug(" Faults, bad input and kill -9") == "faults-bad-input-and-kill--9"
    assert github_slug(" GPU check (`gpu_check.py`)") == "gpu-check-gpu_checkpy"
    assert github_slug(" On an 8-GPU node: memory, disk, metrics, troubleshooting") == \
        "on-an-8-gpu-node-memory-disk-metrics-troubleshooting"


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; reference material belongs in docs/GUIDE.md"
    first_screen = "\n".join(lines[:30])
    assert "bash scripts/quickstart.sh" in first_screen
    assert "bash scripts/test.sh" in first_screen


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    shown = re.search(r"^(bash scripts/test\.sh)\s+#", readme, re.M)
    assert shown, "the README's first code block shows no test command"
    ci = (ROOT / ".ci/run").read_text()
    assert re.search(r"^\s*group default " + re.escape(shown.group(1)) + r"\s*$", ci, re.M), \
        ".ci/run's default group does not run the README's test command as shown"


@pytest.mark.parametrize("doc", DOCS)
def test_links_resolve(doc):
    src = ROOT / doc
    broken = []
    for target in LINK.findall(src.read_text()):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (src.parent / path).resolve() if path else src
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading '#{anchor}' in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc}: " + "; ".join(broken)
