import json

import pytest

from paravt.core.toolcall import CallSyntax, ToolCallParser, format_tool_call, parse_time, render_tools_block
from paravt.data.tool_specs import CROP_VIDEO_SCHEMA, CROP_VIDEO_SYNTAX

parse_tool_calls = ToolCallParser([CROP_VIDEO_SYNTAX]).parse  # a recipe whose one tool is crop_video

TWO_CALLS = """<think>
The red square is not visible in the overview. I will check two windows.
</think>
<tool_call>
{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 0.0, "end_time": 30.5}}
</tool_call>
<tool_call>
{"name": "crop_video", "arguments": {"video_path": "v.mp4", "start_time": 30.5, "end_time": 61}}
</tool_call>"""


def test_several_json_blocks_in_one_turn():
    r = parse_tool_calls(TWO_CALLS)
    assert r.errors == []
    assert [c.name for c in r.calls] == ["crop_video", "crop_video"]
    assert r.calls[0].arguments == {"video_path": "v.mp4", "start_time": 0.0, "end_time": 30.5}
    assert r.calls[1].arguments["end_time"] == 61.0 and isinstance(r.calls[1].arguments["end_time"], float)


def test_unclosed_last_block_counts():
    text = TWO_CALLS.rsplit("</tool_call>", 1)[0]  # generation cut before the closing tag
    r = parse_tool_calls(text)
    assert len(r.calls) == 2 and r.errors == []


def test_block_followed_by_new_block_without_close():
    text = '<tool_call>{"name": "crop_video", "arguments": {"start_time": 1, "end_time": 2}}<tool_call>{"name": "crop_video", "arguments": {"start_time": 3, "end_time": 4}}</tool_call>'
    r = parse_tool_calls(text)
    assert [c.arguments["start_time"] for c in r.calls] == [1.0, 3.0]


def test_malformed_block_is_an_error_and_others_survive():
    text = '<tool_call>\n{"name": "crop_video", "arguments": {"start_time": 1,\n</tool_call>\n' \
           '<tool_call>\n{"name": "crop_video", "arguments": {"start_time": 5, "end_time": 9}}\n</tool_call>'
    r = parse_tool_calls(text)
    assert len(r.calls) == 1 and r.calls[0].arguments["start_time"] == 5.0
    assert len(r.errors) == 1 and "invalid <tool_call> JSON" in r.errors[0]


@pytest.mark.parametrize("body,err", [
    ("", "empty"),
    ('{"arguments": {}}', "missing 'name'"),
    ('{"name": "crop_video", "arguments": [1, 2]}', "must be an object"),
    ("not json at all", "no JSON"),
    ('"just a string"', "expected a JSON object"),
])
def test_bad_blocks(body, err):
    r = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert r.calls == [] and len(r.errors) == 1 and err in r.errors[0]


def test_arguments_as_json_string_and_parameters_alias_and_list():
    r = parse_tool_calls('<tool_call>{"name": "crop_video", "arguments": "{\\"start_time\\": \\"01:05\\", \\"end_time\\": 70}"}</tool_call>'
                         '<tool_call>{"name": "crop_video", "parameters": {"start": "1:02:03", "end": "3733"}}</tool_call>'
                         '<tool_call>[{"name": "a", "arguments": {}}, {"name": "b"}]</tool_call>')
    assert r.errors == []
    assert r.calls[0].arguments == {"start_time": 65.0, "end_time": 70.0}
    assert r.calls[1].arguments == {"start": 3723.0, "end": 3733.0}
    assert [c.name for c in r.calls[2:]] == ["a", "b"]


def test_trailing_junk_and_code_fence():
    r = parse_tool_calls('<tool_call>```json\n{"name": "crop_video", "arguments": {"start_time": 2, "end_time": 4}}\n```</tool_call>')
    assert len(r.calls) == 1
    r = parse_tool_calls('<tool_call>{"name": "crop_video", "arguments": {"start_time": 2, "end_time": 4}}}}</tool_call>')
    assert len(r.calls) == 1


def test_tool_code_python_syntax():
    text = """<tool_code>
print(crop_video(video_path="v.mp4", start_time="00:10", end_time=20))
</tool_code>
<tool_code>crop_video("v.mp4", 30, 40.5)'</tool_code>
<tool_code>tools.crop_video(video_path=video, start_time=1, end_time=2)"</tool_code>"""
    r = parse_tool_calls(text)
    assert r.errors == []
    assert r.calls[0].arguments == {"video_path": "v.mp4", "start_time": 10.0, "end_time": 20.0}
    assert r.calls[1].arguments == {"video_path": "v.mp4", "start_time": 30.0, "end_time": 40.5}
    assert r.calls[2].name == "crop_video" and r.calls[2].arguments["video_path"] == "video"
    assert all(c.source == "tool_code" for c in r.calls)


