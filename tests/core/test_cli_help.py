"""Every stage CLI: --help exits 0, lists every setting with a description and the value the
run would really use; a bad key or value is one line naming it (nearest valid key), exit 2."""

import dataclasses
import subprocess
import sys

import pytest

from paravt.core.config import _field_comments, all_keys

STAGES = [("paravt.sft.train", "paravt.sft.config:SFTConfig"), ("paravt.rl.train", "paravt.rl.config:RLConfig"),
          ("paravt.eval.driver", "paravt.eval.driver:EvalConfig")]


def _schema(path):
    import importlib
    mod, cls = path.split(":")
    return getattr(importlib.import_module(mod), cls)


def _leaf_classes(schema):
    out, todo = [], [schema]
    while todo:
        c = todo.pop()
        out.append(c)
        for f in dataclasses.fields(c):
            d = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if dataclasses.is_dataclass(d):
                todo.append(type(d))
    return out


@pytest.mark.parametrize("module,schema", STAGES)
def test_help_lists_every_setting_with_a_description(module, schema):
    r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for key in all_keys(_schema(schema)):
        line = next((ln for ln in r.stdout.splitlines() if ln.strip().startswith(key + " = ")), None)
        assert line is not None and "    # " in line, key
    for cls in _leaf_classes(_schema(schema)):  # every field documented (groups included)
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in _field_comments(cls)
                   and not dataclasses.is_dataclass(f.default_factory() if f.default_factory is not dataclasses.MISSING
                                                    else f.default)]
        assert not missing, (cls.__name__, missing)


def test_help_shows_the_real_defaults_and_the_recipes_values():
    r = subprocess.run([sys.executable, "-m", "paravt.eval.driver", "--help"], capture_output=True, text=True)
    assert "crop.mode = 'frames'" in r.stdout  # the instance default (the class default is subagent)
    r = subprocess.run([sys.executable, "-m", "paravt.rl.train", "configs/rl/paragrpo_8b.yaml", "--help"],
                       capture_output=True, text=True)
    assert "grpo.kl_mode = 'reward_k1'" in r.stdout and "max_steps = 54" in r.stdout
    assert "rollout.server.vlm_cache_size_mb = 0" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["paravt.rl.train", "configs/rl/tiny.yaml", "max_step=10"], "did you mean 'max_steps'"),
    (["paravt.sft.train", "configs/sft/tiny.yaml", "optim.lrr=1"], "did you mean 'optim.lr'"),
    (["paravt.rl.train", "configs/rl/tiny.yaml", "grpo.kl_mode=k2"], "grpo.kl_mode must be"),
    (["paravt.sft.train", "configs/sft/nope.yaml"], "nope.yaml not found"),
    (["paravt.eval.driver", "model=m", "nframes"], "key=value"),
])
def test_bad_input_is_one_line(args, needle):
    r = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("script", ["run_sft.sh", "run_rl.sh", "run_eval.sh", "reproduce_paper.sh", "quickstart.sh", "reproduce_tiny.sh", "fragility_tiny.sh", "../experiments/ablate_gtr.sh",
                                    "../experiments/rl_effects_pilot.sh", "../experiments/tool_weight_ablation.sh"])
def test_shell_scripts_help(script):
    r = subprocess.run(["bash", f"scripts/{script}", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "usage" in r.stdout.lower() and "Traceback" not in r.stderr, r.stderr[-500:]


def test_eval_help_lists_every_split():
    from paravt.core.config import config_help
    from paravt.eval.config import EvalConfig
    from paravt.eval.splits import SPLITS
    text = config_help(EvalConfig, "x")
    line = next(ln for ln in text.splitlines() if ln.lstrip().startswith("splits ="))
    assert all(name in line for name in SPLITS), line
    # the table at the end: each split's name, Hub id and the files it reads
    table = text.split("splits (name, or its Hub id")[1]
    for s in SPLITS.values():
        row = next(ln for ln in table.splitlines() if ln.split() and ln.split()[0] == s.name)
        assert all(lay.annotation in row for lay in s.layouts) and (s.hub is None or s.hub.repo_id in row), row


@pytest.mark.parametrize("argv", [["--help"], ["configs/rl/tiny.yaml", "max_step=10"], ["configs/rl/tiny.yaml", "trainer.dtype=fp64"],
                                  ["configs/sft/tiny.yaml", "video.decoder=ffmpeg"]])
def test_help_and_bad_input_answer_before_torch_is_imported(argv):
    """The trainers' command lines read and check the config first: help and a typo answer in about a
    second, not after torch, transformers and the model code have loaded."""
    module = "paravt.sft.train" if "sft" in " ".join(argv) else "paravt.rl.train"
    code = ("import sys\n"
            f"from {module} import main\n"
            "try:\n"
            f"    main({argv!r})\n"
            "except SystemExit as e:\n"
            "    code = e.code\n"
            "print('CODE', code, 'TORCH', 'torch' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip().splitlines()[-1] == f"CODE {0 if argv == ['--help'] else 2} TORCH False", r.stdout[-500:] + r.stderr[-1500:]


def test_the_dtype_names_a_config_accepts_are_the_loaders():
    from paravt.core.config import DTYPE_NAMES
    from paravt.models.loading import DTYPES
    assert set(DTYPE_NAMES) == set(DTYPES)
