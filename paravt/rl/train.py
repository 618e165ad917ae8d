"""PARA-GRPO's command line: ``bash scripts/run_rl.sh [RECIPE.yaml] [key=value ...]`` runs
``python -m paravt.rl.train`` on every trainer rank (torchrun).

``--help``, the recipe and every override are read and checked here before torch or the model is
imported, so help and bad input answer in about a second; the run itself is
:class:`paravt.rl.trainer.RLTrainer` (one step read top to bottom in its module docstring).
"""

from __future__ import annotations

import sys

from paravt.models.stage_main import run_trainer
from paravt.rl.config import RLConfig


def main(argv: list[str] | None = None) -> int:
    return run_trainer("paravt.rl.trainer:RLTrainer", RLConfig, argv, "python -m paravt.rl.train", "RL")


if __name__ == "__main__":
    sys.exit(main())