def test_tool_code_stray_quote_after_a_number_and_one_call_per_line():
    """The README's promise: ``end_time=20.0')`` (a stray quote before the parenthesis) parses."""
    r = parse_tool_calls("<tool_code>crop_video(video_path='clip_0001.mp4', start_time=10, end_time=20.0')</tool_code>")
    assert r.errors == [] and r.calls[0].arguments == {"video_path": "clip_0001.mp4", "start_time": 10.0, "end_time": 20.0}
    r = parse_tool_calls("<tool_code>crop_video('v4.mp4', 5\", 12.5')</tool_code>")  # a path ending in a digit keeps its quotes
    assert r.errors == [] and r.calls[0].arguments == {"video_path": "v4.mp4", "start_time": 5.0, "end_time": 12.5}
    r = parse_tool_calls("<tool_code>\ncrop_video('v.mp4', 1, 2)\n# second window\ncrop_video('v.mp4', 3, 4)\n</tool_code>")
    assert r.errors == [] and [c.arguments["start_time"] for c in r.calls] == [1.0, 3.0]


@pytest.mark.parametrize("body", ["crop_video(1, 2, 3, 4)", "x = 1", "crop_video(**kw)", "crop_video(start_time=f(1))", "((("])
def test_tool_code_errors(body):
    r = parse_tool_calls(f"<tool_code>{body}</tool_code>")
    assert r.calls == [] and len(r.errors) == 1


def test_json_blocks_take_precedence_over_tool_code():
    text = '<tool_code>crop_video("v", 1, 2)</tool_code><tool_call>{"name": "crop_video", "arguments": {}}</tool_call>'
    r = parse_tool_calls(text)
    assert len(r.calls) == 1 and r.calls[0].source == "tool_call"


@pytest.mark.parametrize("body,expected", [
    ('{"start": 10, "end": 20}', (10.0, 20.0)),
    ("[12.5, 18]", (12.5, 18.0)),
    ("00:30 - 01:00", (30.0, 60.0)),
    ("from 5 to 9", (5.0, 9.0)),
])
def test_video_zoom(body, expected):
    r = parse_tool_calls(f"<think>zoom</think><video_zoom>{body}</video_zoom>")
    assert r.errors == [] and r.calls[0].name == "crop_video"
    assert (r.calls[0].arguments["start_time"], r.calls[0].arguments["end_time"]) == expected


def test_video_zoom_error():
    r = parse_tool_calls("<video_zoom>somewhere</video_zoom>")
    assert r.calls == [] and len(r.errors) == 1


@pytest.mark.parametrize("text", [
    None, "", "plain answer B", "<tool_call>" * 50, "</tool_call>", "<tool_call>{" * 1000, "<tool_code>" + "(" * 5000,
    "<tool_call>" + '{"a":' * 3000 + "</tool_call>", "<tool_call>\x00\xff</tool_call>", "<tool_call>NaN</tool_call>",
])
def test_never_raises_on_adversarial_text(text):
    r = parse_tool_calls(text)
    assert isinstance(r.calls, list) and isinstance(r.errors, list)


def test_no_call_means_no_errors():
    r = parse_tool_calls("<think>\nIt is red.\n</think>\n<answer>B</answer>")
    assert r.calls == [] and r.errors == [] and not r.has_call


@pytest.mark.parametrize("value,expected", [
    (3, 3.0), ("12.5", 12.5), ("12.5s", 12.5), ("7 seconds", 7.0), ("01:05", 65.0), ("1:02:03", 3723.0),
    ("0:00:01.5", 1.5), ("soon", "soon"), (None, None), (True, True),
])
def test_parse_time(value, expected):
    assert parse_time(value) == expected


def test_schema_rendering_roundtrip():
    block = render_tools_block([CROP_VIDEO_SCHEMA])
    assert block.startswith("<tools>\n") and block.endswith("\n</tools>")
    schema = json.loads(block.splitlines()[1])
    assert schema == CROP_VIDEO_SCHEMA
    assert schema["function"]["parameters"]["required"] == ["video_path", "start_time", "end_time"]
    call = format_tool_call("crop_video", {"video_path": "v.mp4", "start_time": 1.0, "end_time": 2.0})
    assert parse_tool_calls(call).calls[0].arguments["end_time"] == 2.0


