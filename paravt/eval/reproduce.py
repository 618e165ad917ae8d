"""Run every Table-1 row (or the CPU smoke rows) and print the table beside the paper's numbers.

    python -m paravt.eval.reproduce --table configs/eval/paper_table1.yaml --data_root /data/bench --out runs/table1
    python -m paravt.eval.reproduce --smoke --model runs/quickstart/sft/final --synthetic runs/quickstart/world/local
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from paravt.core.config import load_config
from paravt.eval.driver import EvalConfig, Evaluator, headline


def run_rows(rows, splits, common: list[str], out: str, charades_overrides: dict | None = None) -> dict:
    results = {}
    for r in rows:
        if not r.get("model") and "model" not in " ".join(common):
            print(f"skip {r['row']}: no public checkpoint id configured (fill 'model' in the table config)")
            continue
        for split in splits:
            over = dict(r)
            over.pop("published", None)
            if split == "charades_sta" and charades_overrides and over.get("prompt_mode", "").startswith("agentic"):
                over.update(charades_overrides)
            args = common + [f"out={out}", f"splits=[{split}]"] + [f"{k}={v}" for k, v in over.items() if v != ""]
            cfg = load_config(EvalConfig, None, args)
            res = Evaluator(cfg).run()
            results.setdefault(r["row"], {})[split] = res[split]
    return results


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
            cells.append(("" if v is None else f"{100 * v:.1f}") + (f" [paper {p}]" if p is not None else ""))
        avg = f"{sum(vals) / len(vals):.1f}" if vals and len(vals) == len(splits) else ""
        lines.append(f"| {r['row']} | " + " | ".join(cells) + f" | {avg} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m paravt.eval.reproduce")
    ap.add_argument("--table", default="configs/eval/paper_table1.yaml")
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny model on the synthetic eval set")
    ap.add_argument("--model", help="checkpoint for the smoke rows")
    ap.add_argument("--synthetic", help="folder with paravt_eval_synth.parquet (smoke)")
    ap.add_argument("--data_root", default="data/benchmarks")
    ap.add_argument("--out", default="runs/table1")
    ap.add_argument("--limit", type=int)
    ap.add_argument("overrides", nargs="*", help="extra key=value for every run (e.g. backend=openai)")
    a = ap.parse_args(argv)
    spec = yaml.safe_load(Path("configs/eval/smoke.yaml" if a.smoke else a.table).read_text())
    common = list(a.overrides) + ["progress=false"]
    if a.limit:
        common.append(f"limit={a.limit}")
    if a.smoke:
        if not a.model or not a.synthetic:
            ap.error("--smoke needs --model and --synthetic")
        common = [f"model={a.model}", f"split_paths={{synthetic: {a.synthetic}}}", "max_new_tokens=400"] + common
    else:
        common.append(f"data_root={a.data_root}")
    common += [f"{k}={v}" for k, v in spec.get("protocol", {}).items()]
    results = run_rows(spec["rows"], spec["splits"], common, a.out, spec.get("charades_overrides"))
    md = table(results, spec["rows"], spec["splits"])
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "table.md").write_text(md)
    (Path(a.out) / "table.json").write_text(json.dumps(results, indent=2, default=str))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
