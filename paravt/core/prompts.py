"""Prompts and message building, shared by SFT data, RL episodes and eval.

Messages are OpenAI-style dicts whose ``content`` is a string or a list of items
``{"type": "text", "text": ...}`` / ``{"type": "image", "image": PIL.Image}``. The
overview of a video is sent as frames-as-images, each preceded by a ``<t seconds>`` text
item (the paper §3.1), never as a video tensor, so no video processor is needed.

System prompt templates live in ``configs/prompts/<mode>.txt`` (override the folder with
``prompt_dir``); adding a mode is adding a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Sequence

from paravt.core.config import check_choice
from paravt.core.toolcall import render_tools_block

THINK_PREFIX = "<think>\n"
PROMPT_DIR = Path(__file__).resolve().parents[2] / "configs" / "prompts"
BUILTIN_MODES = ("direct", "reasoning", "agentic_general", "agentic_minimal")
AGENTIC_MODES = ("agentic_general", "agentic_minimal")
SUBAGENT_TEMPLATE = "subagent"


def _template_path(name: str, prompt_dir: str | Path | None) -> Path:
    path = Path(prompt_dir or PROMPT_DIR) / f"{name}.txt"
    if not path.is_file():
        available = sorted(p.stem for p in Path(prompt_dir or PROMPT_DIR).glob("*.txt"))
        raise FileNotFoundError(f"prompt template {path} not found (available modes: {available})")
    return path


def available_modes(prompt_dir: str | Path | None = None) -> list[str]:
    return sorted(p.stem for p in Path(prompt_dir or PROMPT_DIR).glob("*.txt") if p.stem != SUBAGENT_TEMPLATE)


def system_prompt(mode: str, tool_schemas: list[dict] | None = None, prompt_dir: str | Path | None = None) -> str:
    """The system prompt of a mode, with ``{tools}`` replaced by the tools block of ``tool_schemas``
    (a mode whose template lists tools needs them)."""
    text = _template_path(mode, prompt_dir).read_text(encoding="utf-8").strip()
    if "{tools}" in text:
        if not tool_schemas:
            raise ValueError(f"prompt mode {mode!r} lists tools: pass the tool schemas")
        text = text.replace("{tools}", render_tools_block(tool_schemas))
    return text


def format_timestamp(t: float) -> str:
    """The text item that precedes a frame: ``<12.0 seconds>``."""
    return f"<{t:.1f} seconds>"


def clock(t: float) -> str:
    """MM:SS (or H:MM:SS past an hour)."""
    t = max(0, int(round(t)))
    h, rem = divmod(t, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def frames_content(frames: Sequence[Any], timestamps: bool = True) -> list[dict[str, Any]]:
    """Content items for frames that carry ``.timestamp`` and ``.image``: text + image each
    (image only with ``timestamps=False``)."""
    items: list[dict[str, Any]] = []
    for f in frames:
        if timestamps:
            items.append({"type": "text", "text": format_timestamp(f.timestamp)})
        items.append({"type": "image", "image": f.image})
    return items


OverviewStyle = Literal["paravt", "release_eval"]
# where the first prompt comes from: configs/prompts/<prompt_mode>.txt + a header | the dataset row's own messages
PromptSource = Literal["mode", "row"]
Channel = Literal["image_url", "video_url"]  # overview frames decoded here | a chat server decodes the video


def overview_user_content(
    question: str, frames: Sequence[Any], video_path: str | None = None, duration: float | None = None,
    style: str = "paravt", tools: bool = False,
) -> list[dict[str, Any]]:
    """The main agent's first user turn.

    ``paravt``: a "Video / Duration" header, the K frames each after its ``<t seconds>`` text, the
    question. ``release_eval`` (the authors' eval driver): the K frames as bare images, then the
    question, plus "The video path for this video is: NAME" when tools are offered."""
    check_choice("overview style", style, OverviewStyle)
    if style == "release_eval":
        q = question.strip()
        if tools and video_path is not None and "video path" not in q.lower():
            q = f"{q} The video path for this video is: {video_path}"
        return frames_content(frames, timestamps=False) + [{"type": "text", "text": q}]
    items: list[dict[str, Any]] = []
    header = []
    if video_path is not None:
        header.append(f"Video: {video_path}")
    if duration is not None:
        header.append(f"Duration: {duration:.1f} seconds")
    if header:
        items.append({"type": "text", "text": "\n".join(header) + "\n"})
    items.extend(frames_content(frames))
    items.append({"type": "text", "text": "\n" + question.strip()})
    return items


def build_messages(
    mode: str,
    question: str,
    frames: Sequence[Any],
    video_path: str | None = None,
    duration: float | None = None,
    tool_schemas: list[dict] | None = None,
    prompt_dir: str | Path | None = None,
    style: str = "paravt",
) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": system_prompt(mode, tool_schemas, prompt_dir)},
        {"role": "user", "content": overview_user_content(question, frames, video_path, duration, style,
                                                          tools=bool(tool_schemas))},
    ]


VIDEO_MARK = "<video>"
TOOLS_MODE = "agentic_minimal"  # the bare Hermes tools block, appended to a row's system prompt


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(i.get("text", "") for i in content or [] if isinstance(i, dict) and i.get("type", "text") == "text")


def messages_from_row(row_prompt: Sequence[dict[str, Any]], frames: Sequence[Any],
                      tool_schemas: list[dict] | None = None, prompt_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """The release's RL prompt (``prompt_source: row``): the dataset row's own messages, the
    message holding the ``<video>`` mark gets the K frames (timestamp + image each) before its
    text (mark removed; the first user message when no mark exists); with tools, the Hermes tools
    block is appended to the row's system prompt unless it already has a ``<tools>`` block
    (a system message is added when the row has none)."""
    msgs = [{"role": m.get("role", "user"), "text": _text_of(m.get("content"))} for m in row_prompt]
    marked = [i for i, m in enumerate(msgs) if VIDEO_MARK in m["text"]]
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    video_at = marked[0] if marked else (users[0] if users else None)
    if video_at is None:
        raise ValueError("row prompt has no user message to attach the video to")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(msgs):
        if i == video_at:
            out.append({"role": m["role"],
                        "content": frames_content(frames) + [{"type": "text", "text": m["text"].replace(VIDEO_MARK, "")}]})
        else:
            out.append({"role": m["role"], "content": m["text"]})
    if tool_schemas:
        tools = system_prompt(TOOLS_MODE, tool_schemas, prompt_dir)
        if out[0]["role"] == "system":
            if "<tools>" not in out[0]["content"]:
                out[0]["content"] = out[0]["content"] + "\n\n" + tools
            else:  # a baked <tools> block (release rows): tools it does not list are added to it
                out[0]["content"] = add_to_tools_block(out[0]["content"], tool_schemas)
        else:
            out.insert(0, {"role": "system", "content": tools})
    return out


def add_to_tools_block(text: str, schemas: list[dict]) -> str:
    """``text`` with every schema whose function name its ``<tools>`` block lacks inserted before
    ``</tools>`` (one JSON line each); a block listing them all is left as it is."""
    import json  # noqa: PLC0415

    import re  # noqa: PLC0415

    m = re.search(r"<tools>\n(.*?)</tools>", text, re.DOTALL)  # the block (the prose may say "<tools></tools>")
    if not m:
        return text
    block = m.group(1)
    missing = [s for s in schemas if f'"{s.get("function", {}).get("name", "")}"' not in block]
    if not missing:
        return text
    lines = "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in missing)
    new_block = block if block.endswith("\n") or not block else block + "\n"
    return text[:m.start(1)] + new_block + lines + text[m.end(1):]


def subagent_prompt(start: float, end: float, prompt_dir: str | Path | None = None) -> str:
    tmpl = _template_path(SUBAGENT_TEMPLATE, prompt_dir).read_text(encoding="utf-8").strip()
    return tmpl.format(start=start, end=end, start_clock=clock(start), end_clock=clock(end), duration=end - start)


def parse_error_text(message: str) -> str:
    """What the model reads for a call block that does not parse: no tool ran, so no tool is named."""
    return f"[Error: the tool call could not be parsed: {message}]"


def truncate_note(text: str) -> str:
    return text.rstrip() + " [truncated]"
