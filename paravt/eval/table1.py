"""Table 1 as published, beside what a run measured.

A table spec (``configs/eval/paper_table1.yaml``) names its sources (``sources:``: one tag each, the
secondary ones marked), a default ``tolerance:`` in points, and per row a ``published:`` block with one
entry per split, ``{value: 62.1, src: [W, V]}`` (optionally ``tol:``). ``reference_rows:`` are published
only (closed models): never run, never counted among the open models. :func:`load_spec` checks all of it
and names the file, row and split of anything wrong in one line.

:func:`cell_table` lists every published cell, and every cell of a row that ran, as published / measured /
difference / status; a cell without a published value says ``n.a.``, never a number of ours. The claims
(``checks:``) are computed in :mod:`paravt.eval.table1_claims`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from paravt.eval.summary import headline


class SpecError(ValueError):
    """A table spec that cannot be used; the message names the file, row and field."""


@dataclass(frozen=True)
class Cell:
    value: float
    src: tuple[str, ...]
    tol: float
    secondary: bool  # every source of the cell is secondary

    def source_text(self) -> str:
        return ", ".join(self.src) + (" (secondary)" if self.secondary else "")


CHECK_FIELDS = {"avg_relative_gain": ("row", "baseline", "value", "tolerance"),
                "split_value": ("row", "split", "value", "tolerance"),
                "format_reward": ("metric", "temperature", "tolerance", "vanilla", "paragrpo"),
                "best_open": ("row", "value")}


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _cells(where: str, pub: Any, splits: list[str], sources: dict, tol: float) -> dict[str, Cell]:
    if pub is None:
        return {}
    if not isinstance(pub, dict):
        raise SpecError(f"{where}: published must map split -> {{value, src}}")
    out = {}
    for split, c in pub.items():
        at = f"{where}, published.{split}"
        if split not in splits:
            raise SpecError(f"{at}: not a split of this table ({', '.join(splits)})")
        if not isinstance(c, dict) or not _num(c.get("value")):
            raise SpecError(f"{at}: needs a number as value, got {c!r}")
        src = c.get("src")
        if not isinstance(src, list) or not src:
            raise SpecError(f"{at}: src must list at least one source tag ({', '.join(sources)})")
        unknown = [s for s in src if s not in sources]
        if unknown:
            raise SpecError(f"{at}: unknown source tag(s) {unknown}; the spec's sources are {', '.join(sources)}")
        extra = set(c) - {"value", "src", "tol"}
        if extra:
            raise SpecError(f"{at}: unknown key(s) {sorted(extra)} (value, src, tol)")
        t = c.get("tol", tol)
        if not _num(t) or t < 0:
            raise SpecError(f"{at}: tol must be a number >= 0, got {t!r}")
        out[split] = Cell(float(c["value"]), tuple(src), float(t), all(sources[s].get("secondary") for s in src))
    return out


def load_spec(path: str | Path) -> dict[str, Any]:
    """The table spec at ``path``, checked; each row's ``published`` becomes ``{split: Cell}``. A spec
    without ``sources:`` (the smoke set) may publish nothing."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: no such table spec")
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not YAML ({' '.join(str(exc).split())})") from exc
    if not isinstance(spec, dict) or not isinstance(spec.get("rows"), list) or not spec.get("splits"):
        raise SpecError(f"{path}: needs splits: [...] and rows: [...]")
    splits = list(spec["splits"])
    sources = spec.get("sources") or {}
    if not isinstance(sources, dict) or not all(isinstance(v, dict) and v.get("what") for v in sources.values()):
        raise SpecError(f"{path}: sources must map a tag to {{what: ..., secondary: true|false}}")
    tol = spec.get("tolerance", 1.0)
    if not _num(tol) or tol < 0:
        raise SpecError(f"{path}: tolerance must be a number >= 0, got {tol!r}")
    seen: set[str] = set()
    for kind in ("rows", "reference_rows"):
        rows = spec.get(kind) or []
        for i, r in enumerate(rows):
            if not isinstance(r, dict) or not r.get("row"):
                raise SpecError(f"{path}: {kind}[{i}] needs a row name")
            name = r["row"]
            if name in seen:
                raise SpecError(f"{path}: row {name} appears twice")
            seen.add(name)
            if kind == "reference_rows" and r.get("model"):
                raise SpecError(f"{path}: reference row {name} is published only: it has no model to run")
            r["published"] = _cells(f"{path}: row {name}", r.get("published"), splits, sources, float(tol))
        spec[kind] = rows
    for i, c in enumerate(spec.get("checks") or []):
        kind = c.get("kind") if isinstance(c, dict) else None
        if kind not in CHECK_FIELDS:
            raise SpecError(f"{path}: checks[{i}]: kind must be one of {sorted(CHECK_FIELDS)}, got {kind!r}")
        missing = [k for k in CHECK_FIELDS[kind] if k not in c]
        if missing:
            raise SpecError(f"{path}: checks[{i}] ({kind}) lacks {missing}")
        for k in ("row", "baseline"):
            if k in c and c[k] not in seen:
                raise SpecError(f"{path}: checks[{i}] ({kind}): {k} {c[k]!r} is not a row of the table")
        bad = [s for s in c.get("src", []) if s not in sources]
        if bad:
            raise SpecError(f"{path}: checks[{i}] ({kind}): unknown source tag(s) {bad}")
    spec["tolerance"] = float(tol)
    spec["sources"] = sources
    return spec