def test_the_parser_reads_calls_by_each_tools_declared_syntax():
    """Positional order, time parameters and window tags come from the syntaxes the parser is built
    with: an undeclared tool gets none of them, a declared one gets exactly its own."""
    undeclared = parse_tool_calls('<tool_code>seek_frame("01:05")</tool_code>')
    assert not undeclared.calls and "too many positional arguments for seek_frame" in undeclared.errors[0]
    kw = parse_tool_calls('<tool_code>seek_frame(at="01:05")</tool_code>').calls[0]
    assert kw.arguments == {"at": "01:05"}  # not a declared time parameter: left as written
    seek = CallSyntax("seek_frame", positional=("at",), time_params=("at",))
    clip = CallSyntax("clip_audio", time_params=("from", "to"), window_tag="clip")
    both = ToolCallParser([CROP_VIDEO_SYNTAX, seek, clip])
    assert both.parse('<tool_code>seek_frame("01:05")</tool_code>').calls[0].arguments == {"at": 65.0}
    assert parse_tool_calls("<clip>[3, 7]</clip>").calls == []  # the crop_video parser knows no <clip>
    c = both.parse('<clip>{"start": "0:03", "end": 7}</clip>').calls[0]
    assert (c.name, c.arguments, c.source) == ("clip_audio", {"from": 3.0, "to": 7.0}, "clip")
    win = both.parse("<video_zoom>[3, 7]</video_zoom>").calls[0]
    assert (win.name, win.arguments, win.source) == ("crop_video", {"start_time": 3.0, "end_time": 7.0}, "video_zoom")
    with pytest.raises(ValueError, match="two time parameters"):
        ToolCallParser([CallSyntax("bad", time_params=("at",), window_tag="bad")])
    with pytest.raises(ValueError, match="already crop_video's"):
        ToolCallParser([CROP_VIDEO_SYNTAX, CallSyntax("other_zoom", time_params=("s", "e"), window_tag="video_zoom")])


def test_a_parser_reads_only_its_own_tools_whatever_was_imported():
    """Importing a tool's module changes no parser: a parser without crop_video reads none of its
    positional, time or window forms, in a process where crop_video is registered and built."""
    from paravt.agent.tools import build_tools

    build_tools({"crop_video": {}})
    bare = ToolCallParser()
    assert bare.parse("<video_zoom>[3, 7]</video_zoom>").calls == []
    assert not bare.parse('<tool_code>crop_video("v.mp4", 1, 2)</tool_code>').calls
    json_call = format_tool_call("crop_video", {"start_time": "0:05", "end_time": 9})
    assert bare.parse(json_call).calls[0].arguments == {"start_time": "0:05", "end_time": 9}
    assert parse_tool_calls(json_call).calls[0].arguments == {"start_time": 5.0, "end_time": 9.0}


def test_core_names_no_tool():
    """paravt/core holds no tool's name: tools declare themselves (paravt.data.tool_specs, paravt.agent.tools)."""
    import pathlib

    import paravt.core
    core = pathlib.Path(paravt.core.__file__).parent
    hits = [f"{p.name}:{i}" for p in sorted(core.glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if "crop_video" in line]
    assert hits == []


@pytest.mark.parametrize("extra,expected", [({}, 0.0), ({"tests.agent.zoom_tool:ZoomFrame": {}}, 0.1)])
def test_the_rewards_cli_reads_calls_with_the_recipes_tools(tmp_path, extra, expected):
    """``python -m paravt.rl.rewards`` builds its parser from the recipe's ``hierarchical_agent.tools``:
    a positional zoom_frame call is a call (R_tool 0.1) only under a recipe that configures zoom_frame."""
    import subprocess
    import sys

    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_path: none\ntrain_data: [none.parquet]\nparavt:\n  reward: {rules: paravt}\n"
                      f"hierarchical_agent:\n  tools: {json.dumps({'crop_video': {}, **extra})}\n")
    line = {"completion": '<think>\nlook closer\n</think>\n<tool_code>zoom_frame("0:05")</tool_code>',
            "answer": "B", "question_type": "mcq"}
    out = subprocess.run([sys.executable, "-m", "paravt.rl.rewards", "--recipe", str(recipe), "--jsonl", "-"],
                         input=json.dumps(line) + "\n", capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["tool"] == expected
