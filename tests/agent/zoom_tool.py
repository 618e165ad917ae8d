"""A second tool, as a user adds one: this module and one recipe line
(``tools: {crop_video: {}, "tests.agent.zoom_tool:ZoomFrame": {max_pixels: 100000}}``), nothing else."""

from __future__ import annotations

import time
from typing import Any

from paravt.agent.tools import Tool, ToolContext, ToolResult
from paravt.core import prompts
from paravt.core.toolcall import ToolCall, is_number
from paravt.core.video import run_decode, sample_crop
from paravt.core.video_reader import VideoError


class ZoomFrame(Tool):
    """zoom_frame(timestamp): one frame at a higher resolution."""

    name = "zoom_frame"
    schema = {"type": "function", "function": {
        "name": "zoom_frame", "description": "One frame of the video at a high resolution.",
        "parameters": {"type": "object", "properties": {"timestamp": {"type": "number", "description": "Seconds."}},
                       "required": ["timestamp"]}}}
    positional = ("timestamp",)  # <tool_code>zoom_frame(12.5)</tool_code>
    time_params = ("timestamp",)  # "01:05" -> 65.0

    def __init__(self, max_pixels: int = 200704):
        self.max_pixels = max_pixels

    def error_text(self, message: str) -> str:
        return f"[zoom_frame could not zoom: {message}]"

    async def execute(self, call: ToolCall, ctx: ToolContext) -> ToolResult:
        t0 = time.perf_counter()
        t = call.arguments.get("timestamp")
        if not is_number(t) or not 0 <= float(t) < ctx.duration:
            return self.error(f"timestamp must be a number of seconds in [0, {ctx.duration:.1f}), got {t!r}", t0)
        try:
            frames = await run_decode(sample_crop, ctx.video_path, float(t), min(ctx.duration, float(t) + 1.0), 1.0, 1,
                                      1, 32, 784, self.max_pixels)
        except VideoError as exc:
            return self.error(str(exc), t0, fault=True)
        note = f"The frame at {frames[0].timestamp:.1f} seconds."
        return ToolResult(True, prompts.frames_content(frames) + [{"type": "text", "text": note}], note,
                          seconds=time.perf_counter() - t0)

    def window(self, arguments: dict[str, Any]) -> tuple[float, float] | None:
        return None
