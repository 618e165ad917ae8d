"""A new tool is one module and one recipe line: ZoomFrame (tests/agent/zoom_tool.py) beside crop_video,
called in the same turn, through one RL rollout step and one eval run; names checked when configs load."""

from __future__ import annotations

import asyncio
import json

import pytest

from paravt.core.config import load_config
from tests.helpers import ScriptedEngine, call

ZOOM = "tests.agent.zoom_tool:ZoomFrame"
BOTH = f'{{crop_video: {{}}, "{ZOOM}": {{max_pixels: 100000}}}}'


def _zoom_call(t: float) -> str:
    return "<tool_call>\n" + json.dumps({"name": "zoom_frame", "arguments": {"timestamp": t}}) + "\n</tool_call>"


def _script(tokenizer):
    """Both tools in the first turn; the answer once tool responses are in the prompt."""
    def main(_, prompt):
        eng.prompts.append(prompt)
        if "<tool_response>" in prompt:
            return "Both looked.\n</think>\n<answer>A</answer>"
        return "I will crop and zoom.\n</think>\n" + call(0, 10) + "\n" + _zoom_call(5.0)
    eng = ScriptedEngine(tokenizer, main)
    eng.prompts = []
    return eng


def _check_turn(turn_calls):
    names = [c["name"] if isinstance(c, dict) else c.name for c in turn_calls]
    oks = [c["ok"] if isinstance(c, dict) else c.ok for c in turn_calls]
    assert names == ["crop_video", "zoom_frame"] and all(oks), turn_calls


def test_rl_rollout_step_with_a_plugin_tool(world, tiny, tmp_path):
    from paravt.agent.episode import EpisodeSample
    from paravt.data.schema import load_rl_rows
    from paravt.rl.config import RLConfig
    from paravt.rl.rollout import PromptSchedule, RolloutWorker

    _, proc = tiny
    cfg = load_config(RLConfig, "configs/rl/tiny.yaml", [
        f"model_path={tmp_path}", f"output_dir={tmp_path}", f"train_data=[{world}/local/paravt_rl_synth.parquet]",
        "grpo.prompts_per_step=2", "grpo.n_samples=2", f"hierarchical_agent.tools={BOTH}"])
    rows, _ = load_rl_rows(cfg.train_data)
    eng = _script(proc.tokenizer)
    worker = RolloutWorker(cfg, eng, proc, PromptSchedule([EpisodeSample.from_row(r) for r in rows], 2, 0))
    assert set(worker.tools) == {"crop_video", "zoom_frame"} and worker.tools["zoom_frame"].max_pixels == 100000
    batch = asyncio.run(worker.collect(0))
    assert batch.samples and batch.metrics["rollout/skipped_prompts"] == 0
    first = [c for c in eng.calls if not c["sub"]][0]
    for rec in batch.trajectories:
        _check_turn(rec["turns"][0]["calls"])
    # the zoom frame went back to the main agent: the second main request carries one image more
    mains = [c for c in eng.calls if not c["sub"]]
    assert max(c["n_images"] for c in mains) == first["n_images"] + 1
    assert batch.metrics["tools/parallel_turn_ratio"] == 1.0
    assert '"name": "zoom_frame"' in eng.prompts[0] and '"name": "crop_video"' in eng.prompts[0]  # both advertised


def test_eval_run_with_a_plugin_tool(world, tiny, tmp_path):
    from paravt.eval.config import EvalConfig
    from paravt.eval.driver import Evaluator

    _, proc = tiny
    cfg = load_config(EvalConfig, None, [f"model={tmp_path}", f"out={tmp_path}/o", f"split_paths={{synthetic: {world}/local}}",
                                         "progress=false", "limit=3", "nframes=4", "max_turns=1", "crop.mode=frames",
                                         f"tools={BOTH}", "save_trajectory=true"])
    ev = Evaluator(cfg)
    eng = _script(proc.tokenizer)
    from paravt.engines.factory import EngineHandle
    ev.handles, ev.engine, ev.processor = [EngineHandle("hf", eng)], eng, proc  # the scripted engine in place of a model
    res = ev.run()["synthetic"]
    assert res["errors"] == 0 and res["evaluated"] == 3
    recs = [json.loads(x) for x in (tmp_path / "o/model/image_url/synthetic.jsonl").read_text().splitlines()]
    for r in recs:
        _check_turn(r["trajectory"]["turns"][0]["calls"])
    # the zoom frame (and the crop's frames: crop.mode=frames) went back to the main agent
    mains = [c for c in eng.calls if not c["sub"]]
    assert mains[0]["n_images"] == 4 and max(c["n_images"] for c in mains) > 4 + 1


@pytest.mark.parametrize("tools,fragment", [
    ("{crop_vdeo: {}}", "unknown tool 'crop_vdeo'; did you mean 'crop_video'?"),
    ("{tests.agent.zoom_tool:Nope: {}}", "cannot import"),
    (f'{{"{ZOOM}": {{zoom: 2}}}}', "bad options"),
    ("{crop_video: {fpz: 2}}", "unknown crop_video options ['fpz']"),
])
def test_tool_names_and_options_are_checked_when_the_config_loads(tools, fragment, capsys):
    from paravt.core.config import parse_cli
    from paravt.eval.config import EvalConfig
    from paravt.rl.config import RLConfig

    for schema, key, base in ((EvalConfig, "tools", ["model=/m"]),
                              (RLConfig, "hierarchical_agent.tools", ["configs/rl/tiny.yaml", "model_path=/m"])):
        with pytest.raises(SystemExit) as e:
            parse_cli(schema, base + [f"{key}={tools}"], "prog")
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and fragment in err, err


def test_a_baked_tools_block_gains_the_new_tool():
    from paravt.agent.tools import build_tools
    from paravt.core import prompts

    tools = build_tools({"crop_video": {}, ZOOM: {}})
    row = [{"role": "system", "content": "You are an agent.\n<tools>\n{\"type\": \"function\", \"function\": "
                                         "{\"name\": \"crop_video\"}}\n</tools>\nUse them."},
           {"role": "user", "content": "<video>\nWhat?"}]
    msgs = prompts.messages_from_row(row, [], [t.schema for t in tools.values()])
    sys_text = msgs[0]["content"]
    assert sys_text.count("\"crop_video\"") == 1 and "\"zoom_frame\"" in sys_text
    assert sys_text.index("zoom_frame") < sys_text.index("</tools>") and sys_text.endswith("Use them.")


def test_a_plugin_tool_declares_how_its_calls_are_read():
    """The tool class carries its call syntax: the parser of a recipe that configures it reads a
    positional <tool_code> call with a clock time as the tool's own parameter in seconds; the parser
    of a recipe without it does not (the parser knows no tool by name)."""
    from paravt.agent.tools import recipe_call_parser

    text = '<tool_code>zoom_frame("0:05")</tool_code>'
    call_ = recipe_call_parser({"crop_video": {}, ZOOM: {}}).parse(text).calls[0]
    assert (call_.name, call_.arguments) == ("zoom_frame", {"timestamp": 5.0})
    assert recipe_call_parser({"crop_video": {}}).parse(text).calls == []
