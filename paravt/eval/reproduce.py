"""Run the Table-1 rows (or the CPU smoke rows) and print them beside the paper's published numbers.

    python -m paravt.eval.reproduce --data_root /data/bench backend=openai server.launch=sglang   # all 13 rows
    python -m paravt.eval.reproduce --row videorft --data_root /data/bench backend=openai server.launch=sglang
    python -m paravt.eval.reproduce --row mine --model runs/paragrpo_8b/final --data_root /data/bench \
        --vanilla_metrics runs/vanilla_grpo_8b/metrics.jsonl --paragrpo_metrics runs/paragrpo_8b/metrics.jsonl
    python -m paravt.eval.reproduce --smoke --model runs/quickstart/sft/final --synthetic runs/quickstart/world/local

The output (``OUT/table.md``, ``table.json``, stdout): the measured table of the rows that ran; Table 1 as
published against it, cell by cell (:mod:`paravt.eval.table1`); the paper's claims as the authors state
them (:mod:`paravt.eval.table1_claims`); and the thirteen Table-1 rows with their model ids, each checked
to build a config for every split before anything runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from paravt.core.config import load_config
from paravt.core.prompts import available_modes
from paravt.eval.config import EvalConfig
from paravt.eval.driver import Evaluator, engine_key
from paravt.eval.identity import ResumeMismatch
from paravt.eval.summary import headline, lost_work
from paravt.eval.table1 import SpecError, cell_rows, cell_table, load_spec
from paravt.eval.table1_claims import check_claims, claims_table

SMOKE = "configs/eval/smoke.yaml"
GPU_COMMAND = ["backend=openai", "server.launch=sglang"]  # what the rows check is made with on the smoke path


def row_overrides(r: dict, split: str) -> dict:
    """The driver settings of one Table-1 cell: the row's, with its ``charades:`` block on Charades-STA."""
    over = {k: v for k, v in r.items() if k not in ("published", "charades", "compare_to")}
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


def cell_problem(defaults: list[str], row: dict, split: str, user: list[str], out: str) -> str | None:
    """Why this cell cannot run (its config does not build, its prompt mode has no file), or None."""
    over = row_overrides(row, split)
    if over.get("prompt_mode") and over["prompt_mode"] not in available_modes():
        return f"prompt_mode {over['prompt_mode']} has no configs/prompts/{over['prompt_mode']}.txt"
    try:
        load_config(EvalConfig, None, cell_args(defaults, row, split, user, out))
    except (ValueError, FileNotFoundError, TypeError) as exc:
        return " ".join(str(exc).split())
    return None


def row_plan(rows: list[dict], splits: list[str], defaults: list[str], user: list[str], out: str) -> list[dict]:
    """Each row's model, prompt modes and channels, and whether every one of its cells builds a config."""
    plan = []
    for r in rows:
        probs = [] if r.get("model") else ["no model id"]
        probs += [f"{s}: {p}" for s in splits if r.get("model")
                  for p in [cell_problem(defaults, r, s, user, out)] if p]
        mcq, tvg = row_overrides(r, splits[0]), row_overrides(r, "charades_sta")
        plan.append({"row": r["row"], "model": r.get("model") or "",
                     "mcq": f"{mcq.get('prompt_mode')} / {mcq.get('channel')}",
                     "charades": f"{tvg.get('prompt_mode')} / {tvg.get('channel')}", "problems": probs})
    return plan


