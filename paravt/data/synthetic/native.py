"""A tool prior of the tiny base's own: SFT rows rewritten in a "native" format that competes with
the cold-start SFT's structure.

Qwen3-VL-8B-Instruct comes to the cold-start SFT with a format of its own: it calls tools in Hermes
JSON and answers plainly, with no ``<think>`` block and no ``<answer>`` tags. The paper's Format
Fragility is that prior coming back under vanilla GRPO at sampling temperature (training-time
compliance 0.13 at 8B, 0.64 with PARA-GRPO's anchor). The tiny base built offline has no prior at all,
so it keeps the SFT's structure whatever RL does. Pretraining it on these rows first (the same
episodes, tool calls and answers, with the think tags and the answer tags dropped) gives it one; the
cold-start SFT then teaches the structured format on top, as it does for the 8B.

    python -m paravt.data.synthetic.native IN.parquet [IN2.parquet ...] --out OUT.parquet [--drop-reasoning]

Rows of kind ``subagent`` (crop summaries, no structure) are kept as they are; every assistant turn
of every other row loses its ``<think>``/``</think>`` tags and its answer tags. The reasoning inside
the think block is kept as plain text before the call or the answer, as an instruct model reasons
before it acts: the native rows then answer as well as the structured ones, and only the format
differs (``--drop-reasoning`` removes it too, so the native rows are also the weaker answerers). A row
whose assistant turns hold no think block is an error naming it (the input is not the structured SFT
format).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

THINK_RE = re.compile(r"<think>(.*?)</think>\s*", re.DOTALL)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def to_native(text: str, keep_reasoning: bool = True) -> str:
    """One assistant turn in the native format: the think block's text without its tags (or, with
    ``keep_reasoning=False``, without the block), the answer without its tags."""
    def think(m: re.Match) -> str:
        return m.group(1).strip() + "\n" if keep_reasoning and m.group(1).strip() else ""
    return ANSWER_RE.sub(lambda m: m.group(1).strip(), THINK_RE.sub(think, text)).strip()


def native_messages(messages: list[dict], where: str, keep_reasoning: bool = True) -> list[dict]:
    out, changed = [], False
    for m in messages:
        c = m.get("content")
        if m.get("role") == "assistant":
            if isinstance(c, str):
                new = to_native(c, keep_reasoning)
            else:  # content items: the text ones rewritten
                new = [{**it, "text": to_native(it["text"], keep_reasoning)} if it.get("type") == "text" else it for it in c]
            changed |= new != c
            m = {**m, "content": new}
        out.append(m)
    if not changed:
        raise ValueError(f"{where}: no assistant turn holds a <think> block or answer tags")
    return out


def rewrite(paths: list[str], out: str, keep_reasoning: bool = True) -> dict[str, int]:
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    tables, counts = [], {"rewritten": 0, "kept": 0}
    for p in paths:
        rows = pq.read_table(p).to_pylist()
        for i, r in enumerate(rows):
            if r.get("kind") == "subagent":
                counts["kept"] += 1
                continue
            msgs = json.loads(r["messages"]) if isinstance(r["messages"], str) else r["messages"]
            r["messages"] = json.dumps(native_messages(msgs, f"{p} row {i} ({r.get('id')})", keep_reasoning), ensure_ascii=False)
            r["kind"] = f"native_{r.get('kind')}"
            counts["rewritten"] += 1
        tables.append(pa.Table.from_pylist(rows, schema=pq.read_schema(p)))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.concat_tables(tables, promote_options="default"), out)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m paravt.data.synthetic.native", description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="SFT parquet files in the structured format")
    ap.add_argument("--out", required=True, help="the native-format parquet to write")
    ap.add_argument("--drop-reasoning", action="store_true",
                    help="remove the think block's text too (default: kept as plain text before the call or answer)")
    a = ap.parse_args(argv)
    try:
        counts = rewrite(a.inputs, a.out, keep_reasoning=not a.drop_reasoning)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"out": a.out, "reasoning": "dropped" if a.drop_reasoning else "kept", **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
