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


#: Config keys holding a free mapping (plugin name -> its own options): overrides replace or add entries.
FREE_MAPPINGS = frozenset({"tools"})


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
        plugin = any(p in FREE_MAPPINGS for p in key.split("."))
        if isinstance(parsed, bool) and value.lower() not in ("true", "false") and not plugin:
            # YAML 1.1 reads off/on/yes/no as booleans: gtr.mode=off is the string (a typed bool field still
            # takes "off" as false); a plugin's untyped options keep YAML's reading
            parsed = value
        try:
            # "data.0.path=..." indexes lists; a mapping of plugins (``tools``) is replaced whole or extended
            # by key (``tools.zoom_frame={}``): its entries are the plugins' own options, not schema fields
            if key.split(".")[-1] in FREE_MAPPINGS or any(p in FREE_MAPPINGS for p in key.split(".")[:-1]):
                OmegaConf.update(cfg, key, parsed, merge=False, force_add=True)
            else:
                OmegaConf.update(cfg, key, parsed, merge=True)
        except Exception as exc:  # noqa: BLE001 - name the override in the error
            first = " ".join(str(exc).splitlines()[0].split()) if str(exc) else type(exc).__name__
            hint = _nearest(key, schema) if "not in" in first or "Key" in type(exc).__name__ else ""
            raise ValueError(f"override {o!r}: {first}{hint}") from exc
    return OmegaConf.to_object(cfg)


def choice(*options: Any, default: str | None = None) -> Any:
    """A string setting that takes one of ``options``: a ``Literal[...]`` alias (the type callers annotate
    with) or the strings themselves. The default is ``default`` or the first option. The options live on
    the field (``--help`` lists them) and :func:`check_choices` checks them::

        Engine = Literal["hf", "vllm"]
        engine: str = choice(Engine)  # the field stays ``str`` for OmegaConf, which has no Literal
    """
    from typing import get_args  # noqa: PLC0415

    opts = tuple(a for o in options for a in (get_args(o) or (o,)))
    if default is not None and default not in opts:
        raise ValueError(f"choice default {default!r} is not one of {opts}")
    return dataclasses.field(default=default if default is not None else opts[0], metadata={"choices": opts})


def check_choice(name: str, value: Any, options: Any) -> None:
    """The one check of a choice, with the one message form: ``<name> must be one of a | b, got 'x'``."""
    from typing import get_args  # noqa: PLC0415

    opts = tuple(get_args(options) or options)
    if value not in opts:
        raise ValueError(f"{name} must be one of {' | '.join(_shown(o) for o in opts)}, got {value!r}")


def _shown(option: Any) -> str:
    return "null" if option is None else str(option)  # as a recipe writes it


def check_choices(cfg: Any, prefix: str = "") -> None:
    """Every :func:`choice` field of the dataclass ``cfg`` holds one of its options (named ``prefix.field``)."""
    for f in dataclasses.fields(cfg):
        if "choices" in f.metadata:
            check_choice(f"{prefix}.{f.name}" if prefix else f.name, getattr(cfg, f.name), f.metadata["choices"])


def _field_comments(cls: type) -> dict[str, str]:
    """The trailing ``# comment`` of each field in the dataclass source: its help text (the
    comment beside a setting is its documentation, so --help shows the same words)."""
    import inspect  # noqa: PLC0415
    import re  # noqa: PLC0415

    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in src.splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("# ").strip())
            continue
        m = re.match(r"\s+(\w+)\s*:\s*[^=#]+(?:=[^#]*)?(?:#\s*(.*))?$", line)
        if m and not stripped.startswith(("def ", "@", "return")):
            text = " ".join(pending + ([m.group(2).strip()] if m.group(2) else []))
            if text:
                out.setdefault(m.group(1), text)
        pending = []
    return out


def _nested_class(f: dataclasses.Field) -> type | None:
    """The dataclass a field holds (from its default, else its annotation), or None for a leaf."""
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if dataclasses.is_dataclass(default):
        return type(default)
    return f.type if isinstance(f.type, type) and dataclasses.is_dataclass(f.type) else None


