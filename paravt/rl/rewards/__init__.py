"""PARA-GRPO rewards: pure terms (:mod:`paravt.rl.rewards.terms`), the LLM judge
(:mod:`paravt.rl.rewards.judge`) and a CLI (``python -m paravt.rl.rewards --recipe RECIPE.yaml --jsonl IN.jsonl``)."""