def plan_table(plan: list[dict], checked_with: list[str]) -> str:
    lines = ["| row | model | MCQ mode / channel | Charades-STA mode / channel | runnable |", "|---|---|---|---|---|"]
    for p in plan:
        ok = "yes" if not p["problems"] else "no: " + "; ".join(p["problems"])
        lines.append(f"| {p['row']} | {p['model'] or 'n.a.'} | {p['mcq']} | {p['charades']} | {ok} |")
    n = sum(not p["problems"] for p in plan)
    return "\n".join(lines) + (f"\n\n{n} of {len(plan)} rows runnable (every cell's config built with the paper's "
                               f"protocol{' + ' + ' '.join(checked_with) if checked_with else ''}; nothing loaded).\n")


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
    """The measured table of the rows that ran (points; a cell that lost samples says how many)."""
    lines = ["| row | " + " | ".join(splits) + " | avg |", "|---|" + "---|" * (len(splits) + 1)]
    for r in rows:
        if r["row"] not in results:
            continue
        res = results[r["row"]]
        cells, vals = [], []
        for s in splits:
            v = headline(res.get(s, {})) if s in res else None
            if v is not None:
                vals.append(100 * v)
            mark = ""
            if s in res and "n" not in res[s]:
                mark = " (did not run)"
            elif s in res and res[s].get("lost"):
                mark = f" (lost {res[s]['lost']}/{res[s]['n']})"
            cells.append(("" if v is None else f"{100 * v:.1f}") + mark)
        avg = f"{sum(vals) / len(vals):.1f}" if vals and len(vals) == len(splits) else ""
        lines.append(f"| {r['row']} | " + " | ".join(cells) + f" | {avg} |")
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m paravt.eval.reproduce")
    ap.add_argument("--table", default="configs/eval/paper_table1.yaml",
                    help="the Table-1 spec (rows, published cells)")
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny model on the synthetic eval set; prints the "
                                                         "published table beside it")
    ap.add_argument("--model", help="your checkpoint: its own row (--row) beside the paper's; with --smoke, the "
                                    "checkpoint of the smoke rows")
    ap.add_argument("--row", help="a table row to run alone (e.g. videorft), or with --model the name of your "
                                  "checkpoint's row")
    ap.add_argument("--like", help="the table row whose prompt mode and channels your row uses, and whose published "
                                   "cells it is compared with (default: paravt-8b; sft-tool-K4 with --smoke)")
    ap.add_argument("--rows", help="comma-separated rows to evaluate (default: every row; yours alone with --row)")
    ap.add_argument("--synthetic", help="folder with paravt_eval_synth.parquet (smoke)")
    ap.add_argument("--data_root", default="data/benchmarks")
    ap.add_argument("--out", default="runs/table1")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--vanilla_metrics", help="metrics.jsonl of the vanilla GRPO run (f_tau claim)")
    ap.add_argument("--paragrpo_metrics", "--rl_metrics", dest="paragrpo_metrics",
                    help="metrics.jsonl of the PARA-GRPO run (f_tau claim)")
    ap.add_argument("overrides", nargs="*", help="extra key=value for every run (e.g. backend=openai)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    try:
        paper = load_spec(a.table)
        spec = load_spec(SMOKE) if a.smoke else paper
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if any(_key(o) == "model" for o in a.overrides):
        ap.error("model= would replace the rows' own checkpoints: evaluate yours as its own row with "
                 "--row NAME --model PATH")
    rows = [dict(r) for r in spec["rows"]]
    names = {r["row"] for r in rows}
    refs = {r["row"] for r in paper.get("reference_rows", [])}
    user_rows: tuple[str, ...] = ()
    if a.row and a.row in names:
        if a.model and not a.smoke:
            ap.error(f"--row {a.row} is a table row and runs its own model; evaluate your checkpoint as a row of a "
                     "new name (--row NAME --model PATH)")
    elif a.row:
        if a.row in refs:
            ap.error(f"--row {a.row} is a reference row: published only, no open model to run")
        if not a.model:
            ap.error(f"--row {a.row}: not a row of {SMOKE if a.smoke else a.table} ({', '.join(sorted(names))}); "
                     "to evaluate your checkpoint as a new row give --model PATH")
        a.like = a.like or ("sft-tool-K4" if a.smoke else "paravt-8b")
        like = next((r for r in rows if r["row"] == a.like), None)
        if like is None:
            ap.error(f"--like {a.like}: no such row ({', '.join(r['row'] for r in rows)})")
        rows.append({**{k: v for k, v in like.items() if k != "published"}, "row": a.row, "model": a.model,
                     "compare_to": a.like})
        user_rows = (a.row,)
    elif a.model and not a.smoke:
        ap.error("--model needs --row NAME (the name of your checkpoint's row)")
    selected = [x.strip() for x in a.rows.split(",")] if a.rows else ([a.row] if a.row else None)
    if selected:
        unknown = [x for x in selected if x not in {r["row"] for r in rows}]
        if unknown:
            ap.error(f"--rows: no such row(s) {unknown}" + (" (reference rows are published only)"
                                                              if set(unknown) & refs else ""))
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
    for r in run:  # every cell builds before any model loads (an 8B server is minutes to start)
        for split in spec["splits"]:
            p = cell_problem(defaults, r, split, a.overrides, a.out) if r.get("model") else None
            if p:
                print(f"error: {SMOKE if a.smoke else a.table}: row {r['row']}, split {split}: {p}", file=sys.stderr)
                return 2
    paper_defaults = [f"{k}={v}" for k, v in paper.get("protocol", {}).items()] + [f"data_root={a.data_root}"]
    checked_with = GPU_COMMAND if a.smoke else list(a.overrides)
    plan = row_plan(paper["rows"], paper["splits"], paper_defaults, checked_with, a.out)
    changed = protocol_changes(a.overrides, protocol)
    for c in changed:
        print(f"warning: {c} departs from the paper's protocol; the table says so", file=sys.stderr)
    try:
        results, lost = run_rows(run, spec["splits"], defaults, a.out, a.overrides)
    except ResumeMismatch as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    md = "## Measured\n\n" + table(results, rows, spec["splits"])
    if changed:
        md += "\nNot the paper's protocol: " + "; ".join(changed) + ".\n"
    cells = cell_rows(paper, results, [r for r in rows if r["row"] in results])
    md += "\n## Table 1: published vs measured\n\n" + cell_table(cells)
    md += "\nSources: " + "; ".join(f"[{t}] {s['what']}" + (" (secondary)" if s.get("secondary") else "")
                                    for t, s in paper["sources"].items()) + ".\n"
    claims = list(paper.get("checks", []))
    if user_rows:  # the claims about the row yours is like, checked on yours too
        claims += [{**c, "row": a.row, "like": a.like, "name": f"{c['name']} ({a.row})"}
                   for c in paper.get("checks", []) if c.get("row") == a.like and c["kind"] != "format_reward"]
    try:
        checks = check_claims(claims, paper, results, {"vanilla": a.vanilla_metrics, "paragrpo": a.paragrpo_metrics},
                              user_rows)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    md += "\n## Paper claims\n\n" + claims_table(checks, paper["sources"])
    md += "\n## Table-1 rows\n\n" + plan_table(plan, checked_with)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "table.md").write_text(md)
    (Path(a.out) / "table.json").write_text(json.dumps({"results": results, "cells": cells, "checks": checks,
                                                        "rows": plan, "lost": lost, "protocol_changes": changed},
                                                       indent=2, default=str))
    print(md)
    for line in lost:
        print(f"error: {line}", file=sys.stderr)
    if lost:
        print(f"error: {len(lost)} cell(s) lost work (marked in {Path(a.out) / 'table.md'}); rerun the same command "
              "to retry exactly the lost samples", file=sys.stderr)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
