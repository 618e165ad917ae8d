"""Run every Table-1 row (or the CPU smoke rows) and print the table beside the paper's numbers.

    python -m paravt.eval.reproduce --table configs/eval/paper_table1.yaml --data_root /data/bench --out runs/table1
    python -m paravt.eval.reproduce --row mine --model runs/paragrpo_8b/final --data_root /data/bench \
        --rl_metrics runs/paragrpo_8b/metrics.jsonl            # your checkpoint as its own row
    python -m paravt.eval.reproduce --smoke --model runs/quickstart/sft/final --synthetic runs/quickstart/world/local
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from paravt.core.config import load_config
from paravt.eval.driver import EvalConfig, Evaluator, engine_key, headline, lost_work
from paravt.eval.identity import ResumeMismatch


def row_overrides(r: dict, split: str) -> dict:
    """The driver settings of one Table-1 cell: the row's, with its ``charades:`` block on Charades-STA."""
    over = {k: v for k, v in r.items() if k not in ("published", "charades")}
    if split == "charades_sta":
        over.update(r.get("charades") or {})
    return over


def _key(o: str) -> str:
    return o.split("=", 1)[0].strip()


def cell_args(defaults: list[str], row: dict, split: str, user: list[str], out: str) -> list[str]:
    """The driver's settings of one cell, later ones winning: the run's defaults (the paper's
    protocol, the smoke set's paths), the row's own settings, then the user's overrides, which win
    over everything (a user's ``nframes=32`` is never replaced by the protocol's 64)."""
    over = row_overrides(row, split)
    return (defaults + [f"{k}={v}" for k, v in over.items() if v != ""] + [f"out={out}", f"splits=[{split}]"]
            + list(user))


def protocol_changes(user: list[str], protocol: dict) -> list[str]:
    """The user's overrides that change a setting of the paper's protocol, as ``key=new (paper: old)``."""
    out = []
    for o in user:
        k = _key(o)
        if k in protocol and str(protocol[k]) != o.split("=", 1)[1].strip():
            out.append(f"{k}={o.split('=', 1)[1].strip()} (paper: {protocol[k]})")
    return out


def run_rows(rows, splits, defaults: list[str], out: str, user: list[str] = ()) -> tuple[dict, list[str]]:
    """Evaluate each row that names a model (its own id or path; a row never borrows another's);
    a row without one is skipped with its line. Returns the results and one line per cell that lost
    work (samples lost, a split that did not run)."""
    results, lost = {}, []
    for r in rows:
        if not r.get("model"):
            print(f"skip {r['row']}: no public checkpoint id configured (fill 'model' in the table config, or "
                  "evaluate your checkpoint as its own row: --row NAME --model PATH)")
            continue
        shared = None  # the cell whose engines (launched servers, or the in-process model) later cells use
        try:
            for split in splits:
                cfg = load_config(EvalConfig, None, cell_args(defaults, r, split, list(user), out))
                ev = Evaluator(cfg)
                if shared is not None and engine_key(cfg) == engine_key(shared.cfg):
                    ev.adopt(shared)  # one server for the row's splits, not one load of the 8B per cell
                else:
                    if shared is not None:
                        shared.stop_engines()
                    shared = ev
                res = ev.run(keep_engines=True)
                results.setdefault(r["row"], {})[split] = res[split]
                lost += [f"{r['row']} / {line}" for line in lost_work({split: res[split]}, cfg.max_error_fraction)]
        finally:
            if shared is not None:
                shared.stop_engines()
    return results, lost


def table(results: dict, rows: list[dict], splits: list[str]) -> str:
    lines = ["| row | " + " | ".join(splits) + " | avg |", "|---|" + "---|" * (len(splits) + 1)]
    for r in rows:
        res = results.get(r["row"], {})
        pub = r.get("published", {}) or {}
        cells, vals = [], []
        for s in splits:
            v = headline(res.get(s, {})) if s in res else None
            if v is not None:
                vals.append(100 * v)
            p = pub.get(s)
            short = (res.get(s) or {}).get("lost") or ("n" not in res[s] if s in res else False)
            mark = ""
            if s in res and short:
                mark = " (did not run)" if "n" not in res[s] else f" (lost {res[s]['lost']}/{res[s]['n']})"
            cells.append(("" if v is None else f"{100 * v:.1f}") + mark + (f" [paper {p}]" if p is not None else ""))
        avg = f"{sum(vals) / len(vals):.1f}" if vals and len(vals) == len(splits) else ""
        lines.append(f"| {r['row']} | " + " | ".join(cells) + f" | {avg} |")
    return "\n".join(lines) + "\n"


def _avg(res: dict, splits: list[str]) -> float | None:
    vals = [headline(res[s]) for s in splits if s in res and headline(res[s]) is not None]
    return 100 * sum(vals) / len(vals) if vals and len(vals) == len(splits) else None