def all_keys(schema: type) -> list[str]:
    """Every dotted key of a config schema (nested dataclasses walked)."""
    keys: list[str] = []

    def walk(cls, prefix=""):
        for f in dataclasses.fields(cls):
            sub = _nested_class(f)
            if sub is not None:
                walk(sub, prefix + f.name + ".")
            else:
                keys.append(prefix + f.name)
    walk(schema)
    return keys


def config_help(schema: type, prog: str, recipe: str | Path | None = None) -> str:
    """--help: every setting (dotted) with the value it would take (the recipe's when one is
    given, else the schema's own defaults, factories included) and its description."""
    values = OmegaConf.structured(schema)
    if recipe is not None:
        from hydra import compose, initialize_config_dir  # noqa: PLC0415
        from hydra.core.global_hydra import GlobalHydra  # noqa: PLC0415
        recipe = Path(recipe)
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(recipe.parent.resolve()), version_base=None):
                values = OmegaConf.merge(values, compose(config_name=recipe.stem))
        finally:
            GlobalHydra.instance().clear()
    src = f"the values of {recipe}" if recipe is not None else "defaults"
    lines = [f"usage: {prog} [RECIPE.yaml] [key=value ...]", "", f"settings ({src}; ??? = required):"]

    def walk(cls, node, prefix=""):
        helps = _field_comments(cls)
        for f in dataclasses.fields(cls):
            val = node.get(f.name) if node is not None else None
            child_cls = _nested_class(f)
            if child_cls is not None and OmegaConf.is_dict(val):
                walk(child_cls, val, prefix + f.name + ".")
                continue
            shown = OmegaConf.to_container(val) if OmegaConf.is_config(val) else val
            if OmegaConf.is_missing(node, f.name):
                shown = "???"
            text = helps.get(f.name, "")
            opts = [_shown(o) for o in f.metadata.get("choices", ())]
            if opts and not all(o in text for o in opts):  # the options, unless the comment already lists them
                text = " | ".join(opts) + (f": {text}" if text else "")
            lines.append(f"  {prefix}{f.name} = {shown!r}" + (f"    # {text}" if text else ""))
    walk(schema, values)
    epilogue = getattr(schema, "help_epilogue", None)  # e.g. eval: the table of valid splits
    if callable(epilogue):
        lines += ["", epilogue()]
    return "\n".join(lines)


def _nearest(key: str, schema: type) -> str:
    import difflib  # noqa: PLC0415

    keys = all_keys(schema)
    near = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if not near:
        leaf = key.rsplit(".", 1)[-1]
        near = [k for k in keys if k.rsplit(".", 1)[-1] == leaf][:1]
    return f" (did you mean {near[0]!r}?)" if near else ""


def parse_cli(schema: type[T], argv: list[str] | None, prog: str) -> T:
    """``[RECIPE.yaml] [key=value ...]`` → the checked config. --help lists every setting; a bad
    recipe, key or value is one line naming it (and the nearest valid key), exit code 2."""
    from omegaconf.errors import OmegaConfBaseException  # noqa: PLC0415

    argv = list(sys.argv[1:] if argv is None else argv)
    recipe = None
    if argv and argv[0].endswith((".yaml", ".yml")):
        recipe, argv = argv[0], argv[1:]
    if any(a in ("-h", "--help") for a in argv):
        try:
            text = config_help(schema, prog, recipe)
        except Exception as exc:  # noqa: BLE001 - a broken recipe: one line, not a traceback
            print(f"{prog}: {recipe}: {' '.join(str(exc).split())}", file=sys.stderr)
            raise SystemExit(2) from None
        try:
            print(text)
        except BrokenPipeError:  # --help | head
            pass
        raise SystemExit(0)
    bad = [a for a in argv if "=" not in a]
    if bad:
        print(f"{prog}: arguments must be key=value overrides, got {bad} (--help lists the settings)", file=sys.stderr)
        raise SystemExit(2)
    import yaml  # noqa: PLC0415
    from hydra.errors import HydraException  # noqa: PLC0415

    try:
        return load_config(schema, recipe, argv)
    except yaml.YAMLError as exc:  # the recipe is not YAML: the parser's own position, on one line
        print(f"{prog}: {recipe}: not valid YAML: {' '.join(str(exc).split())}", file=sys.stderr)
        raise SystemExit(2) from None
    except (ValueError, KeyError, TypeError, FileNotFoundError, OmegaConfBaseException, HydraException) as exc:
        msg = ' '.join(str(exc).splitlines()[0].split()) if str(exc) else type(exc).__name__
        key = getattr(exc, "full_key", None)
        if key and key not in msg:
            msg = f"{key}: {msg}"
        print(f"{prog}: {(recipe + ': ') if recipe and key else ''}{msg}", file=sys.stderr)
        raise SystemExit(2) from None


