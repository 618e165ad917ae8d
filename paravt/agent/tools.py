"""Tools the main agent can call, and their registry.

A tool validates a parsed call and executes it: ``await tool.execute(call, ctx)`` returns a
:class:`ToolResult` whose ``content`` (text, or text + frames in the eval-style mode) becomes
one ``<tool_response>`` for the main agent. A failed call returns the tool's error text instead
(:meth:`Tool.error_text`, e.g. ``[Error: crop_video failed: …]``); tools never raise into the episode.

Adding a tool = one module with a :class:`Tool` subclass (its ``name``, ``schema``, ``execute``,
optionally ``__init__`` options, ``error_text`` and ``window``) + one line in the recipe's ``tools``
mapping: ``tools: {crop_video: {}, "my_pkg.my_tool:ZoomFrame": {max_pixels: 200000}}``. A key is a
registered name or ``module:Class`` (importing the module registers the class); the value is that
tool's options, handed to its constructor untouched. Names are checked when the config loads.
How a tool's calls are read is its :meth:`Tool.call_syntax`; :func:`call_parser` builds the parser
of exactly the configured tools, for the episode, the rewards and the well-formedness check alike.
"""

from __future__ import annotations

import abc
import asyncio
import time
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from paravt.agent.trajectory import SubAgentTrajectory
from paravt.core import prompts
from paravt.core.config import check_choices, choice
from paravt.core.video_reader import Decoder
from paravt.core.toolcall import CallSyntax, ToolCall, ToolCallParser, is_number
from paravt.core.video import run_decode, sample_crop
from paravt.core.video_reader import VideoError
from paravt.data.tool_specs import CROP_VIDEO_SCHEMA, CROP_VIDEO_SYNTAX
from paravt.engines.base import SamplingParams

TOOL_REGISTRY: dict[str, type["Tool"]] = {}


def register_tool(cls: type["Tool"]) -> type["Tool"]:
    """Register a tool class by its name (a recipe's ``tools`` key)."""
    TOOL_REGISTRY[cls.name] = cls
    return cls


