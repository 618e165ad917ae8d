"""Turn the released parquets' sentinel-relative media paths into local ``file://`` URIs.

The released parquets store media paths relative to the extraction root of the media
archive, under four roots (the release's data README)::

    longvt_source/<src>/<rel>    museg/charades/<id>.mp4
    museg/et_instruct_164k/<id>.mp4    selfqa/<id>.mp4

Materialising prefixes the user's root and restores ``file://``, in the ``videos`` column
(list of ``{"video": path}``) and in ``messages`` / ``prompt`` (JSON string or nested lists;
content items of type ``video_url`` / ``image_url`` carry a ``url``). Anything else passes
through unchanged. Missing files are counted per bucket and written, with the other
counts, to ``<output-dir>/materialize_report.json``.

    python -m paravt.data.materialize --root /data/ParaVT-Source \\
        --parquet-dir /data/ParaVT-Parquet --output-dir /data/ParaVT-Parquet-local

Exit codes: 0 ok, 2 the root is missing, 1 no ``paravt_*.parquet`` matched, or some media paths
could not be resolved (relative to none of the sentinel roots) or name missing files — each kind
printed with its count and first examples, all of them in the report; ``--allow-unresolved`` /
``--allow-missing`` accept them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

BUCKETS = ("longvt_source", "museg/charades", "museg/et_instruct_164k", "selfqa")
MEDIA_COLUMNS = ("videos", "messages", "prompt")


@dataclass
class Report:
    rewritten: Counter = field(default_factory=Counter)
    missing: Counter = field(default_factory=Counter)
    passthrough: int = 0
    missing_examples: list[str] = field(default_factory=list)
    files: dict[str, int] = field(default_factory=dict)
    unresolved: int = 0  # relative paths under none of the sentinel roots: left as they are, cannot be opened
    unresolved_examples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "rewritten_per_bucket": dict(self.rewritten),
            "missing_per_bucket": dict(self.missing),
            "missing_total": sum(self.missing.values()),
            "passthrough": self.passthrough,
            "missing_examples": self.missing_examples[:50],
            "unresolved_total": self.unresolved,
            "unresolved_examples": self.unresolved_examples[:50],
        }


def bucket_of(rel: str) -> str | None:
    for b in sorted(BUCKETS, key=len, reverse=True):
        if rel == b or rel.startswith(b + "/"):
            return b
    return None


class Materializer:
    def __init__(self, root: str | Path, check_exists: bool = True):
        self.root = Path(root).resolve()
        self.check_exists = check_exists
        self.report = Report()

    def path(self, value: str) -> str:
        """One media path: sentinel-relative → ``file://<root>/<rel>``; others unchanged."""
        rel = value[len("file://"):] if value.startswith("file://") else value
        rel = rel[2:] if rel.startswith("./") else rel
        bucket = None if os.path.isabs(rel) else bucket_of(rel)
        if bucket is None:
            self.report.passthrough += 1
            if not os.path.isabs(rel) and "://" not in rel:  # relative, yet under no sentinel root
                self.report.unresolved += 1
                if len(self.report.unresolved_examples) < 50:
                    self.report.unresolved_examples.append(value)
            return value
        full = self.root / rel
        self.report.rewritten[bucket] += 1
        if self.check_exists and not full.is_file():
            self.report.missing[bucket] += 1
            if len(self.report.missing_examples) < 50:
                self.report.missing_examples.append(str(full))
        return "file://" + str(full)

    def videos(self, value: Any) -> Any:
        if isinstance(value, list):
            out = []
            for v in value:
                if isinstance(v, dict) and isinstance(v.get("video"), str):
                    v = {**v, "video": self.path(v["video"])}
                out.append(v)
            return out
        return value

    def content_item(self, item: Any) -> Any:
        if not isinstance(item, dict):
            return item
        key = item.get("type")
        if key in ("video_url", "image_url"):
            url = item.get(key)
            if isinstance(url, dict) and isinstance(url.get("url"), str):
                return {**item, key: {**url, "url": self.path(url["url"])}}
            if isinstance(url, str):
                return {**item, key: self.path(url)}
        if key in ("video", "image") and isinstance(item.get(key), str):
            return {**item, key: self.path(item[key])}
        return item

    def messages(self, value: Any) -> Any:
        if isinstance(value, str):
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError:
                return value
            return json.dumps(self.messages(parsed), ensure_ascii=False)
        if isinstance(value, list):
            out = []
            for m in value:
                if isinstance(m, dict) and isinstance(m.get("content"), list):
                    m = {**m, "content": [self.content_item(i) for i in m["content"]]}
                out.append(m)
            return out
        return value

    def table(self, table: pa.Table) -> pa.Table:
        cols = {}
        for name in table.column_names:
            values = table.column(name).to_pylist()
            if name == "videos":
                values = [self.videos(v) for v in values]
            elif name in ("messages", "prompt"):
                values = [self.messages(v) for v in values]
            else:
                cols[name] = table.column(name)
                continue
            try:
                cols[name] = pa.array(values, type=table.schema.field(name).type)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                cols[name] = pa.array(values)
        return pa.table(cols)