# The dtype names a config accepts (paravt.models.loading.DTYPES maps each to its torch dtype): checked here,
# without importing torch, so a config's errors and --help come before any heavy import.
DTYPE_NAMES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")


def check_dtype(name: str) -> None:
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r} (expected one of {sorted(DTYPE_NAMES)})")


def require(cfg: Any, **messages: str) -> None:
    """Raise ``ValueError(message)`` for the first field of ``cfg`` left unset ("", "???", None, [])."""
    for name, message in messages.items():
        if getattr(cfg, name) in ("", "???", None) or getattr(cfg, name) == []:
            raise ValueError(message)


def looks_like_hub_id(name: str) -> bool:
    """``org/name`` (one slash, no leading ``/ . ~``): a Hugging Face repository id, not a path."""
    return name.count("/") == 1 and not name.startswith(("/", ".", "~")) and all(name.split("/"))


def check_run_paths(model_path: str | None = None, output_dir: str | None = None, resume: str | None = None,
                    model_key: str = "model_path") -> None:
    """The paths a training or eval run is handed, checked before any model loads (ValueError, one line):
    the model is a directory (or a Hub id), the output directory is not a file, and an explicit
    ``resume`` checkpoint exists and is complete."""
    if model_path is not None and model_path not in ("", "???"):
        p = Path(model_path).expanduser()
        if not p.exists() and not looks_like_hub_id(model_path):
            raise ValueError(f"{model_key}: no such directory {model_path} (a save_pretrained directory or a Hub id "
                             "org/name)")
        if p.exists() and not p.is_dir():
            raise ValueError(f"{model_key}: {model_path} is a file, not a save_pretrained directory")
    if output_dir:
        o = Path(output_dir).expanduser()
        if o.exists() and not o.is_dir():
            raise ValueError(f"output_dir: {output_dir} exists and is a file, not a directory")
    if resume not in (None, "", "auto", "never"):
        r = Path(resume).expanduser()
        if not r.is_dir():
            raise ValueError(f"resume: no such checkpoint directory {resume} (auto | never | a checkpoints/step_N dir)")
        if not (r / "COMPLETE").exists():
            raise ValueError(f"resume: {resume} is not a complete checkpoint (no COMPLETE marker: the save was cut)")


def require_cuda_if_needed(cfg, prog: str, recipe: str, stage: str) -> None:
    """A recipe that needs CUDA, started where torch has none (no GPU, or a CPU build of torch: the
    stage's GPU environment was never built and the launcher fell back to ``.venv-cpu``), is one
    line and exit 2 naming what is missing, never an 8B run on the CPU."""
    import sys  # noqa: PLC0415

    import torch  # noqa: PLC0415

    reason = cfg.needs_cuda() if hasattr(cfg, "needs_cuda") else None
    if reason is None or torch.cuda.is_available():
        return
    from pathlib import Path  # noqa: PLC0415

    root = Path(__file__).resolve().parents[2]
    env = root / f".venv-{stage}"
    why = ("this machine has no GPU" if "+cpu" not in torch.__version__ and env.exists()
           else f"{sys.executable} has torch {torch.__version__} without CUDA" +
           ("" if env.exists() else f" (.venv-{stage} does not exist)"))
    print(f"{prog}: {recipe} needs CUDA ({reason}) but {why}: on a GPU node build the environment with "
          f"`bash scripts/setup_env.sh {stage}`; on a CPU machine use configs/{'sft' if stage == 'sft' else 'rl'}/tiny.yaml",
          file=sys.stderr)
    raise SystemExit(2)
