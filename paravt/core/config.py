"""Typed configs: one dataclass per stage, composed with Hydra, overridable from the CLI.

    cfg = load_config(SFTConfig, "configs/sft/tiny.yaml", ["optim.lr=1e-4", "max_steps=10"])

The recipe YAML is composed by Hydra (its ``defaults:`` list may pull in other recipes), merged
onto the dataclass schema (unknown keys and wrong types are errors), then ``key=value``
overrides are applied and the result is converted to the dataclass, whose ``__post_init__``
checks it.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import OmegaConf

T = TypeVar("T")


def load_config(schema: type[T], recipe: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """schema defaults ← recipe (its Hydra ``defaults:`` list composed, so a recipe can extend
    another one) ← ``key=value`` overrides; then the dataclass checks itself."""
    from hydra import compose, initialize_config_dir  # noqa: PLC0415
    from hydra.core.global_hydra import GlobalHydra  # noqa: PLC0415

    cfg = OmegaConf.structured(schema)
    if recipe is not None:
        recipe = Path(recipe)
        if not recipe.is_file():
            raise FileNotFoundError(f"recipe {recipe} not found")
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(recipe.parent.resolve()), version_base=None):
                composed = compose(config_name=recipe.stem)
        finally:
            GlobalHydra.instance().clear()
        cfg = OmegaConf.merge(cfg, composed)
    for o in overrides or []:
        key, _, value = o.lstrip("+").partition("=")
        if not key:
            raise ValueError(f"bad override {o!r}: expected key=value")
        try:
            parsed = yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError:
            parsed = value
        try:
            OmegaConf.update(cfg, key, parsed, merge=True)  # "data.0.path=..." indexes lists
        except Exception as exc:  # noqa: BLE001 - name the override in the error
            raise ValueError(f"override {o!r}: {exc}") from exc
    return OmegaConf.to_object(cfg)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg)


def config_help(schema: type, prog: str) -> str:
    """A --help text listing every field (dotted) with its default."""
    lines = [f"usage: {prog} [RECIPE.yaml] [key=value ...]", "", "settings (defaults shown):"]

    def walk(cls, prefix=""):
        for f in dataclasses.fields(cls):
            default = (f.default if f.default is not dataclasses.MISSING else
                       f.default_factory() if f.default_factory is not dataclasses.MISSING else "???")
            if dataclasses.is_dataclass(default):
                walk(type(default), prefix + f.name + ".")
            else:
                lines.append(f"  {prefix}{f.name} = {default!r}")
    walk(schema)
    return "\n".join(lines)


def parse_cli(schema: type[T], argv: list[str] | None, prog: str) -> T:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(config_help(schema, prog))
        raise SystemExit(0)
    recipe = None
    if argv and argv[0].endswith((".yaml", ".yml")):
        recipe, argv = argv[0], argv[1:]
    bad = [a for a in argv if "=" not in a]
    if bad:
        raise SystemExit(f"{prog}: arguments must be key=value overrides, got {bad}")
    return load_config(schema, recipe, argv)
