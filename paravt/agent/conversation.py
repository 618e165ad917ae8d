"""A conversation the episode can extend turn by turn, on a token engine or a chat engine.

:class:`TokenConversation` keeps the **exact token ids**: the prompt ids, then each generated
turn as the engine returned it (policy tokens, mask 1), then the template tokens and tool
responses rendered for only the new part (context tokens, mask 0). Nothing is re-tokenised.
New turns are rendered with the model's own chat template: the template renders the whole
conversation, and the text after the last assistant message is what gets appended.

:class:`ChatConversation` keeps OpenAI-style messages for a chat engine (eval against a
server); token ids are recorded when the server returns them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from paravt.agent.trajectory import SequenceRecord
from paravt.engines.base import ChatEngine, GenerationOutput, InferenceEngine, SamplingParams
from paravt.models.images import ImageInputs
from paravt.models.tokenize import encode_text, images_of, think_token_ids, vision_token_ids

_PLACEHOLDER = "\x00PARAVT\x00"


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
        out: GenerationOutput = await self.engine.generate(self.record.input_ids, self.record.images, params)
        if out.error:
            return TurnOutput("", [], [], "error", out.weight_version, time.perf_counter() - t0, out.error)
        bad = set(out.token_ids) & self.vision_ids
        if bad:  # an engine that does not ban them (a server): the sequence would break the trainer's forward
            return TurnOutput("", [], [], "error", out.weight_version, time.perf_counter() - t0,
                              f"the model generated vision placeholder token(s) {sorted(bad)}")
        self.record.add(out.token_ids, "policy", out.logprobs)
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
        out = await self.engine.chat(self.messages, params, prefix=self.prefix)
        if out.error:
            return TurnOutput("", [], [], "error", out.weight_version, time.perf_counter() - t0, out.error)
        text = out.text or ""
        if out.prompt_token_ids:  # the server's own prompt ids: what the model saw, not re-tokenised here
            if self.first_served_prompt is None:
                self.first_served_prompt = list(out.prompt_token_ids)
            self.record.add(out.prompt_token_ids[len(self.record):], "context")
        self.record.add(out.token_ids, "policy", out.logprobs)
        self.messages.append({"role": "assistant", "content": self.prefix + text})
        return TurnOutput(text, out.token_ids, out.logprobs, out.finish_reason, out.weight_version,
                          time.perf_counter() - t0)

    def add_messages(self, new: list[dict[str, Any]], prefix: str = "") -> None:
        self.messages.extend(new)
        self.prefix = prefix