def measured(res: dict | None) -> float | None:
    """A cell's headline number in points (accuracy or mIoU x 100), None when it did not run."""
    if not res or "n" not in res:
        return None
    v = headline(res)
    return None if v is None else 100 * v


def _fmt(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "n.a."
    return f"{x:+.1f}" if signed else f"{x:.1f}"


def cell_rows(spec: dict, results: dict, extra_rows: list[dict] = ()) -> list[dict[str, Any]]:
    """One record per cell worth a line: every published cell of the spec's rows and reference rows, and
    every cell of a row that ran (published or not). ``extra_rows`` are rows outside the spec that ran (a
    user's checkpoint, the smoke rows); one with ``compare_to`` is compared with that row's published cells."""
    pub_rows = {r["row"]: r for r in spec["rows"] + spec.get("reference_rows", [])}
    out = []
    for r in list(pub_rows.values()) + [r for r in extra_rows if r["row"] not in pub_rows]:
        like = r.get("compare_to")
        published = pub_rows[like]["published"] if like in pub_rows else r.get("published") or {}
        ran = r["row"] in results
        splits = spec["splits"] if r["row"] in pub_rows else \
            [s for s in spec["splits"] if s in published] + [s for s in results.get(r["row"], {}) if s not in published]
        for split in splits:
            cell: Cell | None = published.get(split)
            if cell is None and not ran:
                continue
            res = results.get(r["row"], {}).get(split)
            got = measured(res)
            diff = None if got is None or cell is None else got - cell.value
            status = "n.a." if diff is None else ("PASS" if abs(diff) <= cell.tol + 1e-9 else "FAIL")
            lost = (res or {}).get("lost")
            out.append({"row": r["row"], "split": split, "compared_to": like if like in pub_rows else None,
                        "published": None if cell is None else cell.value,
                        "source": "" if cell is None else cell.source_text() + (f" ({like}'s)" if like else ""),
                        "measured": got, "diff": diff, "tol": None if cell is None else cell.tol, "status": status,
                        "note": ("did not run" if ran and got is None else
                                 f"lost {lost}/{res['n']}" if lost else "")})
    return out


def cell_table(records: list[dict]) -> str:
    """The published-vs-measured table (markdown) and its one-line count."""
    lines = ["| row | split | published | source | measured | difference | tolerance | status |",
             "|---|---|---|---|---|---|---|---|"]
    for c in records:
        meas = _fmt(c["measured"]) + (f" ({c['note']})" if c["note"] else "")
        tol = "n.a." if c["tol"] is None else f"±{c['tol']:.1f}"
        lines.append(f"| {c['row']} | {c['split']} | {_fmt(c['published'])} | {c['source'] or 'n.a.'} | {meas} | "
                     f"{_fmt(c['diff'], signed=True)} | {tol} | {c['status']} |")
    pub = [c for c in records if c["published"] is not None and not c["compared_to"]]
    checked = [c for c in records if c["diff"] is not None]
    within = sum(c["status"] == "PASS" for c in checked)
    unpublished = sum(c["published"] is None for c in records)
    count = (f"{len(pub)} published cells in the table; {len(checked)} measured cells compared with a published "
             f"one (yours with the row they are like), {within} within tolerance; {unpublished} measured cells with "
             "nothing published (n.a.).")
    return "\n".join(lines) + "\n\n" + count + "\n"


__all__ = ["CHECK_FIELDS", "Cell", "SpecError", "cell_rows", "cell_table", "load_spec", "measured"]
