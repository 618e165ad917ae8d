"""LLM judge for ``reward.mode: llm``: any OpenAI-compatible chat endpoint scores an
open-ended answer against the reference with 0, 0.5 or 1. Failures raise; the reward falls
back to token F1 (training never blocks on the judge)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

PROMPT = (
    "You grade answers to questions about a video. Reference answer: {gold}\n"
    "Candidate answer: {pred}\n"
    "Reply with one number: 1 if the candidate means the same as the reference, 0.5 if it is "
    "partly right, 0 if it is wrong."
)


@dataclass
class JudgeConfig:
    base_url: str = ""  # OpenAI-compatible judge endpoint for reward.mode=llm
    model: str = ""  # judge model name
    api_key_env: str = "PARAVT_JUDGE_API_KEY"  # the key itself lives in .secrets.env, never in a recipe
    timeout_s: float = 20.0  # a slower judge falls back to F1


class LLMJudge:
    def __init__(self, cfg: JudgeConfig):
        if not cfg.base_url or not cfg.model:
            raise ValueError("judge.base_url and judge.model are required for reward.mode=llm")
        self.cfg = cfg
        self.key = os.environ.get(cfg.api_key_env, "")

    def __call__(self, pred: str, gold: str) -> float:
        import requests  # noqa: PLC0415

        url = self.cfg.base_url.rstrip("/")
        url = url if url.endswith("/v1") else url + "/v1"
        r = requests.post(url + "/chat/completions", timeout=self.cfg.timeout_s,
                          headers={"Authorization": f"Bearer {self.key}"} if self.key else {},
                          json={"model": self.cfg.model, "temperature": 0, "max_tokens": 8,
                                "messages": [{"role": "user", "content": PROMPT.format(gold=gold, pred=pred)}]})
        r.raise_for_status()
        text = r.json()["choices"][0]["message"]["content"]
        m = re.search(r"\b(0\.5|1(?:\.0)?|0(?:\.0)?)\b", text)
        if not m:
            raise ValueError(f"judge reply has no score: {text!r}")
        return float(m.group(1))
