"""A rollout engine defined outside the package: one module and one EngineBackend, as docs/GUIDE.md
("Adding a rollout engine") shows. Its "server" is in this process: a scripted token engine (the
real tokenizer, scripted texts) whose control client records every weight push it is sent."""

from __future__ import annotations

from paravt.engines.factory import EngineHandle, EngineSpec, token_ids
from paravt.engines.registry import EngineBackend
from tests.helpers import ScriptedEngine, call

#: every push a control client received: (url, checkpoint directory, version)
PUSHES: list[tuple[str, str, int]] = []


def script(turn: int, prompt: str) -> str:  # noqa: ARG001 - the same two turns for every episode
    if turn == 0:
        return "I will look at two windows.\n</think>\n" + "\n".join(call(s, s + 10) for s in (0, 10))
    return "Both windows show it.\n</think>\n<answer>B</answer>"


class StubControl:
    """What :meth:`EngineHandle.push_weights` calls on one server for a ``disk`` update."""

    def __init__(self, handle: EngineHandle, url: str):
        self.url, self.engine = url, handle.engine

    async def update_weights(self, path: str, version: int) -> None:
        PUSHES.append((self.url, path, version))
        await self.engine.update_weights(path, version)

    async def health(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def build(spec: EngineSpec) -> EngineHandle:
    from paravt.models.loading import load_processor

    processor = spec.processor or load_processor(spec.model)
    pad, _ = token_ids(spec)
    engine = ScriptedEngine(processor.tokenizer, script)
    engine.weight_version = spec.weight_version
    return EngineHandle("stub", engine, "stub://0", image_token_id=pad)


BACKEND = EngineBackend("stub", build, transports=("disk",), control=StubControl)

#: a chat-only engine: named as a rollout engine, the RL recipe refuses it
CHAT = EngineBackend("chat_only", build, transports=(), rollout=False)
