"""One ParaVT episode, top to bottom (the paper §3.1; the release's hierarchical agent loop).

    sample ─► overview (K frames, cached per (sample id, K)) ─► prompt (+ "<think>\\n")
      └─► main-agent turn ─► parse ALL tool calls of the turn (the shared parser)
            ─► cap at max_parallel ─► validate / clamp each call (the sample's own video)
            ─► run every call CONCURRENTLY: a weight-sharing sub-agent on the same engine
               summarises the crop (or, eval-style, the crop's frames go straight back)
            ─► one user turn of <tool_response> blocks, in call order
      └─► next turn … up to ``max_turns`` tool rounds; a turn without tool calls ends it;
          after the last round one more turn answers (eval: with a forcing message).

The trajectory holds the exact token ids the engine produced (policy tokens: loss mask 1)
and everything else the model saw (prompt, template, tool responses: mask 0), with the
engine's logprobs, per-turn records, the K used and the sub-agent trajectories.
Nothing here raises on model output or tool failure: they become error tool responses and
counts in ``trajectory.stats``. An engine failure ends the episode with ``end_reason="error"``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paravt.agent.conversation import open_conversation
from paravt.models.tokenize import encode_prompt
from paravt.agent.tools import (CropConfig, Tool, ToolContext, ToolResult, build_tools, call_parser,
                               unknown_tool_result)
from paravt.agent.trajectory import ToolCallRecord, Trajectory, TurnRecord
from paravt.core import prompts
from paravt.core.config import check_choices, choice
from paravt.engines.router import end_episode
from paravt.core.seeding import stable_hash
from paravt.core.video import probe, run_decode, sample_overview
from paravt.core.video_reader import Frame
from paravt.engines.base import ChatEngine, SamplingParams
from paravt.models.images import ImageInputs

log = logging.getLogger(__name__)




@dataclass
class EpisodeConfig:
    prompt_mode: str = "agentic_general"
    # mode: system prompt of prompt_mode + "Video/Duration" header + frames + question (ours, eval);
    # row: the dataset row's own messages with the frames at its <video> mark (the release's RL prompt)
    prompt_source: str = choice(prompts.PromptSource)
    prompt_dir: str | None = None
    # tool key -> the tool's own options (paravt.agent.tools; a list of keys is accepted too); {}: no tools
    tools: dict[str, Any] = field(default_factory=lambda: {"crop_video": {}})
    max_turns: int = 3  # tool rounds; the assistant gets max_turns + 1 turns at most
    max_parallel: int | None = 5  # tool calls executed per turn (None: all); extra calls are dropped (counted)
    think_prefix: bool = True  # append "<think>\n" to every main-agent generation prompt
    temperature: float = 0.7
    top_p: float = 1.0
    frequency_penalty: float = 0.0  # eval knob (SamplingParams); RL leaves 0: samples stay on-policy
    presence_penalty: float = 0.0  # eval knob, as frequency_penalty
    max_new_tokens: int = 2048
    max_context_tokens: int = 32768
    crop: CropConfig = field(default_factory=CropConfig)
    overview_min_pixels: int = 784
    overview_max_pixels: int = 50176
    # paravt: "Video/Duration" header + "<t seconds>" before each frame; release_eval: bare frames
    # + the video-path sentence (the authors' eval driver). RL row prompts always carry timestamps.
    overview_style: str = choice(prompts.OverviewStyle)
    final_turn_prompt: str | None = None  # eval: a user message forcing the answer at the last turn
    final_turn_max_tokens: int | None = None
    sequential_tools: bool = False  # ablation/benchmark: run a turn's calls one after another
    overview_channel: str = choice(prompts.Channel)  # image_url: frames decoded here; video_url: a chat server decodes the video

    def __post_init__(self):
        if isinstance(self.crop, dict):
            self.crop = CropConfig(**self.crop)
        if self.max_turns < 0 or (self.max_parallel is not None and self.max_parallel < 1):
            raise ValueError("max_turns must be >= 0 and max_parallel >= 1 (or None: no cap)")
        check_choices(self)
        if self.prompt_mode not in prompts.available_modes(self.prompt_dir):
            raise ValueError(f"prompt_mode {self.prompt_mode!r} not in {prompts.available_modes(self.prompt_dir)}")

    @property
    def prefix(self) -> str:
        return prompts.THINK_PREFIX if self.think_prefix else ""

    @property
    def agentic(self) -> bool:
        """Tool calls are parsed and executed when tools are configured (the eval driver passes
        ``tools=[]`` for the no-tool modes)."""
        return bool(self.tools) and self.prompt_mode not in ("direct", "reasoning")


@dataclass
class EpisodeSample:
    sample_id: str
    question: str
    video_path: str
    duration: float | None = None
    answer: Any = None
    question_type: str = "oe"
    extra: dict[str, Any] = field(default_factory=dict)
    prompt: list[dict[str, Any]] | None = None  # the row's own messages (prompt_source=row)

    @classmethod
    def from_row(cls, row) -> "EpisodeSample":
        """From a :class:`paravt.data.schema.RLRow`."""
        return cls(row.sample_id, row.question, row.video, row.extra_info.get("duration"), row.answer,
                   row.question_type, dict(row.extra_info), list(row.prompt))


@dataclass
class Overview:
    frames: list[Frame]
    messages: list[dict[str, Any]]
    prompt_ids: list[int] | None
    images: ImageInputs | None
    duration: float


class OverviewCache:
    """Overview frames + prompt ids per (sample id, K, prompt mode): decoded and preprocessed
    once, shared by the n rollouts of a group. Keyed on the sample, not the video: two
    questions on one video have different prompts."""

    def __init__(self, max_items: int = 256):
        self.max_items = max_items
        self._items: OrderedDict[tuple, Overview] = OrderedDict()
        self._locks: dict[tuple, threading.Lock] = {}
        self._guard = threading.Lock()
        self.hits = self.misses = 0

    def get(self, sample: EpisodeSample, k: int, cfg: EpisodeConfig, processor, tool_schemas) -> Overview:
        key = (sample.sample_id, k, cfg.crop.decoder, cfg.prompt_mode, cfg.prompt_source, cfg.overview_style, cfg.think_prefix,
               cfg.overview_min_pixels,
               cfg.overview_max_pixels, processor is not None)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            with self._guard:
                if key in self._items:
                    self.hits += 1
                    self._items.move_to_end(key)
                    return self._items[key]
            ov = build_overview(sample, k, cfg, processor, tool_schemas)
            with self._guard:
                self.misses += 1
                self._items[key] = ov
                while len(self._items) > self.max_items:
                    old, _ = self._items.popitem(last=False)
                    self._locks.pop(old, None)
            return ov


def build_overview(sample: EpisodeSample, k: int, cfg: EpisodeConfig, processor, tool_schemas) -> Overview:
    duration = sample.duration if sample.duration else probe(sample.video_path, cfg.crop.decoder).duration
    if cfg.overview_channel == "video_url":  # server-side decode (eval against SGLang / vLLM)
        if processor is not None:
            raise ValueError("overview_channel=video_url needs a chat engine (the server decodes the video)")
        messages = prompts.build_messages(cfg.prompt_mode, sample.question, [], Path(sample.video_path).name,
                                          duration, tool_schemas if cfg.agentic else None, cfg.prompt_dir,
                                          cfg.overview_style)
        video = {"type": "video_url", "video_url": {"url": "file://" + str(Path(sample.video_path).resolve())},
                 "nframes": k, "duration": float(duration)}  # the chat client turns these into each server's fields
        messages[1]["content"].insert(0 if cfg.overview_style == "release_eval" else 1, video)
        return Overview([], messages, None, None, float(duration))
    if cfg.overview_channel == "video_url" and cfg.prompt_source == "row":
        raise ValueError("prompt_source=row builds frames-as-images prompts; use overview_channel=image_url")
    frames = sample_overview(sample.video_path, k, 32, cfg.overview_min_pixels, cfg.overview_max_pixels,
                             cfg.crop.decoder)  # one decoder knob (crop.decoder) for the overview and the crops
    schemas = tool_schemas if cfg.agentic else None
    if cfg.prompt_source == "row":
        if not sample.prompt:
            raise ValueError(f"sample {sample.sample_id}: prompt_source=row needs the row's prompt messages")
        messages = prompts.messages_from_row(sample.prompt, frames, schemas, cfg.prompt_dir)
    else:
        messages = prompts.build_messages(cfg.prompt_mode, sample.question, frames, Path(sample.video_path).name,
                                          duration, schemas, cfg.prompt_dir, cfg.overview_style)
    ids = images = None
    if processor is not None:
        ids, images = encode_prompt(processor, messages, cfg.prefix)
    return Overview(frames, messages, ids, images, float(duration))


async def run_episode(sample: EpisodeSample, engine, processor, cfg: EpisodeConfig, k: int, seed: int = 0,
                      cache: OverviewCache | None = None, tools: dict[str, Tool] | None = None) -> Trajectory:
    """Run one episode of the main agent on ``sample`` with a K-frame overview."""
    t_start = time.perf_counter()
    tools = tools if tools is not None else build_tools(cfg.tools, crop=cfg.crop)
    schemas = [t.schema for t in tools.values()]
    parser = call_parser(tools.values())  # reads exactly the calls of this episode's tools
    is_chat = isinstance(engine, ChatEngine)
    # every turn and every sub-agent of this episode on one server (a pool of servers pins it)
    engine = engine.for_episode(f"{sample.sample_id}/{seed}")

    # 1. Overview (K frames) and the prompt, cached per (sample id, K).
    ov = await run_decode((cache or OverviewCache(1)).get, sample, k, cfg,  # decode pool, off the loop
                          None if is_chat else processor, schemas)
    conv = open_conversation(engine, processor, ov.messages, cfg.prefix, ov.prompt_ids, ov.images)
    traj = Trajectory(sample.sample_id, k, conv.record, overview_times=[f.timestamp for f in ov.frames],
                      duration=ov.duration)
    prefix = cfg.prefix

    for turn in range(cfg.max_turns + 1):
        final = turn == cfg.max_turns
        if len(conv) >= cfg.max_context_tokens:
            traj.end_reason = "context"
            break
        # 2. Main-agent turn.
        max_new = cfg.max_new_tokens
        if final and cfg.final_turn_max_tokens:
            max_new = cfg.final_turn_max_tokens
        max_new = max(1, min(max_new, cfg.max_context_tokens - len(conv)))
        params = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=max_new,
                                frequency_penalty=cfg.frequency_penalty, presence_penalty=cfg.presence_penalty,
                                seed=stable_hash(seed, sample.sample_id, "main", turn))
        context_len = len(conv)  # the turn's position: every token before its generated text
        out = await conv.generate(params)
        if out.error:
            traj.end_reason, traj.error = "error", out.error
            break
        if is_chat and turn == 0:
            traj.served_prompt_ids = conv.first_served_prompt
        rec = TurnRecord(turn, prefix + out.text, len(out.token_ids), out.finish_reason,
                         generate_seconds=out.seconds, weight_version=out.weight_version,
                         context_len=context_len, prefix=prefix)
        traj.turns.append(rec)

        # 3. Parse every tool call of the turn with the shared parser.
        parsed = parser.parse(out.text) if cfg.agentic else None
        if parsed is None or (not parsed.calls and not parsed.errors):
            traj.end_reason = "answer" if out.finish_reason != "length" else "length"
            break
        rec.parse_errors = list(parsed.errors)
        if final:  # no tool round left: calls of the last turn are not executed
            traj.end_reason = "max_turns"
            break

        # 4. Cap, validate and run all calls concurrently.
        # Calls and unparseable blocks share the max_parallel slots; the rest is dropped (counted).
        cap = cfg.max_parallel if cfg.max_parallel is not None else len(parsed.calls) + len(parsed.errors)
        calls = parsed.calls[:cap]
        errors = parsed.errors[: cap - len(calls)]
        rec.dropped_calls = len(parsed.calls) + len(parsed.errors) - len(calls) - len(errors)
        t0 = time.perf_counter()
        jobs = [_execute(call, tools, ToolContext(sample.video_path, ov.duration, engine, processor,
                                                  seed=stable_hash(seed, sample.sample_id), turn=turn, call_index=i))
                for i, call in enumerate(calls)]
        if cfg.sequential_tools:
            results = [await job for job in jobs]
        else:
            results = await asyncio.gather(*jobs)
        rec.tools_seconds = time.perf_counter() - t0
        for call, res in zip(calls, results):
            rec.calls.append(ToolCallRecord(call.name, call.arguments, res.ok, res.window, res.error, res.clamped,
                                            res.text, res.seconds, res.fault))
            if res.subagent is not None:
                traj.subagents.append(res.subagent)
        responses: list[dict[str, Any]] = [{"role": "tool", "content": r.content} for r in results]
        responses += [{"role": "tool", "content": prompts.parse_error_text(e)}
                      for e in errors]

        # 5. Tool responses as one user turn, in call order; then the next generation prompt.
        new = responses
        if turn + 1 == cfg.max_turns and cfg.final_turn_prompt:
            new = responses + [{"role": "user", "content": cfg.final_turn_prompt}]
        conv.add_messages(new, prefix)
    else:  # pragma: no cover - the loop always breaks
        traj.end_reason = "max_turns"
    traj.seconds = time.perf_counter() - t_start
    await end_episode(engine)  # a router's session for this episode ends now (one that raises: the router's TTL)
    return traj


async def _execute(call, tools: dict[str, Tool], ctx: ToolContext) -> ToolResult:
    tool = tools.get(call.name)
    if tool is None:
        return unknown_tool_result(call.name, sorted(tools))
    try:
        return await tool.execute(call, ctx)
    except Exception as exc:  # noqa: BLE001 - a tool bug must not kill the episode
        log.exception("tool %s crashed", call.name)
        return tool.error(f"{type(exc).__name__}: {exc}", time.perf_counter(), fault=True)
