"""Cold-start SFT's command line: ``bash scripts/run_sft.sh [RECIPE.yaml] [key=value ...]`` runs
``python -m paravt.sft.train`` on every rank (torchrun) or as one process.

``--help``, the recipe and every override are read and checked here before torch or the model is
imported, so help and bad input answer in about a second; the run itself is
:class:`paravt.sft.trainer.SFTTrainer`.
"""

from __future__ import annotations

import sys

from paravt.models.stage_main import run_trainer
from paravt.sft.config import SFTConfig


def main(argv: list[str] | None = None) -> int:
    return run_trainer("paravt.sft.trainer:SFTTrainer", SFTConfig, argv, "python -m paravt.sft.train", "SFT")


if __name__ == "__main__":
    sys.exit(main())
