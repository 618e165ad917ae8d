"""prompt_source=row: the release's RL prompt is the parquet row's own messages."""

from types import SimpleNamespace

import pytest

from paravt.core import prompts
from paravt.data.tool_specs import CROP_VIDEO_SCHEMA

FRAMES = [SimpleNamespace(timestamp=t, image=f"img{t}") for t in (0.0, 30.0)]


def test_row_system_prompt_kept_tools_appended_frames_at_the_video_mark():
    row = [{"role": "system", "content": "You are a careful video analyst."},
           {"role": "user", "content": "<video>\nWhat colour is the circle? A red B blue"}]
    msgs = prompts.messages_from_row(row, FRAMES, [CROP_VIDEO_SCHEMA])
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("You are a careful video analyst.\n\n# Tools")
    assert '"name": "crop_video"' in msgs[0]["content"]
    user = msgs[1]["content"]
    assert [i["type"] for i in user] == ["text", "image", "text", "image", "text"]
    assert user[0]["text"] == "<0.0 seconds>" and user[3]["image"] == "img30.0"
    assert user[-1]["text"] == "\nWhat colour is the circle? A red B blue"  # mark removed, no Video/Duration header
    assert "Duration" not in str(msgs)


def test_row_with_tools_block_or_without_system_or_tools():
    tools_sys = prompts.system_prompt("agentic_minimal", [CROP_VIDEO_SCHEMA])
    row = [{"role": "system", "content": [{"type": "text", "text": tools_sys}]},
           {"role": "user", "content": [{"type": "text", "text": "Which event is first? <video>"}]}]
    msgs = prompts.messages_from_row(row, FRAMES, [CROP_VIDEO_SCHEMA])
    assert msgs[0]["content"] == tools_sys  # a row that already lists its tools is left alone
    bare = prompts.messages_from_row([{"role": "user", "content": "Q?"}], FRAMES, [CROP_VIDEO_SCHEMA])
    assert bare[0] == {"role": "system", "content": tools_sys} and bare[1]["content"][-1]["text"] == "Q?"
    no_tools = prompts.messages_from_row([{"role": "user", "content": "<video>Q?"}], FRAMES, None)
    assert len(no_tools) == 1 and no_tools[0]["role"] == "user"
    with pytest.raises(ValueError, match="no user message"):
        prompts.messages_from_row([{"role": "system", "content": "s"}], FRAMES)


def test_episode_builds_the_row_prompt(world):
    """build_overview with prompt_source=row on a real synthetic RL row and its mp4."""
    from paravt.agent.episode import EpisodeConfig, EpisodeSample, build_overview
    from paravt.data.schema import load_rl_rows
    rows, _ = load_rl_rows([f"{world}/local/paravt_rl_synth.parquet"])
    s = EpisodeSample.from_row(rows[0])
    assert s.prompt and s.prompt == list(rows[0].prompt)
    ov = build_overview(s, 4, EpisodeConfig(prompt_source="row"), None, [CROP_VIDEO_SCHEMA])
    user = [m for m in ov.messages if m["role"] == "user"][0]["content"]
    assert sum(i["type"] == "image" for i in user) == 4
    assert "Duration:" not in "".join(i.get("text", "") for i in user)
    with pytest.raises(ValueError, match="prompt_source"):
        EpisodeConfig(prompt_source="file")
