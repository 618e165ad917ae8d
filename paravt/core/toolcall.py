"""THE tool-call parser, shared by RL rollouts, the RL reward and the eval driver.

Public API::

    parser = ToolCallParser(syntaxes)   # the configured tools' CallSyntax (paravt.agent.tools.call_parser)
    result = parser.parse(text)
    result.calls   # list[ToolCall]: .name (str), .arguments (dict)
    result.errors  # list[str]: one message per block that could not be parsed

Accepted forms (in order of precedence, as the release's parser accepts them):

1. Hermes JSON blocks ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
   several per turn; an unclosed last block still counts; ``"parameters"`` is an alias of
   ``"arguments"``; ``"arguments"`` may itself be a JSON string; a block may hold a JSON list.
2. If no ``<tool_call>`` block exists: Python-call syntax inside ``<tool_code>`` blocks, e.g.
   ``name(a, b=1)``; positional arguments are mapped to the tool's declared parameter order;
   a ``print(...)`` wrapper is unwrapped; stray trailing quotes are tolerated.
3. If neither exists: window blocks (VideoZoomer-style ``<video_zoom>``) holding
   ``{"start": s, "end": e}`` or a ``[s, e]`` pair, mapped to the tool that declares that tag.

The parser knows no tool by name: it is built from the :class:`CallSyntax` of each tool a recipe
configures (positional order, the parameters that are times, an optional window tag), and reads
exactly those; a call of any other name is read from its JSON or keyword form only. Time parameters
given as strings ("12.5", "12.5s", "01:05", "1:02:03") are normalised to float seconds. The parser
never raises on model text.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable


@dataclass(frozen=True)
class CallSyntax:
    """How the parser reads one tool's calls.

    ``positional``: parameter order for positional arguments of ``<tool_code>`` calls;
    ``time_params``: parameters whose string values are times ("01:05" -> 65.0);
    ``window_tag``: a tag whose blocks (``<tag>[s, e]</tag>``) are calls of this tool with
    ``time_params[0] = s`` and ``time_params[1] = e``."""

    name: str
    positional: tuple[str, ...] = ()
    time_params: tuple[str, ...] = ()
    window_tag: str | None = None


def _block_re(tag: str) -> re.Pattern:
    t = re.escape(tag)
    return re.compile(rf"<{t}>(.*?)(?:</{t}>|(?=<{t}>)|\Z)", re.DOTALL)


_TOOL_CALL_RE = _block_re("tool_call")
_TOOL_CODE_RE = _block_re("tool_code")
_CLOCK_RE = re.compile(r"^\s*(?:(\d+):)?(\d{1,2}):(\d{1,2}(?:\.\d+)?)\s*$")
_SECONDS_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:s|sec|secs|second|seconds)?\s*$", re.IGNORECASE)
_TIME_TOKEN = r"(?:\d{1,2}:\d{2}(?::\d{2})?(?:\.\d+)?|\d+(?:\.\d+)?)"
_STRAY_QUOTE_RE = re.compile(r"([=,(]\s*-?\d+(?:\.\d+)?)\s*['\"`]+(\s*[,)])")  # end_time=20.0')
_PAIR_RE = re.compile(rf"({_TIME_TOKEN})\s*(?:,|-|–|to)\s*({_TIME_TOKEN})")


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    source: str = "tool_call"  # tool_call | tool_code | a window tag (video_zoom)
    raw: str = ""


@dataclass
class ParseResult:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def has_call(self) -> bool:
        return bool(self.calls)


MAX_BLOCK_CHARS = 4096  # a longer call block is an error, not parsed (bounds the regex work on degenerate text)


def _too_long(tag: str, body: str) -> str:
    """The error of a call block over MAX_BLOCK_CHARS, naming a runaway number when there is one."""
    run = max((len(m) for m in re.findall(r"\d+", body)), default=0)
    why = f"a number of {run} digits" if run > 64 else f"{len(body)} characters"
    return f"<{tag}> block too long ({why}; max {MAX_BLOCK_CHARS} characters): {_short(body)}"


def parse_time(value: Any) -> Any:
    """Float seconds from a number or a time string; the value unchanged when not a time. A number
    that is not a finite float (NaN, ±Infinity, 1e309, a 400-digit integer) becomes its text, so
    validation rejects it with a clear message and every record stays strict JSON."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        try:
            f = float(value)
        except OverflowError:
            return _short(str(value), 40)
        return f if math.isfinite(f) else str(value)
    if not isinstance(value, str):
        return value
    if len(value) > 64:
        return value
    m = _CLOCK_RE.match(value)
    if m:
        hours = float(m.group(1) or 0)
        return hours * 3600 + float(m.group(2)) * 60 + float(m.group(3))
    m = _SECONDS_RE.match(value)
    if m:
        f = float(m.group(1))
        return f if math.isfinite(f) else value
    return value


