"""The GTR block of the RL recipe (``gtr.*``): guided thought reinforcement, opt-in (:mod:`paravt.rl.gtr`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from paravt.core.config import check_choices, choice

GTRMode = Literal["off", "observe", "train"]
Corrector = Literal["oracle", "llm"]


@dataclass
class GTRConfig:
    """Guided thought reinforcement (opt-in; see paravt.rl.gtr). Off leaves PARA-GRPO unchanged."""

    mode: str = choice(GTRMode)  # off | observe (judge thoughts + collapse metrics, no extra loss) | train (+ lambda NLL)
    corrector: str = choice(Corrector)  # oracle (the synthetic world's ground truth) | llm (OpenAI-compatible endpoint)
    sft_weight: float = 1.0  # lambda in L = L_PARA-GRPO + lambda * mean NLL(corrected thoughts)
    think_weight: float = 1.0  # per-token weight of thought tokens in the PPO loss (the GTR code's c; 1 = off)
    buffer_size: int = 4096  # corrected thoughts kept (DAgger-style aggregation over the run; oldest dropped)
    sft_ratio: float = 1.0  # SFT samples per RL sample drawn from the buffer each step (1:1 as in GTR)
    max_judged_turns: int = 64  # thoughts judged per step (a seeded sample; bounds the LLM corrector's calls)
    world: str = ""  # oracle: the synthetic world folder (world.json); default: found beside train_data
    base_url: str = ""  # llm corrector: OpenAI-compatible endpoint (http://host:port/v1)
    model: str = ""  # llm corrector: model name (empty: the server's first /v1/models entry)
    api_key_env: str = "PARAVT_CORRECTOR_API_KEY"  # llm corrector: the key's variable (set in .secrets.env)
    timeout_s: float = 60.0  # llm corrector: per-request timeout; failures mean "no correction"
    max_retries: int = 1  # llm corrector: retries after the first attempt
    max_frames: int = 8  # llm corrector: overview frames sent with each judgement

    def __post_init__(self):
        check_choices(self, "gtr")
        if self.sft_weight < 0 or self.think_weight < 0 or self.sft_ratio < 0 or self.buffer_size < 1:
            raise ValueError("gtr.sft_weight, think_weight, sft_ratio must be >= 0 and buffer_size >= 1")
        if self.mode != "off" and self.corrector == "llm" and not self.base_url:
            raise ValueError("gtr.corrector=llm needs gtr.base_url (an OpenAI-compatible endpoint)")
