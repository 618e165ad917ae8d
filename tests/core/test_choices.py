"""Typed choices: one helper declares them on the field, one checks them, with one message form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from paravt.core.config import check_choice, check_choices, choice, config_help, load_config

Colour = Literal["red", "green"]


@dataclass
class Paint:
    colour: str = choice(Colour)  # what the wall turns
    finish: str | None = choice(None, "matte", "gloss")
    brush: str = choice("flat", "round", default="round")  # flat | round

    def __post_init__(self):
        check_choices(self, "paint")


def test_a_choice_takes_a_literal_or_strings_and_its_first_option_is_the_default():
    assert Paint() == Paint("red", None, "round")
    assert load_config(Paint, None, ["colour=green", "finish=gloss"]) == Paint("green", "gloss", "round")
    with pytest.raises(ValueError, match=r"^choice default 'oval' is not one of \('flat', 'round'\)$"):
        choice("flat", "round", default="oval")


def test_a_bad_value_is_one_line_naming_the_key_and_the_options():
    with pytest.raises(ValueError, match=r"^paint.colour must be one of red \| green, got 'blue'$"):
        load_config(Paint, None, ["colour=blue"])
    with pytest.raises(ValueError, match=r"^paint.finish must be one of null \| matte \| gloss, got 'satin'$"):
        Paint(finish="satin")
    with pytest.raises(ValueError, match=r"^role must be one of policy \| context, got 'user'$"):
        check_choice("role", "user", Literal["policy", "context"])


def test_help_lists_the_options_unless_the_comment_already_does():
    lines = {ln.split("=")[0].strip(): ln for ln in config_help(Paint, "paint").splitlines() if "=" in ln}
    assert lines["colour"].endswith("# red | green: what the wall turns")
    assert lines["finish"].endswith("# null | matte | gloss")
    assert lines["brush"].endswith("# flat | round")  # its comment lists them: not twice


@pytest.mark.parametrize("override, message", [
    ("logging.wandb_mode=cloud", "logging.wandb_mode must be one of offline | online | disabled, got 'cloud'"),
    ("hierarchical_agent.prompt_source=file", "hierarchical_agent.prompt_source must be one of mode | row, got 'file'"),
    ("grpo.rollout_is=batch", "grpo.rollout_is must be one of null | token | sequence, got 'batch'"),
    ("gtr.mode=on", "gtr.mode must be one of off | observe | train, got 'on'"),  # the string, not YAML's True
    ("rollout.weight_sync=nfs", "rollout.weight_sync must be one of auto | broadcast | disk, got 'nfs'"),
])
def test_the_rl_recipe_checks_its_choices(override, message):
    from paravt.rl.config import RLConfig

    with pytest.raises(ValueError) as e:
        load_config(RLConfig, None, ["model_path=m", "train_data=[x.parquet]", override])
    assert str(e.value) == message


def test_off_on_yes_no_stay_strings_for_a_choice_and_booleans_for_a_flag():
    from paravt.rl.config import RLConfig

    cfg = load_config(RLConfig, None, ["model_path=m", "train_data=[x.parquet]", "gtr.mode=off",
                                       "logging.progress=off", "grpo.group_norm=no", "trainer.gradient_checkpointing=true"])
    assert (cfg.gtr.mode, cfg.logging.progress, cfg.grpo.group_norm, cfg.trainer.gradient_checkpointing) == \
        ("off", False, False, True)


def test_the_episode_checks_its_overview_style_and_channel():
    from paravt.agent.episode import EpisodeConfig

    with pytest.raises(ValueError, match=r"^overview_style must be one of paravt \| release_eval, got 'x'$"):
        EpisodeConfig(overview_style="x")
    with pytest.raises(ValueError, match=r"^overview_channel must be one of image_url \| video_url, got 'file'$"):
        EpisodeConfig(overview_channel="file")
