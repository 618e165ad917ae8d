"""A conversation the episode can extend turn by turn, on a token engine or a chat engine.

:class:`TokenConversation` keeps the **exact token ids**: the prompt ids, then each generated
turn as the engine returned it (policy tokens, mask 1), then the template tokens and tool
responses rendered for only the new part (context tokens, mask 0). Nothing is re-tokenised.
New turns are rendered with the model's own chat template: the template renders the whole
conversation, and the text after the last assistant message is what gets appended.

:class:`ChatConversation` keeps OpenAI-style messages for a chat engine (eval against a
server); token ids are recorded when the server returns them.

Every generation of an episode goes through :func:`generate_tokens` or :func:`generate_chat`: the
main agent's turns (:func:`open_conversation`) and each sub-agent's one exchange (:func:`ask_once`),
so a check on what the model generated (a vision placeholder token) holds for both.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from paravt.agent.trajectory import SequenceRecord
from paravt.engines.base import ChatEngine, GenerationOutput, InferenceEngine, SamplingParams
from paravt.models.images import ImageInputs
from paravt.models.tokenize import (encode_prompt, encode_text, images_of, run_encode, think_token_ids,
                                    vision_token_ids)

_PLACEHOLDER = "\x00PARAVT\x00"


async def generate_tokens(engine: InferenceEngine, record: SequenceRecord, vision_ids: set[int],
                          params: SamplingParams) -> GenerationOutput:
    """One generation on ``record``'s ids and images; the generated ids join it as policy tokens.
    An engine error, or a generated vision placeholder token (an engine that does not ban them, a
    server: the sequence would break the trainer's forward), comes back as ``error`` and the record
    is left as it was."""
    out = await engine.generate(record.input_ids, record.images, params)
    if out.error:
        return out
    bad = set(out.token_ids) & vision_ids
    if bad:
        return dataclasses.replace(out, error=f"the model generated vision placeholder token(s) {sorted(bad)}")
    record.add(out.token_ids, "policy", out.logprobs)
    return out


async def generate_chat(engine: ChatEngine, messages: list[dict[str, Any]], record: SequenceRecord,
                        params: SamplingParams, prefix: str = "") -> GenerationOutput:
    """One completion of ``messages`` through the chat API; unless it failed, the record gets the
    server's prompt ids past what it holds (when the server returns them: what the model saw, not
    re-tokenised here) as context and the generated ids as policy tokens."""
    out = await engine.chat(messages, params, prefix=prefix)
    if out.error:
        return out
    if out.prompt_token_ids:
        record.add(out.prompt_token_ids[len(record):], "context")
    record.add(out.token_ids, "policy", out.logprobs)
    return out


@dataclass
class TurnOutput:
    text: str  # generated text only (no forced prefix)
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_version: int
    seconds: float
    error: str | None = None


class TokenConversation:
    def __init__(self, engine: InferenceEngine, processor, prompt_ids: list[int], images: ImageInputs | None,
                 messages: list[dict[str, Any]], prefix: str = ""):
        self.engine, self.processor = engine, processor
        self.tokenizer = processor.tokenizer
        self.record = SequenceRecord(images=images, think_ids=think_token_ids(processor.tokenizer))
        self.record.add(prompt_ids, "context")
        self.messages = list(messages)  # kept only to render deltas with the chat template
        self.prefix = prefix
        self.eos_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.vision_ids = set(vision_token_ids(self.tokenizer))

    def __len__(self) -> int:
        return len(self.record)

    async def generate(self, params: SamplingParams) -> TurnOutput:
        t0 = time.perf_counter()
        out = await generate_tokens(self.engine, self.record, self.vision_ids, params)
        if out.error:
            return TurnOutput("", [], [], "error", out.weight_version, time.perf_counter() - t0, out.error)
        ids = out.token_ids[:-1] if out.token_ids and out.token_ids[-1] == self.eos_id else out.token_ids
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        ended = bool(out.token_ids) and out.token_ids[-1] == self.eos_id
        if not ended:  # close the turn with a template token (not trained on)
            self.record.add([self.eos_id], "context")
        self.messages.append({"role": "assistant", "content": self.prefix + text})
        return TurnOutput(text, out.token_ids, out.logprobs, out.finish_reason, out.weight_version,
                          time.perf_counter() - t0)

    def add_messages(self, new: list[dict[str, Any]], prefix: str = "") -> None:
        """Append messages (tool responses, a user message) + the next generation prompt + prefix."""
        # Render everything with a placeholder as the last assistant content; the text after
        # the placeholder's turn end is exactly what the template adds for the new messages.
        last = self.messages[-1]
        probe = self.messages[:-1] + [{"role": "assistant", "content": _PLACEHOLDER}] + new
        full = self.processor.apply_chat_template(probe, tokenize=False, add_generation_prompt=True) + prefix
        after = full.split(_PLACEHOLDER, 1)[1]
        eos = "<|im_end|>"
        if not after.startswith(eos):
            raise ValueError("chat template does not end assistant turns with <|im_end|>")
        delta = after[len(eos):]
        ids, imgs = encode_text(self.processor, delta, images_of(new))
        self.record.add(ids, "context")
        if imgs is not None:
            self.record.images = (self.record.images + imgs) if self.record.images is not None else imgs
        self.messages = self.messages[:-1] + [last] + list(new)
        self.prefix = prefix


class ChatConversation:
    """Messages for a chat engine; the forced prefix is sent as a continued assistant message."""

    def __init__(self, engine: ChatEngine, messages: list[dict[str, Any]], prefix: str = ""):
        self.engine = engine
        self.messages = list(messages)
        self.prefix = prefix
        self.record = SequenceRecord()
        self.first_served_prompt: list[int] | None = None  # the first turn's prompt ids as the server returned them

    def __len__(self) -> int:
        return len(self.record)

    async def generate(self, params: SamplingParams) -> TurnOutput:
        t0 = time.perf_counter()
        out = await generate_chat(self.engine, self.messages, self.record, params, self.prefix)
        if out.error:
            return TurnOutput("", [], [], "error", out.weight_version, time.perf_counter() - t0, out.error)
        text = out.text or ""
        if out.prompt_token_ids and self.first_served_prompt is None:
            self.first_served_prompt = list(out.prompt_token_ids)
        self.messages.append({"role": "assistant", "content": self.prefix + text})
        return TurnOutput(text, out.token_ids, out.logprobs, out.finish_reason, out.weight_version,
                          time.perf_counter() - t0)

    def add_messages(self, new: list[dict[str, Any]], prefix: str = "") -> None:
        self.messages.extend(new)
        self.prefix = prefix


def open_conversation(engine, processor, messages: list[dict[str, Any]], prefix: str = "",
                      prompt_ids: list[int] | None = None, images: ImageInputs | None = None):
    """The main agent's conversation on ``engine``: messages through the chat API on a chat engine
    (an OpenAI-compatible server), else the exact token ids ``prompt_ids`` (``messages`` encoded
    with the processor, images included, generation prompt and ``prefix`` appended)."""
    if isinstance(engine, ChatEngine):
        return ChatConversation(engine, messages, prefix)
    return TokenConversation(engine, processor, prompt_ids, images, messages, prefix)


async def ask_once(engine, processor, messages: list[dict[str, Any]],
                   params: SamplingParams) -> tuple[SequenceRecord, str, str]:
    """One assistant reply to ``messages`` alone (a sub-agent's exchange) on the engine's own path:
    the chat API on a chat engine, else token ids encoded here (off the event loop). Returns the
    sequence, the reply text (special tokens dropped) and the finish reason; a failed generation
    is finish reason ``"error"`` with the error as the text."""
    if isinstance(engine, ChatEngine):
        record = SequenceRecord()
        out = await generate_chat(engine, messages, record, params)
        text = out.text or ""
    else:
        ids, images = await run_encode(encode_prompt, processor, messages)
        record = SequenceRecord(images=images)
        record.add(ids, "context")
        out = await generate_tokens(engine, record, set(vision_token_ids(processor.tokenizer)), params)
        text = "" if out.error else processor.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    return (record, out.error, "error") if out.error else (record, text, out.finish_reason)
