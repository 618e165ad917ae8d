"""Optional LLM-judge fallback for multiple-choice replies the strict scorer reads no letter from.

Off by default (``mcq_judge.base_url`` unset). When on, a reply with no extractable option letter
is shown, with the question and its options, to an OpenAI-compatible chat endpoint that names the
option the reply chooses (or NONE). The verdict is stored beside the strict result
(``judge_pred``, ``judge_correct``, or ``judge_error``) and summarised as ``accuracy_with_judge``
next to ``accuracy``, which stays the strict score: a published number is always the strict one
unless a table says otherwise (LongVT's Video-MME 64.9 was judge-assisted; strict it was 32.8).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

PROMPT = (
    "A model answered a multiple-choice question about a video in its own words. Decide which option "
    "its reply chooses.\n\nQuestion and options:\n{question}\n\nThe model's reply:\n{reply}\n\n"
    "Answer with the single letter of the chosen option ({letters}), or NONE if the reply chooses no "
    "option or more than one."
)


@dataclass
class MCQJudgeConfig:
    base_url: str | None = None  # OpenAI-compatible endpoint (…/v1); null: no judge (strict scoring only)
    model: str = ""  # the judge model's name on that endpoint
    api_key_env: str = "PARAVT_JUDGE_API_KEY"  # the variable holding its key (set in .secrets.env)
    max_new_tokens: int = 8  # the judge's reply budget
    timeout_s: float = 60.0  # per request
    max_reply_chars: int = 4000  # the end of the model's reply shown to the judge

    def __post_init__(self):
        if self.base_url and not self.model:
            raise ValueError("mcq_judge.model is required when mcq_judge.base_url is set")
        if self.max_new_tokens < 1 or self.max_reply_chars < 1:
            raise ValueError("mcq_judge.max_new_tokens and mcq_judge.max_reply_chars must be >= 1")


_ALONE = re.compile(r"^\W*(?:(?:the\s+)?(?:option|answer|choice)\s*(?:is\s*)?:?\s*)?\(?([A-Ja-j])\)?[\s.)]*$", re.IGNORECASE)
_MENTION = re.compile(r"(?<![\w'])\(?([A-J])\)?(?![\w'])")


def parse_judge_letter(text: str, letters: str) -> str | None:
    """The judge's reply → an option letter; None for NONE or when it names more than one option (as
    its prompt asks); ValueError when it names none of ``letters``.

    A reply that is just a letter ("B", "(c)", "Option D", "Answer: A") is read in either case. In
    prose only capital letters standing alone count; "A" opening a sentence and "I" before a lowercase
    word ("A reply that picks C", "I think B") are words, not options."""
    t = (text or "").strip()
    t = re.sub(r"(?s)<think>.*?</think>", "", t).strip()  # a reasoning judge's thoughts are not its verdict
    if re.match(r"^\W*none\b", t, re.IGNORECASE):
        return None
    m = _ALONE.match(t)
    if m and m.group(1).upper() in letters:
        return m.group(1).upper()
    named = []
    for mm in _MENTION.finditer(t):
        letter, after = mm.group(1), t[mm.end():mm.end() + 2]
        before = t[:mm.start()].lower().rstrip(" :")
        marked = mm.group(0) != letter or before.endswith(("option", "answer", "choice", "is"))
        sentence_start = not before or before.endswith((".", "!", "?", "\n"))
        if not marked and re.match(r" [a-z]", after) and (letter == "I" or (letter == "A" and sentence_start)):
            continue  # "A reply ..." opening a sentence, "I think ...": words, not options
        if letter in letters and letter not in named:
            named.append(letter)
    if len(named) == 1:
        return named[0]
    if len(named) > 1:
        return None  # more than one option named: the judge's NONE
    raise ValueError(f"judge reply names no option: {t[:80]!r}")


class MCQJudge:
    def __init__(self, cfg: MCQJudgeConfig):
        from paravt.engines.openai import OpenAIEngine  # noqa: PLC0415

        assert cfg.base_url
        self.cfg = cfg
        self.client = OpenAIEngine(cfg.base_url, model=cfg.model, api_key=os.environ.get(cfg.api_key_env) or None,
                                   request_timeout_s=cfg.timeout_s, max_concurrency=8)

    def identity(self) -> dict[str, Any]:
        return {"base_url": self.cfg.base_url, "model": self.cfg.model}

    async def __call__(self, question: str, reply: str, n_options: int) -> str | None:
        """The letter the judge reads in ``reply`` (None: it chooses none). Raises on a failed request
        or an unusable verdict (recorded as ``judge_error``; the strict score is untouched)."""
        from paravt.engines.base import SamplingParams  # noqa: PLC0415

        letters = "ABCDEFGHIJ"[:max(n_options, 1)]
        prompt = PROMPT.format(question=question.strip(), reply=reply.strip()[-self.cfg.max_reply_chars:],
                               letters=", ".join(letters))
        out = await self.client.chat([{"role": "user", "content": [{"type": "text", "text": prompt}]}],
                                     SamplingParams(temperature=0.0, max_new_tokens=self.cfg.max_new_tokens))
        if out.error:
            raise RuntimeError(f"judge request failed: {out.error[:200]}")
        return parse_judge_letter(out.text or "", letters)

    async def close(self) -> None:
        await self.client.close()
