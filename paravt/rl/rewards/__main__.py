"""Score completions offline under a recipe's ``paravt:`` block.

    python -m paravt.rl.rewards --recipe configs/rl/paragrpo_8b.yaml --jsonl IN.jsonl [--no-answer-suffix]
        [--anchor-weight 0] [--mode exact] [--format-weight 1.0] [--tool-weight 1.0] [--rules release|paravt]

Each input line: ``{"completion": ..., "answer": ..., "question_type": "mcq"|"tvg"|"oe"}``.
Each output line: ``{"total", "acc", "format", "tool"}`` (plus ``"error"`` for a bad line,
which is reported with its line number; the others are still scored).

Tool calls are read by the parser of the recipe's ``hierarchical_agent.tools`` (without a recipe:
the default tools), as the recipe's episodes read them.
"""

from __future__ import annotations

import argparse
import json
import sys

from paravt.agent.tools import recipe_call_parser
from paravt.core.toolcall import ToolCallParser
from paravt.rl.rewards.terms import RewardKnobs, compute_reward


def _recipe(path: str):
    """The RL recipe at ``path``, composed like the trainer does (Hydra defaults included)."""
    from paravt.core.config import load_config  # noqa: PLC0415
    from paravt.rl.config import RLConfig  # noqa: PLC0415

    return load_config(RLConfig, path)


def knobs_from_recipe(path: str | None) -> RewardKnobs:
    """The recipe's ``paravt:`` block (defaults without a recipe)."""
    return _recipe(path).paravt.knobs() if path else RewardKnobs()


def parser_from_recipe(path: str | None) -> ToolCallParser:
    """The call parser of the recipe's ``hierarchical_agent.tools`` (the default tools without a recipe)."""
    from paravt.rl.config import HierarchicalAgentConfig  # noqa: PLC0415

    return recipe_call_parser(_recipe(path).hierarchical_agent.tools if path else HierarchicalAgentConfig().tools)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m paravt.rl.rewards", description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", help="RL recipe YAML whose paravt: block sets the knobs")
    ap.add_argument("--jsonl", required=True, help="input lines {completion, answer, question_type} ('-' = stdin)")
    ap.add_argument("--answer-suffix", dest="answer_suffix", action="store_true", default=None)
    ap.add_argument("--no-answer-suffix", dest="answer_suffix", action="store_false")
    ap.add_argument("--anchor-weight", type=float)
    ap.add_argument("--mode", choices=["f1", "exact", "llm"])
    ap.add_argument("--format-weight", type=float)
    ap.add_argument("--tool-weight", type=float, help="weight of R_tool (default: the recipe's)")
    ap.add_argument("--rules", choices=["release", "paravt"], help="reward rule set (default: the recipe's)")
    a = ap.parse_args(argv)
    k, parser = knobs_from_recipe(a.recipe), parser_from_recipe(a.recipe)
    over = {"answer_suffix": a.answer_suffix, "anchor_weight": a.anchor_weight, "mode": a.mode,
            "format_weight": a.format_weight, "rules": a.rules, "tool_weight": a.tool_weight}
    k = RewardKnobs(**{**k.__dict__, **{n: v for n, v in over.items() if v is not None}})
    judge = None
    if k.mode == "llm":
        print("note: no judge configured for the CLI; llm mode falls back to F1", file=sys.stderr)
    src = sys.stdin if a.jsonl == "-" else open(a.jsonl)
    bad = 0
    with src:
        for i, line in enumerate(src, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                r = compute_reward(rec["completion"], rec["answer"], rec.get("question_type", "oe"), k, judge,
                                   parser=parser)
                out = {"total": r.total, "acc": r.acc, "format": r.format, "tool": r.tool}
            except (json.JSONDecodeError, KeyError, ValueError, TypeError) as exc:
                bad += 1
                out = {"total": None, "acc": None, "format": None, "tool": None, "error": f"line {i}: {exc}"}
            print(json.dumps(out))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