def materialize(root: str | Path, parquet_dir: str | Path, output_dir: str | Path, pattern: str = "paravt_*.parquet",
                on_file=None) -> Report:
    """Rewrite every matching parquet of ``parquet_dir`` into ``output_dir``; returns the report.
    ``on_file(i, n, name, rows, missing_so_far)`` is called as each file is written (progress).

    Raises FileNotFoundError when the root is missing and LookupError when nothing matched."""
    root, parquet_dir, output_dir = Path(root), Path(parquet_dir), Path(output_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"--root {root} does not exist or is not a directory")
    files = sorted(parquet_dir.glob(pattern))
    if not files:
        raise LookupError(f"no {pattern} in --parquet-dir {parquet_dir}")
    output_dir.mkdir(parents=True, exist_ok=True)
    m = Materializer(root)
    for f in files:
        try:
            table = pq.read_table(f)
        except (pa.ArrowException, OSError) as exc:
            raise ValueError(f"{f}: not a readable parquet ({' '.join(str(exc).split())[:200]})") from None
        out = m.table(table)
        tmp = output_dir / (f.name + ".tmp")
        pq.write_table(out, tmp)
        os.replace(tmp, output_dir / f.name)
        m.report.files[f.name] = out.num_rows
        if on_file is not None:
            on_file(len(m.report.files), len(files), f.name, out.num_rows, m.report.to_dict()["missing_total"])
    report_path = output_dir / "materialize_report.json"
    tmp = report_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(m.report.to_dict(), indent=2, sort_keys=True))
    os.replace(tmp, report_path)
    return m.report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paravt.data.materialize", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, help="extraction root of the media archive (holds longvt_source/, museg/, selfqa/)")
    p.add_argument("--parquet-dir", required=True, help="folder with the released paravt_*.parquet files")
    p.add_argument("--output-dir", required=True, help="where the materialised parquets and materialize_report.json go")
    p.add_argument("--pattern", default="paravt_*.parquet", help="glob of parquet names (default: %(default)s)")
    p.add_argument("--allow-unresolved", action="store_true",
                   help="exit 0 although some relative paths are under none of the sentinel roots (kept unchanged)")
    p.add_argument("--allow-missing", action="store_true",
                   help="exit 0 although some rewritten paths name files that do not exist under --root")
    a = p.parse_args(argv)
    import time  # noqa: PLC0415

    t0 = time.monotonic()

    def progress(i, n, name, rows, missing):  # one line per parquet as it is written (large files take minutes)
        print(f"[materialize] {i}/{n} {name}: {rows} rows ({missing} missing file(s) so far, "
              f"{time.monotonic() - t0:.0f} s)", flush=True)

    try:
        report = materialize(a.root, a.parquet_dir, a.output_dir, a.pattern, on_file=progress)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except LookupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    d = report.to_dict()
    print(f"materialised {len(d['files'])} parquet(s), {sum(d['files'].values())} rows -> {a.output_dir}")
    print(f"rewritten paths per bucket: {d['rewritten_per_bucket']}")
    print(f"missing files per bucket: {d['missing_per_bucket'] or 'none'}")
    rc = 0
    report_path = Path(a.output_dir) / "materialize_report.json"
    for what, n, examples, flag, allowed in (
            ("media path(s) under none of the sentinel roots " + "/".join(BUCKETS) + " (left unchanged)",
             d["unresolved_total"], d["unresolved_examples"], "--allow-unresolved", a.allow_unresolved),
            (f"media file(s) missing under {a.root}", d["missing_total"], d["missing_examples"], "--allow-missing",
             a.allow_missing)):
        if n:
            shown = ", ".join(examples[:3]) + (", ..." if n > 3 else "")
            print(f"{'warning' if allowed else 'error'}: {n} {what}: {shown} (all listed in {report_path}; "
                  f"{flag} to accept)", file=sys.stderr)
            rc = rc if allowed else 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
