"""Native-format rows (a tool prior of the tiny base's own): think and answer tags removed from every
assistant turn, the reasoning kept as plain text (or dropped on request), tool calls kept as written,
crop summaries untouched, bad input one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from paravt.core.scoring import episode_well_formed, score
from paravt.core.toolcall import ToolCallParser
from paravt.data.tool_specs import CROP_VIDEO_SYNTAX
from paravt.data.synthetic.native import to_native

PARSER = ToolCallParser([CROP_VIDEO_SYNTAX])  # the calls the traces write
parse_tool_calls = PARSER.parse

CALL = '<tool_call>\n{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 0.0, "end_time": 30.0}}\n</tool_call>'


def test_a_native_turn_keeps_calls_and_answers_and_drops_the_structure():
    first = f"<think>\nThe circle is not in the overview. I will check.\n</think>\n{CALL}"
    last = "<think>\nThe circle is visible from 23.5 s. It is cyan, option A.\n</think>\n<answer>A</answer>"
    n1, n2 = to_native(first, keep_reasoning=False), to_native(last, keep_reasoning=False)
    assert n1 == CALL and n2 == "A"
    assert [c.arguments for c in parse_tool_calls(n1).calls] == [c.arguments for c in parse_tool_calls(first).calls]
    assert score(n2, "A", "mcq").value == 1.0  # the plain answer still scores
    assert episode_well_formed([first, last], PARSER) and not episode_well_formed([n1, n2], PARSER)  # but is not compliant


def test_the_reasoning_is_kept_as_plain_text_by_default():
    first = f"<think>\nThe circle is not in the overview. I will check.\n</think>\n{CALL}"
    last = "<think>\nThe circle is visible from 23.5 s. It is cyan, option B is wrong.\n</think>\n<answer>A</answer>"
    n1, n2 = to_native(first), to_native(last)
    assert n1 == f"The circle is not in the overview. I will check.\n{CALL}"
    assert n2 == "The circle is visible from 23.5 s. It is cyan, option B is wrong.\nA"
    assert "<think>" not in n1 + n2 and "<answer>" not in n2
    assert [c.arguments for c in parse_tool_calls(n1).calls] == [c.arguments for c in parse_tool_calls(first).calls]
    assert score(n2, "A", "mcq").value == 1.0  # the answer after the reasoning is the one scored
    assert not episode_well_formed([n1, n2], PARSER)


def _rows(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_the_cli_rewrites_main_rows_keeps_subagent_rows_and_names_a_bad_row(tmp_path):
    main = [{"role": "user", "content": "Q?"},
            {"role": "assistant", "content": [{"type": "text", "text": "<think>\nlook\n</think>\n" + CALL}]},
            {"role": "tool", "content": "A cyan shape at 23.5 s."},
            {"role": "assistant", "content": [{"type": "text", "text": "<think>\ncyan\n</think>\n<answer>A</answer>"}]}]
    sub = [{"role": "user", "content": "Describe."}, {"role": "assistant", "content": "A cyan shape at 23.5 s."}]
    _rows(tmp_path / "in.parquet", [{"id": "m0", "kind": "main", "messages": json.dumps(main)},
                                    {"id": "s0", "kind": "subagent", "messages": json.dumps(sub)}])
    r = subprocess.run([sys.executable, "-m", "paravt.data.synthetic.native", str(tmp_path / "in.parquet"),
                        "--out", str(tmp_path / "out.parquet")], capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["rewritten"] == 1, r.stderr
    out = pq.read_table(tmp_path / "out.parquet").to_pylist()
    msgs = json.loads(out[0]["messages"])
    assert out[0]["kind"] == "native_main" and json.loads(r.stdout)["reasoning"] == "kept"
    assert [m["content"][0]["text"] for m in msgs if m["role"] == "assistant"] == ["look\n" + CALL, "cyan\nA"]
    r = subprocess.run([sys.executable, "-m", "paravt.data.synthetic.native", str(tmp_path / "in.parquet"),
                        "--out", str(tmp_path / "dropped.parquet"), "--drop-reasoning"], capture_output=True, text=True)
    msgs = json.loads(pq.read_table(tmp_path / "dropped.parquet").to_pylist()[0]["messages"])
    assert r.returncode == 0 and [m["content"][0]["text"] for m in msgs if m["role"] == "assistant"] == [CALL, "A"]
    assert out[1]["messages"] == json.dumps(sub) and out[1]["kind"] == "subagent"

    _rows(tmp_path / "plain.parquet", [{"id": "p7", "kind": "main", "messages": json.dumps(sub)}])
    r = subprocess.run([sys.executable, "-m", "paravt.data.synthetic.native", str(tmp_path / "plain.parquet"),
                        "--out", str(tmp_path / "x.parquet")], capture_output=True, text=True)
    assert r.returncode == 2 and "plain.parquet row 0 (p7)" in r.stderr and len(r.stderr.strip().splitlines()) == 1