def _normalise_arguments(name: str, args: dict[str, Any], syntaxes: dict[str, CallSyntax]) -> dict[str, Any]:
    out = {k: _finite_or_text(v) for k, v in args.items()}
    syntax = syntaxes.get(name)
    for key in syntax.time_params if syntax else ():
        if key in out:
            out[key] = parse_time(out[key])
    return out


def _finite_or_text(v: Any) -> Any:
    """NaN / ±Infinity (json.loads accepts them, json.dumps would write invalid JSON) become text."""
    return str(v) if isinstance(v, float) and not math.isfinite(v) else v


def _call_from_obj(obj: Any, raw: str, syntaxes: dict[str, CallSyntax]) -> ToolCall:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("missing 'name'")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = json.loads(args) if args.strip() else {}
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ValueError(f"'arguments' must be an object, got {type(args).__name__}")
    return ToolCall(name=name.strip(), arguments=_normalise_arguments(name.strip(), args, syntaxes), source="tool_call",
                    raw=raw)


def _loads_lenient(body: str) -> Any:
    """json.loads, then the first JSON value in the text (tolerates trailing junk)."""
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        pass
    starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
    if not starts:
        raise ValueError("no JSON object in block")
    obj, _ = json.JSONDecoder().raw_decode(body[min(starts):])
    return obj


