"""PARA-GRPO rewards: pure terms (``terms``), the LLM judge (``judge``) and a CLI
(``python -m paravt.rl.rewards --recipe RECIPE.yaml --jsonl IN.jsonl``)."""

from paravt.rl.rewards.terms import (RewardBreakdown, RewardKnobs, accuracy, compute_reward, degenerate,
                                     format_reward, tool_reward)

__all__ = ["RewardBreakdown", "RewardKnobs", "accuracy", "compute_reward", "degenerate", "format_reward",
           "tool_reward"]