def resolve_tool(key: str) -> type["Tool"]:
    """The tool class of a recipe key: a registered name, or ``package.module:Class`` (imported, so
    it registers). An unknown name is a ValueError naming the nearest registered one."""
    if key in TOOL_REGISTRY:
        return TOOL_REGISTRY[key]
    if ":" in key:
        import importlib  # noqa: PLC0415

        mod, _, attr = key.partition(":")
        try:
            cls = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"tools: cannot import {key!r} ({type(exc).__name__}: {exc})") from None
        if not (isinstance(cls, type) and issubclass(cls, Tool) and cls.name):
            raise ValueError(f"tools: {key!r} is not a Tool subclass with a name")
        return register_tool(cls)
    import difflib  # noqa: PLC0415

    near = difflib.get_close_matches(key, list(TOOL_REGISTRY), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    raise ValueError(f"tools: unknown tool {key!r}{hint} (registered: {', '.join(sorted(TOOL_REGISTRY))}; "
                     "or give package.module:Class)")


def tool_specs(tools: "dict[str, Any] | list[str] | None") -> dict[str, dict[str, Any]]:
    """A recipe's ``tools`` (a mapping key -> options, or a list of keys) as {key: options}."""
    if tools is None:
        return {}
    if isinstance(tools, (list, tuple)):
        return {str(k): {} for k in tools}
    return {str(k): dict(v or {}) for k, v in dict(tools).items()}


def check_tools(tools: "dict[str, Any] | list[str] | None") -> None:
    """Every tool of a recipe resolves and accepts its options (called when a config loads)."""
    for key, opts in tool_specs(tools).items():
        cls = resolve_tool(key)
        try:
            cls(**opts)
        except TypeError as exc:
            raise ValueError(f"tools.{key}: bad options {opts} ({exc})") from None


def call_parser(tools: "Iterable[Tool | type[Tool]]") -> ToolCallParser:
    """The parser that reads the calls of exactly these tools (built ones or their classes)."""
    return ToolCallParser(t.call_syntax() for t in tools)


def recipe_call_parser(tools: "dict[str, Any] | list[str] | None") -> ToolCallParser:
    """The parser of a recipe's ``tools`` (the mapping :func:`build_tools` takes), without building them."""
    return call_parser(resolve_tool(key) for key in tool_specs(tools))


def build_tools(tools: "dict[str, Any] | list[str] | None", **defaults: Any) -> dict[str, "Tool"]:
    """The episode's tools by name, each built with its own options (``defaults``: what every tool
    may take from the stage, e.g. ``crop=`` the stage's crop settings; a tool takes those it names)."""
    out: dict[str, Tool] = {}
    for key, opts in tool_specs(tools).items():
        cls = resolve_tool(key)
        out[cls.name] = cls(**opts, **{k: v for k, v in defaults.items() if k not in opts and k in cls.stage_defaults})
    return out


@dataclass
class ToolContext:
    """What a tool may use: the episode's own video (the model-written path is ignored),
    the engine and processor for sub-agents, and a seed."""

    video_path: str
    duration: float
    engine: Any = None
    processor: Any = None
    seed: int = 0
    turn: int = 0
    call_index: int = 0


@dataclass
class ToolResult:
    ok: bool
    content: list[dict[str, Any]] | str  # what goes inside <tool_response>
    text: str = ""  # plain-text form (logging, scoring)
    error: str | None = None
    window: tuple[float, float] | None = None
    clamped: bool = False
    subagent: SubAgentTrajectory | None = None
    seconds: float = 0.0
    # True when the call failed for a reason outside the model's control (the sub-agent's engine or
    # server, a video that does not decode, a tool bug): the episode goes on with the error text,
    # but the sample is counted as lost by eval and RL. A bad call the model wrote is not a fault.
    fault: bool = False


class Tool(abc.ABC):
    """A tool: its ``name`` and ``schema`` (the JSON function schema the prompt advertises),
    ``execute``; the constructor takes the tool's own options (the recipe's ``tools.<name>``
    mapping) plus any of ``stage_defaults`` the stage provides."""

    name: str = ""
    schema: dict[str, Any] = {}
    # how the parser reads this tool's calls (paravt.core.toolcall.CallSyntax): positional parameter
    # order of <tool_code> calls, parameters that are times ("01:05" -> 65.0), a window block tag
    positional: tuple[str, ...] = ()
    time_params: tuple[str, ...] = ()
    window_tag: str | None = None
    stage_defaults: tuple[str, ...] = ()  # stage settings this tool takes when its options do not set them

    def __init__(self, **options: Any):
        if options:
            raise TypeError(f"{type(self).__name__} takes no options, got {sorted(options)}")

    @abc.abstractmethod
    async def execute(self, call: ToolCall, ctx: ToolContext) -> ToolResult:
        ...

    @classmethod
    def call_syntax(cls) -> CallSyntax:
        """How the parser reads this tool's calls (from ``positional``, ``time_params``, ``window_tag``)."""
        return CallSyntax(cls.name, tuple(cls.positional), tuple(cls.time_params), cls.window_tag)

    def error_text(self, message: str) -> str:
        """What the model reads when a call fails."""
        return f"[Error: {self.name} failed: {message}]"

    def window(self, arguments: dict[str, Any]) -> tuple[float, float] | None:
        """The video window a call looks at, when the tool looks at one (GTR's consistency check)."""
        return None

    def error(self, message: str, t0: float, fault: bool = False) -> ToolResult:
        text = self.error_text(message)
        return ToolResult(False, text, text, error=message, seconds=time.perf_counter() - t0, fault=fault)


CropMode = Literal["subagent", "frames"]


@dataclass
class CropConfig:
    mode: str = choice(CropMode)  # subagent: a weight-sharing sub-agent summarises; frames: frames go back (eval)
    fps: float = 1.0  # crop frames per second
    min_frames: int = 1  # floor on frames per crop
    max_frames: int = 16  # cap on frames per crop
    min_pixels: int = 784  # per-frame lower pixel bound
    max_pixels: int = 50176  # per-frame upper pixel bound
    factor: int = 32  # frame sides rounded to multiples of this
    subagent_max_tokens: int = 512  # sub-agent summary length (cut with [truncated])
    subagent_temperature: float = 0.7  # sub-agent sampling temperature
    subagent_timeout_s: float = 300.0  # a sub-agent slower than this returns an error tool response
    # video decoder of the overview and the crops: pyav (paravt.core.video.VideoReader: keyframe seeks,
    # frame-exact, 2-3.5x faster than decord on 720p H.264, benchmarks/README.md) | decord (the design's / release's)
    decoder: str = choice(Decoder)

    def __post_init__(self):
        check_choices(self, "crop")
        if self.decoder == "decord":
            from paravt.core.video import DECORD_MISSING, decord_available  # noqa: PLC0415
            if not decord_available():
                raise ValueError(f"crop.{DECORD_MISSING}")
        if not 1 <= self.min_frames <= self.max_frames:
            raise ValueError("need 1 <= min_frames <= max_frames")


def validate_window(args: dict[str, Any], duration: float) -> tuple[float, float, bool]:
    """(start, end, clamped) of a crop call, or ValueError with the reason (the paper §3.1 and the release's crop_video tool):
    start/end required (aliases start/end), finite numbers, start < end, start < duration;
    a negative start is clamped to 0 and end to the duration."""
    start = args.get("start_time", args.get("start"))
    end = args.get("end_time", args.get("end"))
    if start is None or end is None:
        raise ValueError("start_time and end_time are required")
    for nm, v in (("start_time", start), ("end_time", end)):
        if not is_number(v):
            raise ValueError(f"{nm} must be a number of seconds, got {v!r}")
    start, end = float(start), float(end)
    if start >= end:
        raise ValueError(f"start_time {start:g} must be before end_time {end:g}")
    if start >= duration:
        raise ValueError(f"start_time {start:g} is past the end of the video ({duration:.1f} s)")
    clamped = False
    if start < 0:
        start, clamped = 0.0, True
    if end > duration:
        end, clamped = duration, True
    if end <= start:
        raise ValueError(f"empty window [{start:g}, {end:g}]")
    return start, end, clamped


@register_tool
class CropVideo(Tool):
    """crop_video(video_path, start_time, end_time): look closely at a window of the video."""

    name = "crop_video"
    schema = CROP_VIDEO_SCHEMA
    positional, time_params, window_tag = CROP_VIDEO_SYNTAX.positional, CROP_VIDEO_SYNTAX.time_params, CROP_VIDEO_SYNTAX.window_tag
    stage_defaults = ("crop",)

    def __init__(self, crop: CropConfig | dict | None = None, **options: Any):
        """``crop``: the stage's crop settings; ``options``: fields of :class:`CropConfig` overriding them
        (``tools: {crop_video: {fps: 2.0}}``)."""
        base = CropConfig(**crop) if isinstance(crop, dict) else (crop or CropConfig())
        if options:
            import dataclasses  # noqa: PLC0415

            bad = sorted(set(options) - {f.name for f in dataclasses.fields(CropConfig)})
            if bad:
                raise TypeError(f"unknown crop_video options {bad}")
            base = dataclasses.replace(base, **options)
        self.cfg = base

    def window(self, arguments: dict[str, Any]) -> tuple[float, float] | None:
        s, e = arguments.get("start_time", arguments.get("start")), arguments.get("end_time", arguments.get("end"))
        return (float(s), float(e)) if is_number(s) and is_number(e) else None

    async def execute(self, call: ToolCall, ctx: ToolContext) -> ToolResult:
        t0 = time.perf_counter()
        try:
            start, end, clamped = validate_window(call.arguments, ctx.duration)
        except ValueError as exc:
            return self.error(str(exc), t0)
        c = self.cfg
        try:
            frames = await run_decode(sample_crop, ctx.video_path, start, end, c.fps, c.min_frames,
                                      c.max_frames, c.factor, c.min_pixels, c.max_pixels, c.decoder)
        except VideoError as exc:  # the episode's own video: not the model's mistake
            return self.error(str(exc), t0, fault=True)
        if c.mode == "frames":
            note = f"{len(frames)} frame(s) from {start:.1f} to {end:.1f} seconds."
            content = prompts.frames_content(frames) + [{"type": "text", "text": note}]
            return ToolResult(True, content, note, window=(start, end), clamped=clamped, seconds=time.perf_counter() - t0)
        try:
            sub = await asyncio.wait_for(self._subagent(frames, start, end, ctx), timeout=c.subagent_timeout_s)
        except asyncio.TimeoutError:
            return self.error(f"sub-agent timed out after {c.subagent_timeout_s:g} s", t0, fault=True)
        if sub.finish_reason == "error":
            return self.error(f"sub-agent engine error: {sub.text}", t0, fault=True)
        text = sub.text.strip() or "(no description)"
        if sub.finish_reason == "length":
            text = prompts.truncate_note(text)
        return ToolResult(True, text, text, window=(start, end), clamped=clamped, subagent=sub,
                          seconds=time.perf_counter() - t0)

    async def _subagent(self, frames, start: float, end: float, ctx: ToolContext) -> SubAgentTrajectory:
        """One weight-sharing sub-agent: crop frames + summary prompt → a factual summary, on the
        main agent's own engine, through the episode's conversation path
        (:func:`paravt.agent.conversation.ask_once`)."""
        from paravt.agent.conversation import ask_once  # noqa: PLC0415 - the encoder loads with a sub-agent
        from paravt.core.seeding import stable_hash  # noqa: PLC0415

        messages = subagent_messages(frames, start, end)
        params = SamplingParams(temperature=self.cfg.subagent_temperature, max_new_tokens=self.cfg.subagent_max_tokens,
                                seed=stable_hash(ctx.seed, "subagent", ctx.turn, ctx.call_index))
        seq, text, finish_reason = await ask_once(ctx.engine, ctx.processor, messages, params)
        return SubAgentTrajectory((ctx.turn, ctx.call_index), seq, text, finish_reason)


def subagent_messages(frames, start: float, end: float) -> list[dict[str, Any]]:
    """What a crop_video sub-agent is asked: the crop's frames, then the summary prompt of its window."""
    return [{"role": "user", "content": prompts.frames_content(frames)
             + [{"type": "text", "text": "\n" + prompts.subagent_prompt(start, end)}]}]


def unknown_tool_result(name: str, available: list[str]) -> ToolResult:
    text = f"[Error: unknown tool {name!r}; available tools: {', '.join(available)}]"
    return ToolResult(False, text, text, error=f"unknown tool {name!r}")


__all__ = ["CropConfig", "CropVideo", "TOOL_REGISTRY", "Tool", "ToolContext", "ToolResult", "build_tools",
           "call_parser", "check_tools", "recipe_call_parser", "register_tool", "resolve_tool", "subagent_messages",
           "tool_specs", "validate_window", "unknown_tool_result"]