def _short(text: str, n: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _parse_json_blocks(text: str, result: ParseResult, syntaxes: dict[str, CallSyntax]) -> None:
    for m in _TOOL_CALL_RE.finditer(text):
        body = m.group(1).strip()
        if not body:
            result.errors.append("empty <tool_call> block")
            continue
        if len(body) > MAX_BLOCK_CHARS:
            result.errors.append(_too_long("tool_call", body))
            continue
        body = re.sub(r"^```(?:json)?\s*|\s*```$", "", body)
        try:
            obj = _loads_lenient(body)
            objs = obj if isinstance(obj, list) else [obj]
            if not objs:
                raise ValueError("empty list")
        except Exception as exc:  # noqa: BLE001 - any failure is this block's, never the turn's
            result.errors.append(f"invalid <tool_call> JSON ({exc}): {_short(body)}")
            continue
        for o in objs:  # each call fails alone: a bad one never drops the valid ones after it
            try:
                result.calls.append(_call_from_obj(o, body, syntaxes))
            except Exception as exc:  # noqa: BLE001
                result.errors.append(f"invalid <tool_call> JSON ({exc}): {_short(body)}")


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if isinstance(node, ast.Name):  # bare identifier, e.g. video_path=video
            return node.id
        raise ValueError(f"non-literal argument {ast.dump(node)[:60]}")


def _parse_python_call(body: str, syntaxes: dict[str, CallSyntax]) -> ToolCall:
    src = body.strip()
    src = re.sub(r"^```(?:python|py)?\s*|\s*```$", "", src).strip()
    last_exc: Exception | None = None
    # Stray quotes are tolerated: trailing quotes/backticks are stripped one at a time, and a
    # quote stuck between a number and the closing parenthesis (``end_time=20.0')``, a common
    # model slip) is dropped.
    for _ in range(5):
        try:
            tree = ast.parse(src, mode="eval")
            break
        except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
            last_exc = exc
            if src and src[-1] in "'\"`":
                src = src[:-1].rstrip()
                continue
            fixed = _STRAY_QUOTE_RE.sub(r"\1\2", src)
            if fixed != src:
                src = fixed
                continue
            raise ValueError(f"not a Python call: {exc.__class__.__name__}") from None
    else:
        raise ValueError(f"not a Python call: {last_exc}")
    node = tree.body
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print" and node.args:
        node = node.args[0]
    if not isinstance(node, ast.Call):
        raise ValueError("not a function call")
    func = node.func
    if isinstance(func, ast.Name):
        name = func.id
    elif isinstance(func, ast.Attribute):
        name = func.attr
    else:
        raise ValueError("unsupported callee")
    args: dict[str, Any] = {}
    order = syntaxes[name].positional if name in syntaxes else ()
    for i, a in enumerate(node.args):
        if i >= len(order):
            raise ValueError(f"too many positional arguments for {name}")
        args[order[i]] = _literal(a)
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError("**kwargs not supported")
        args[kw.arg] = _literal(kw.value)
    return ToolCall(name=name, arguments=_normalise_arguments(name, args, syntaxes), source="tool_code", raw=body)


def _parse_code_blocks(text: str, result: ParseResult, syntaxes: dict[str, CallSyntax]) -> None:
    for m in _TOOL_CODE_RE.finditer(text):
        body = m.group(1)
        if not body.strip():
            result.errors.append("empty <tool_code> block")
            continue
        if len(body) > MAX_BLOCK_CHARS:
            result.errors.append(_too_long("tool_code", body))
            continue
        try:
            result.calls.append(_parse_python_call(body, syntaxes))
        except Exception as exc:  # noqa: BLE001 - this block's failure, never the turn's
            # One call per line is accepted too (``f(...)\nf(...)``).
            lines = [ln for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("#")]
            if len(lines) < 2:
                result.errors.append(f"invalid <tool_code> ({exc}): {_short(body)}")
                continue
            for ln in lines:
                try:
                    result.calls.append(_parse_python_call(ln, syntaxes))
                except Exception as exc_ln:  # noqa: BLE001
                    result.errors.append(f"invalid <tool_code> ({exc_ln}): {_short(ln)}")


def _parse_window_blocks(text: str, syntax: CallSyntax, result: ParseResult) -> None:
    tag = syntax.window_tag
    for m in _block_re(tag).finditer(text):
        body = m.group(1).strip()
        if len(body) > MAX_BLOCK_CHARS:
            result.errors.append(_too_long(tag, body))
            continue
        try:
            start = end = None
            try:
                obj = _loads_lenient(body)
            except (ValueError, TypeError):
                obj = None
            if isinstance(obj, dict):
                start = obj.get("start_time", obj.get("start"))
                end = obj.get("end_time", obj.get("end"))
            elif isinstance(obj, list) and len(obj) == 2:
                start, end = obj
            else:
                pm = _PAIR_RE.search(body) if len(body) <= 512 else None  # the pair regex is quadratic on digit runs
                if pm:
                    start, end = pm.group(1), pm.group(2)
            if start is None or end is None:
                raise ValueError("no start/end")
            s_key, e_key = syntax.time_params[:2]
            args = _normalise_arguments(syntax.name, {s_key: start, e_key: end}, {syntax.name: syntax})
            result.calls.append(ToolCall(name=syntax.name, arguments=args, source=tag, raw=body))
        except Exception as exc:  # noqa: BLE001
            result.errors.append(f"invalid <{tag}> ({exc}): {_short(body)}")


class ToolCallParser:
    """Reads the tool calls of one assistant turn with the given tools' syntaxes (a recipe's tools:
    :func:`paravt.agent.tools.call_parser`); without any, JSON and keyword calls are still read."""

    def __init__(self, syntaxes: Iterable[CallSyntax] = ()):
        self.syntaxes: dict[str, CallSyntax] = {}
        for syntax in syntaxes:
            if syntax.window_tag and len(syntax.time_params) < 2:
                raise ValueError(f"{syntax.name}: a window tag needs two time parameters (start, end)")
            other = next((s.name for s in self.syntaxes.values() if s.window_tag and s.window_tag == syntax.window_tag
                          and s.name != syntax.name), None)
            if other:
                raise ValueError(f"{syntax.name}: window tag <{syntax.window_tag}> is already {other}'s")
            self.syntaxes[syntax.name] = syntax

    def parse(self, text: str | None) -> ParseResult:
        """Parse every tool call of one assistant turn. Never raises on model text."""
        result = ParseResult()
        if not text:
            return result
        if not isinstance(text, str):
            result.errors.append(f"expected text, got {type(text).__name__}")
            return result
        try:
            if "<tool_call>" in text:
                _parse_json_blocks(text, result, self.syntaxes)
            elif "<tool_code>" in text:
                _parse_code_blocks(text, result, self.syntaxes)
            else:
                for syntax in self.syntaxes.values():
                    if syntax.window_tag and f"<{syntax.window_tag}>" in text:
                        _parse_window_blocks(text, syntax, result)
        except Exception as exc:  # noqa: BLE001 - the contract is: never raise on model text
            result.errors.append(f"parser error: {exc.__class__.__name__}: {exc}")
        return result


_RELEASE_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_RELEASE_CODE_RE = re.compile(r"<tool_code>(.*?)(?:</tool_code>|$)", re.DOTALL)


def release_has_tool_call(text: str) -> bool:
    """The release's reward test for "a parseable tool call" (looser than :meth:`ToolCallParser.parse`):
    a ``<tool_call>`` body that is exactly one JSON object with a ``name``, or a ``<tool_code>``
    body with any non-comment line containing ``(``. Used by ``rules: release`` rewards only;
    episodes always execute what :meth:`ToolCallParser.parse` finds."""
    for body in _RELEASE_CALL_RE.findall(text or ""):
        body = body.strip()
        if not body or body.startswith("<|im_end|>"):
            continue
        try:
            obj = json.loads(body)
        except (json.JSONDecodeError, ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and "name" in obj:
            return True
    for body in _RELEASE_CODE_RE.findall(text or ""):
        body = body.strip()
        if not body or body.startswith("<|im_end|>"):
            continue
        if any("(" in ln.strip() and not ln.strip().startswith("#") for ln in body.splitlines() if ln.strip()):
            return True
    return False


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def render_tools_block(schemas: list[dict[str, Any]]) -> str:
    """The ``<tools>…</tools>`` block listing the tool schemas, one JSON object per line."""
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return f"<tools>\n{lines}\n</tools>"


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """Canonical text of one call, as the policy is taught to write it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"
