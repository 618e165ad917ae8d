"""The inference-engine interface used by RL rollouts, eval and the inference demo.

An engine generates from **token ids** (with the images whose placeholder tokens are already
expanded in those ids) and returns the exact output token ids, one log-probability per
output token, a finish reason and the version of the weights that produced them::

    out = await engine.generate(input_ids, images, SamplingParams(temperature=0.7, seed=3))
    out.token_ids, out.logprobs, out.finish_reason, out.weight_version
    await engine.update_weights(path_or_state_dict, version)
    await engine.health(); await engine.close()

Log-probabilities are of the sampled token under ``softmax(logits / temperature)`` (the
distribution the token was drawn from, before top-p/top-k truncation; temperature 0 → 1),
which is what the PPO importance ratio compares against.

Chat engines (an OpenAI-compatible server) take messages instead of ids; they implement
:class:`ChatEngine`. The episode works with either (see :mod:`paravt.agent.conversation`).
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from typing import Any, Sequence


class EngineError(RuntimeError):
    """The engine failed in a way the caller should see (server died, bad request)."""


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 512
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    # OpenAI / vLLM / SGLang semantics, over the tokens generated so far (never the prompt): each
    # candidate's logit minus frequency_penalty x its count, minus presence_penalty if it occurred.
    # Eval-only knobs (they break copy loops); RL keeps 0 so the sampler is the policy its
    # logprobs describe. Logprobs stay the model's raw ones either way.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self):
        if self.temperature < 0 or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            if not -2.0 <= v <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2] (the OpenAI range), got {v}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class GenerationOutput:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (eos / stop string), "length", "error"
    weight_version: int = 0
    text: str | None = None
    error: str | None = None
    latency_s: float = 0.0
    prompt_token_ids: list[int] | None = None  # the prompt as the server tokenised it (chat servers that return it)

    def __post_init__(self):
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")


class InferenceEngine(abc.ABC):
    """Token-level engine: the HF in-process engine and the SGLang server client."""

    weight_version: int = 0

    @abc.abstractmethod
    async def generate(self, input_ids: Sequence[int], images: Sequence[Any] | None,
                       params: SamplingParams) -> GenerationOutput:
        ...

    @abc.abstractmethod
    async def update_weights(self, source: Any, version: int | None = None) -> None:
        """Load new policy weights: a checkpoint directory or (in-process) a state dict."""

    def for_episode(self, key: str) -> "InferenceEngine":
        """The engine one episode (its turns and its sub-agents) sends every request to. One engine
        is its own; a pool of servers (:class:`~paravt.engines.pool.EnginePool`) returns a view that
        keeps the episode ``key`` on one server."""
        return self

    async def health(self) -> bool:
        return True

    async def close(self) -> None:
        return None


class ChatEngine(abc.ABC):
    """Message-level engine: an OpenAI-compatible chat-completions server."""

    weight_version: int = 0

    @abc.abstractmethod
    async def chat(self, messages: list[dict[str, Any]], params: SamplingParams, prefix: str = "") -> GenerationOutput:
        """Complete the conversation; ``prefix`` is forced text the assistant turn starts with
        (sent as a continued assistant message); the returned text excludes it."""

    def for_episode(self, key: str) -> "ChatEngine":  # noqa: ARG002 - one server: every request on it
        """See :meth:`InferenceEngine.for_episode`."""
        return self

    async def health(self) -> bool:
        return True

    async def close(self) -> None:
        return None
