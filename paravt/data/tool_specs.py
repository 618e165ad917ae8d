"""What the model is told about crop_video, and how its calls are read.

The JSON function schema the prompts advertise and the call syntax a parser built for crop_video
applies (:class:`paravt.core.toolcall.ToolCallParser`). It sits in the data layer because the
synthetic SFT traces write crop_video calls and their system prompts list it; the tool that executes
the calls (:class:`paravt.agent.tools.CropVideo`) takes both from here. The parser and the prompts
(``paravt.core``) know no tool by name.
"""

from __future__ import annotations

from typing import Any

from paravt.core.toolcall import CallSyntax

CROP_VIDEO_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "crop_video",
        "description": (
            "Look closely at a time window of the video. Returns a description of what "
            "happens between start_time and end_time (in seconds)."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "video_path": {"type": "string", "description": "Path of the video to crop."},
                "start_time": {"type": "number", "description": "Window start, in seconds."},
                "end_time": {"type": "number", "description": "Window end, in seconds."},
            },
            "required": ["video_path", "start_time", "end_time"],
        },
    },
}

#: ``crop_video(video_path, start_time, end_time)``; ``start``/``end`` are accepted aliases; a
#: VideoZoomer-style ``<video_zoom>[s, e]</video_zoom>`` block is a crop_video call.
CROP_VIDEO_SYNTAX = CallSyntax(
    name="crop_video", positional=("video_path", "start_time", "end_time"),
    time_params=("start_time", "end_time", "start", "end"), window_tag="video_zoom")

#: The tools block the synthetic data's system prompts advertise.
DATA_TOOL_SCHEMAS: list[dict[str, Any]] = [CROP_VIDEO_SCHEMA]
