"""What each seed of a reproduction was run with, and where seeds differ.

An interval across seeds means something only when the seeds differ in their seed alone. A run folder
(a quickstart ``OUT_DIR`` or an ``experiments/rl_effects_pilot.sh`` one) records its settings in three
places, read here:

* each training stage's checkpoint (``<stage>/final/../trainer_state.json``, ``config``): the SFT phases,
  the RL arms, the perception stage and the fragility runs under ``fragility/``;
* each eval cell's ``eval/<row>/<channel>/<split>.run_config.json`` (``identity`` and ``limit``);
* the tiny base's ``tiny_model/paravt_tiny.json`` (its shape and copy warm-up).

Values that differ between seeds by design are left out: the seed itself (``seed``, ``sample_seed``),
the checkpoint hash (``weights``), the run's own paths (every seed folder's path is replaced by
``<run>``, so ``seed_1/sft/final`` equals ``seed_0/sft/final``) and logging. A stage run in some seeds
only is named apart from the settings that differ.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: flattened keys (their last part) that differ between seeds by design
PER_SEED = {"seed", "sample_seed", "weights", "resume", "date", "git_commit"}
#: flattened key prefixes that are bookkeeping, not settings
BOOKKEEPING = ("logging.",)


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        for i, v in enumerate(value):
            _flatten(v, f"{prefix}.{i}", out)
    else:
        out[prefix] = value


def _kept(key: str) -> bool:
    return key.rsplit(".", 1)[-1] not in PER_SEED and not key.startswith(BOOKKEEPING)


def _stage_files(run: Path) -> dict[str, Path]:
    """Stage name -> the file holding its settings, for every stage this run folder has."""
    found: dict[str, Path] = {}
    for final in sorted([*run.glob("*/final"), *run.glob("fragility/*/final")]):
        state = final.resolve().parent / "trainer_state.json"
        if state.is_file():
            found[final.parent.relative_to(run).as_posix()] = state
    for cfg in sorted(run.glob("eval/*/*/*.run_config.json")):
        found[f"eval/{cfg.relative_to(run / 'eval').as_posix().removesuffix('.run_config.json')}"] = cfg
    tiny = run / "tiny_model" / "paravt_tiny.json"
    if tiny.is_file():
        found["tiny_model"] = tiny
    return found


def _settings(stage: str, path: Path) -> dict[str, Any]:
    raw = json.loads(path.read_text())
    if stage == "tiny_model":
        warm = {k: v for k, v in (raw.get("copy_warmup") or {}).items() if k.startswith("cfg_") or k == "steps"}
        raw = {"shape": raw.get("shape"), "copy_warmup": warm}
    elif stage.startswith("eval/"):
        raw = {"identity": raw.get("identity"), "limit": raw.get("limit")}
    else:
        raw = raw.get("config", {})
    flat: dict[str, Any] = {}
    _flatten(raw, "", flat)
    return {k: v for k, v in flat.items() if _kept(k)}


def _normalise(value: Any, prefixes: list[str]) -> Any:
    if isinstance(value, str):
        for p in prefixes:
            value = value.replace(p, "<run>")
    elif isinstance(value, list):
        value = [_normalise(v, prefixes) for v in value]
    return value


def run_settings(run: Path, prefixes: list[str]) -> dict[str, dict[str, Any]]:
    """Stage -> {flattened key: value} for one run folder, its paths written relative to ``<run>``."""
    return {stage: {k: _normalise(v, prefixes) for k, v in _settings(stage, path).items()}
            for stage, path in _stage_files(run).items()}


def _prefixes(runs: list[Path]) -> list[str]:
    seen = {str(p) for r in runs for p in (r.absolute(), r.resolve())}
    return sorted(seen, key=len, reverse=True)  # the longest first: seed_10 before seed_1


def differences(runs: list[Path]) -> tuple[list[str], list[str]]:
    """(settings that differ between the runs, stages some runs lack), one line each, naming the runs."""
    prefixes = _prefixes(runs)
    per_run = [run_settings(r, prefixes) for r in runs]
    names = [r.name for r in runs]
    stages = sorted({s for settings in per_run for s in settings})
    differ, partial = [], []
    for stage in stages:
        have = [i for i, settings in enumerate(per_run) if stage in settings]
        if len(have) < len(runs):
            partial.append(f"{stage}: in {', '.join(names[i] for i in have)} only")
        if len(have) < 2:
            continue
        keys = sorted({k for i in have for k in per_run[i][stage]})
        for key in keys:
            values = [per_run[i][stage].get(key, "(not set)") for i in have]
            if any(v != values[0] for v in values[1:]):
                shown = ", ".join(f"{names[i]} {json.dumps(v)}" for i, v in zip(have, values))
                differ.append(f"{stage} {key}: {shown}")
    return differ, partial


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m paravt.analysis.run_settings",
                                 description="Where run folders (seeds of one reproduction) differ in settings; exit 1 if"
                                             " they do.")
    ap.add_argument("runs", nargs="+", type=Path, help="run folders: quickstart OUT_DIRs or rl_effects_pilot.sh ones")
    args = ap.parse_args(argv)
    missing = [str(r) for r in args.runs if not r.is_dir()]
    if missing:
        ap.error(f"not a folder: {', '.join(missing)}")
    differ, partial = differences(args.runs)
    for line in partial:
        print(f"stage in some runs only: {line}")
    for line in differ:
        print(f"differs: {line}")
    if not differ:
        print(f"the same settings in all {len(args.runs)} runs but the seed")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
