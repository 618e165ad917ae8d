"""Test doubles. ScriptedEngine implements the engine interface with scripted texts, tokenised
by the real tokenizer, so episode bookkeeping (ids, masks, logprobs) can be checked exactly."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from paravt.engines.base import GenerationOutput, InferenceEngine, SamplingParams


class ScriptedEngine(InferenceEngine):
    def __init__(self, tokenizer, main: Callable[[int, str], str], sub: Callable[[str], str] | None = None,
                 delay_s: float = 0.0, sub_delay_s: float | None = None, fail_main_turn: int | None = None):
        self.tok = tokenizer
        self.main, self.sub = main, sub or (lambda prompt: "A red circle is visible from 10.0 to 12.0 seconds.")
        self.delay_s, self.sub_delay_s = delay_s, sub_delay_s
        self.fail_main_turn = fail_main_turn
        self.in_flight = self.max_in_flight = 0
        self.main_turn = 0
        self.calls: list[dict] = []
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, input_ids, images, params: SamplingParams) -> GenerationOutput:
        prompt = self.tok.decode(input_ids)
        is_sub = "Describe concisely" in prompt.rsplit("<|im_start|>", 1)[-1] or "Describe concisely" in prompt[-600:]
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.sub_delay_s if is_sub and self.sub_delay_s is not None else self.delay_s)
        finally:
            self.in_flight -= 1
        if is_sub:
            text = self.sub(prompt)
        else:
            if self.fail_main_turn == self.main_turn:
                return GenerationOutput([], [], "error", error="engine exploded")
            text = self.main(self.main_turn, prompt)
            self.main_turn += 1
        ids = self.tok.encode(text, add_special_tokens=False)[: params.max_new_tokens - 1] + [self.eos]
        lps = [-0.01 * (i + 1) for i in range(len(ids))]
        self.calls.append({"sub": is_sub, "n_prompt": len(input_ids), "n_images": len(images or []), "ids": ids,
                           "max_new_tokens": params.max_new_tokens})
        return GenerationOutput(ids, lps, "stop", self.weight_version)

    async def update_weights(self, source, version=None):
        self.weight_version = version if version is not None else self.weight_version + 1


def call(s, e, name="crop_video", path="v.mp4"):
    import json
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": {"video_path": path, "start_time": s, "end_time": e}}) + "\n</tool_call>"


def torchrun_script(script: str, *args: str, nproc: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    """``script`` (a path under the repository) under torchrun with ``nproc`` gloo ranks, one OpenMP thread each."""
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                           str(root / script), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