def run_checks(checks: list[dict], results: dict, splits: list[str], rl_metrics: str | None = None) -> list[dict]:
    """Each sourced claim of the paper against this run: PASS / FAIL (outside the tolerance) /
    n.a. (the run lacks the rows, splits or training log it needs)."""
    out = []
    for c in checks:
        got = None
        if c["kind"] == "avg_gain":
            a, b = _avg(results.get(c["row"], {}), splits), _avg(results.get(c["baseline"], {}), splits)
            got = None if a is None or b is None else a - b
        elif c["kind"] == "split_value":
            res = results.get(c["row"], {}).get(c["split"])
            got = None if not res or headline(res) is None else 100 * headline(res)
        elif c["kind"] == "training_curve" and rl_metrics and Path(rl_metrics).is_file():
            vals = [json.loads(x).get(c["metric"]) for x in Path(rl_metrics).read_text().splitlines() if x.strip()]
            vals = [v for v in vals if v is not None]
            if vals:
                got = (vals[0], vals[-1])
        if got is None:
            status = "n.a."
        elif c["kind"] == "training_curve":
            status = "PASS" if abs(got[0] - c["start"]) <= c["tolerance"] and abs(got[1] - c["end"]) <= c["tolerance"] else "FAIL"
        else:
            status = "PASS" if abs(got - c["value"]) <= c["tolerance"] else "FAIL"
        out.append({**c, "got": got, "status": status})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m paravt.eval.reproduce")
    ap.add_argument("--table", default="configs/eval/paper_table1.yaml")
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny model on the synthetic eval set")
    ap.add_argument("--model", help="your checkpoint: its own row (--row) beside the paper's; with --smoke, the "
                                    "checkpoint of the smoke rows")
    ap.add_argument("--row", help="the name of your checkpoint's row (with --model)")
    ap.add_argument("--like", help="the table row whose prompt mode and channels your row uses (default: paravt-8b; "
                                   "sft-tool-K4 with --smoke)")
    ap.add_argument("--rows", help="comma-separated rows to evaluate (default: every row with a model; yours "
                                   "alone when --row is given); the others keep their published numbers")
    ap.add_argument("--synthetic", help="folder with paravt_eval_synth.parquet (smoke)")
    ap.add_argument("--data_root", default="data/benchmarks")
    ap.add_argument("--out", default="runs/table1")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--rl_metrics", help="metrics.jsonl of the RL run, for the training-curve check")
    ap.add_argument("overrides", nargs="*", help="extra key=value for every run (e.g. backend=openai)")
    a = ap.parse_args(argv)
    spec = yaml.safe_load(Path("configs/eval/smoke.yaml" if a.smoke else a.table).read_text())
    if any(o.split("=", 1)[0].strip() == "model" for o in a.overrides):
        ap.error("model= would replace the rows' own checkpoints: evaluate yours as its own row with "
                 "--row NAME --model PATH")
    rows = list(spec["rows"])
    if a.row:
        if not a.model:
            ap.error("--row needs --model (your checkpoint)")
        a.like = a.like or ("sft-tool-K4" if a.smoke else "paravt-8b")
        like = next((r for r in rows if r["row"] == a.like), None)
        if like is None:
            ap.error(f"--like {a.like}: no such row ({', '.join(r['row'] for r in rows)})")
        if any(r["row"] == a.row for r in rows):
            ap.error(f"--row {a.row}: the table has a row of that name already; choose another")
        mine = {k: v for k, v in like.items() if k != "published"}
        mine.update({"row": a.row, "model": a.model})
        rows.append(mine)
    elif a.model and not a.smoke:
        ap.error("--model needs --row NAME (the name of your checkpoint's row)")
    selected = [x.strip() for x in a.rows.split(",")] if a.rows else ([a.row] if a.row else None)
    if selected:
        unknown = [x for x in selected if x not in {r["row"] for r in rows}]
        if unknown:
            ap.error(f"--rows: no such row(s) {unknown}")
    run = [r for r in rows if selected is None or r["row"] in selected]
    protocol = spec.get("protocol", {})
    defaults = [f"{k}={v}" for k, v in protocol.items()]
    if a.limit:
        defaults.append(f"limit={a.limit}")
    if a.smoke:
        if not a.model or not a.synthetic:
            ap.error("--smoke needs --model and --synthetic")
        defaults = [f"split_paths={{synthetic: {a.synthetic}}}", "max_new_tokens=400"] + defaults
        run = [{**r, "model": r.get("model") or a.model} for r in run]
    else:
        defaults.append(f"data_root={a.data_root}")
    changed = protocol_changes(a.overrides, protocol)
    for c in changed:
        print(f"warning: {c} departs from the paper's protocol; the table says so", file=sys.stderr)
    try:
        results, lost = run_rows(run, spec["splits"], defaults, a.out, a.overrides)
    except ResumeMismatch as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    md = table(results, rows, spec["splits"])
    if changed:
        md += "\nNot the paper's protocol: " + "; ".join(changed) + ".\n"
    claims = list(spec.get("checks", []))
    if a.row:  # the sourced claims about the row yours is like, checked on yours too
        claims += [{**c, "row": a.row, "name": f"{c['name']} ({a.row})"} for c in spec.get("checks", [])
                   if c.get("row") == a.like and c["kind"] != "training_curve"]
    checks = run_checks(claims, results, spec["splits"], a.rl_metrics)
    if checks:
        md += "\n| paper claim | paper | this run | status |\n|---|---|---|---|\n"
        for c in checks:
            paper = f"{c['start']} -> {c['end']}" if c["kind"] == "training_curve" else f"{c['value']}"
            got = c["got"] if c["got"] is None else (f"{c['got'][0]:.2f} -> {c['got'][1]:.2f}"
                                                      if c["kind"] == "training_curve" else f"{c['got']:.1f}")
            md += f"| {c['name']} | {paper} | {got or ''} | {c['status']} |\n"
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "table.md").write_text(md)
    (Path(a.out) / "table.json").write_text(json.dumps({"results": results, "checks": checks, "lost": lost,
                                                        "protocol_changes": changed}, indent=2, default=str))
    print(md)
    for line in lost:
        print(f"error: {line}", file=sys.stderr)
    if lost:
        print(f"error: {len(lost)} cell(s) lost work (marked in {Path(a.out) / 'table.md'}); rerun the same command "
              "to retry exactly the lost samples", file=sys.stderr)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
