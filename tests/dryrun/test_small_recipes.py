"""The Qwen3-VL-2B and -4B recipes (configs/sft/qwen3vl_{2b,4b}.yaml, configs/rl/paragrpo_{2b,4b}_*.yaml): the
published configs the dry run models them with, the launchers' preflight for each on its stated GPUs, what each
changes against the 8B recipe it extends, and the dry run at real width fitting each on its GPUs (its recorded
figures; slow: the two tightest traced again)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.dryrun.conftest import ROOT, TEXT, VISION, dry_run

SFT = {"configs/sft/qwen3vl_2b.yaml": "2b", "configs/sft/qwen3vl_4b.yaml": "4b"}

# what the in-process-engine recipes change against paragrpo_8b.yaml (the sections' keys)
IN_PROCESS = {"grpo": {"prompts_per_step", "max_staleness"}, "rollout": {"engine", "dtype"},
              "trainer": {"attn_implementation", "pack_tokens"}}
# recipe -> (model, GPUs of the node, GPU kind the recipe is sized for, trainer GPUs, rollout server GPUs,
#            rollout engine, what it changes against paragrpo_8b.yaml besides model_path and output_dir)
RL = {
    "configs/rl/paragrpo_2b_1gpu.yaml": ("2b", 1, "h100", ["0"], [], "hf", IN_PROCESS),
    "configs/rl/paragrpo_2b_2gpu.yaml": ("2b", 2, "h100", ["0"], [1], "sglang",
                                         {"rollout": {"server"}, "trainer": {"pack_tokens"}}),
    "configs/rl/paragrpo_2b_4gpu.yaml": ("2b", 4, "h100", ["0", "1", "2"], [3], "sglang", {"rollout": {"server"}}),
    "configs/rl/paragrpo_4b_1gpu.yaml": ("4b", 1, "h200", ["0"], [], "hf", IN_PROCESS),
    "configs/rl/paragrpo_4b_2gpu.yaml": ("4b", 2, "h100", ["0", "1"], [], "hf", IN_PROCESS),
    "configs/rl/paragrpo_4b_4gpu.yaml": ("4b", 4, "h100", ["0", "1", "2"], [3], "sglang", {"rollout": {"server"}}),
}
GIB = 2 ** 30


def engine_gib(size: str) -> float:
    """The in-process engine's bf16 weights (GiB), held on trainer rank 0's GPU all run."""
    from paravt.models.reference_shapes import PUBLISHED_PARAMS

    return 2 * PUBLISHED_PARAMS[size] / GIB


@pytest.mark.parametrize("size, params", [("2b", 2_127_532_032), ("4b", 4_437_815_808), ("8b", 8_767_123_696)])
def test_the_published_configs_have_the_published_sizes(size, params):
    from paravt.models.reference_shapes import PUBLISHED_PARAMS, param_shapes, qwen3vl_config

    shapes = dict(param_shapes(qwen3vl_config(size)))
    assert sum(math.prod(s) for s in shapes.values()) == params == PUBLISHED_PARAMS[size]
    # 2B and 4B tie lm_head to the input embeddings: one matrix, listed once; the 8B's head is its own
    assert ("lm_head.weight" in shapes) == (size == "8b")
    assert shapes["model.language_model.embed_tokens.weight"][0] == 151936


def test_the_reduced_depth_builders_keep_the_width():
    from paravt.models.reference_shapes import qwen3vl_2b_config, qwen3vl_4b_config

    c2, c4 = qwen3vl_2b_config(num_hidden_layers=2, vision_depth=6), qwen3vl_4b_config()
    assert (c2.text_config.hidden_size, c2.text_config.num_hidden_layers, c2.vision_config.depth) == (2048, 2, 6)
    assert c2.vision_config.deepstack_visual_indexes == [5] and c2.vision_config.out_hidden_size == 2048
    assert (c4.text_config.hidden_size, c4.text_config.intermediate_size, c4.text_config.num_attention_heads) == \
        (2560, 9728, 32)
    assert c4.tie_word_embeddings and c4.text_config.tie_word_embeddings


@pytest.mark.parametrize("name, size", [("Qwen/Qwen3-VL-2B-Instruct", "2b"), ("Qwen/Qwen3-VL-4B-Thinking", "4b"),
                                        ("runs/sft_qwen3vl_4b/final", "4b"), ("runs/sft_qwen3vl_8b/final", "8b"),
                                        ("Qwen/Qwen3-VL-32B-Instruct", None), ("runs/tiny_base", None), (None, None)])
def test_a_model_name_picks_its_reference(name, size):
    from paravt.models.reference_shapes import reference_size

    assert reference_size(name) == size


@pytest.mark.parametrize("recipe, size", sorted(SFT.items()))
def test_sft_recipes_pass_the_preflight_on_1_2_and_4_gpus(recipe, size):
    from paravt.core.config import load_config, parse_cli
    from paravt.models.reference_shapes import reference_size
    from paravt.sft.config import SFTConfig

    cfg = parse_cli(SFTConfig, [recipe], "run_sft.sh")
    assert cfg.needs_cuda()  # a GPU recipe: the launcher stops on a machine without CUDA
    for world in (1, 2, 4):
        split = cfg.step_split(world)
        assert split.passes * world == cfg.global_batch_size == 32  # the release's 32 packs a step on any count
    assert reference_size(cfg.model_path) == size == reference_size(cfg.output_dir)
    a, b = asdict(cfg), asdict(load_config(SFTConfig, "configs/sft/qwen3vl_8b.yaml"))
    assert {k for k in a if a[k] != b[k]} == {"model_path", "output_dir"}  # the 8B's recipe otherwise


@pytest.mark.parametrize("recipe", sorted(RL))
def test_rl_recipes_pass_the_preflight_on_their_gpus(recipe):
    from paravt.core.config import load_config, parse_cli
    from paravt.models.reference_shapes import reference_size
    from paravt.rl.config import RLConfig
    from paravt.rl.layout import plan

    size, ngpu, _, train, rollout, engine, changed = RL[recipe]
    cfg = parse_cli(RLConfig, [recipe], "run_rl.sh")
    assert cfg.needs_cuda()  # a GPU recipe: the launcher stops on a machine without CUDA
    share = plan(cfg, ngpu, {})  # run_rl.sh's placement on a node of ngpu GPUs
    cfg.check_world_size(share.world)
    assert (share.train_gpus, share.rollout_gpus, share.world) == (train, rollout, len(train))
    assert cfg.rollout.engine == engine and reference_size(cfg.model_path) == size
    if engine == "hf":  # the in-process engine shares trainer rank 0's GPU: in bf16, rollouts and training in turn
        assert cfg.rollout.dtype == "bfloat16" and cfg.grpo.max_staleness == 0 and cfg.rollout.backend().transports \
            == ("state_dict",)
    a, b = asdict(cfg), asdict(load_config(RLConfig, "configs/rl/paragrpo_8b.yaml"))
    top = {k for k in a if a[k] != b[k]}
    assert top == {"model_path", "output_dir"} | set(changed)
    for section, keys in changed.items():
        assert {k for k in a[section] if a[section][k] != b[section][k]} == keys, section
    # every PARA-GRPO setting of the paper's recipe is kept: rewards, gating, anchoring, the group, KL, lr
    assert a["paravt"] == b["paravt"] and a["optim"] == b["optim"] and cfg.grpo.n_samples == 8
    assert (cfg.grpo.kl_coef, cfg.grpo.clip_eps, cfg.hierarchical_agent.max_new_tokens) == (0.01, 0.2, 2048)


@pytest.mark.parametrize("recipe", sorted(SFT) + sorted(RL))
def test_the_dry_run_models_each_recipe_with_its_published_config(recipe):
    from paravt.dryrun import workload
    from paravt.dryrun.recipe import load
    from paravt.models.reference_shapes import reference_size

    stage, cfg = load(recipe, [])
    size = reference_size(cfg.model_path)
    want = {"2b": (2048, 28), "4b": (2560, 36)}[size]
    t = workload.model_config(None, reference=size).text_config
    assert (t.hidden_size, t.num_hidden_layers, t.tie_word_embeddings) == (*want, True)
    assert stage == ("sft" if "/sft/" in recipe else "rl")


@pytest.fixture(scope="module")
def tied_small_config(tmp_path_factory):
    """The conftest's small model with its lm_head tied to the input embeddings, as the 2B and 4B have it."""
    from transformers import Qwen3VLConfig

    out = tmp_path_factory.mktemp("tied_small_vl")
    Qwen3VLConfig(text_config={**TEXT, "tie_word_embeddings": True}, vision_config=VISION, image_token_id=151655,
                  video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
                  tie_word_embeddings=True).save_pretrained(out)
    return out


def test_a_tied_model_steps_through_the_one_gpu_recipe(tied_small_config, tmp_path):
    """The in-process-engine recipe on one GPU, its model's head tied: one trainer rank, FSDP2 shards the shared
    matrix once (embeddings and head in one group), the step runs through the trainer's code."""
    from transformers import AutoConfig

    from paravt.models.reference_shapes import param_shapes

    proc, res = dry_run("configs/rl/paragrpo_2b_1gpu.yaml", "--model-config", str(tied_small_config), "--gpus", "1",
                        "grpo.n_samples=2", "hierarchical_agent.max_new_tokens=64", "paravt.gating.choices=[4]",
                        "hierarchical_agent.crop.max_pixels=12544", json_out=tmp_path / "tied.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    shapes = dict(param_shapes(AutoConfig.from_pretrained(str(tied_small_config))))
    assert "lm_head.weight" not in shapes  # the shared matrix, counted once
    assert res["model"]["params"] == sum(math.prod(s) for s in shapes.values())
    assert res["world"] == 1 and res["ranks"][0]["fits"] and res["weight_push"]["bytes"] == 2 * res["model"]["params"]


# ----------------------------------------------------------------------------- the recorded dry runs, and slow
# benchmarks/results/dryrun/ holds each recipe's full-width dry run (the figures of the recipes' headers and of
# benchmarks/README.md). The fast tests hold the records to the recipes as they are now (a changed recipe needs a
# new record) and check that each fits; the slow ones trace the two tightest recipes again. Memory budgets: the
# GPU's, less (for the in-process engine's recipes) the engine's bf16 weights on trainer rank 0's GPU.
RECORDS = ROOT / "benchmarks" / "results" / "dryrun"


def budget_gib(recipe: str) -> float:
    from paravt.dryrun.report import GPUS

    size, _, gpu, _, _, engine, _ = RL[recipe]
    return GPUS[gpu].memory_gib - (engine_gib(size) if engine == "hf" else 0.0)


def record(name: str) -> dict:
    return json.loads((RECORDS / f"{name}.json").read_text())


@pytest.mark.parametrize("recipe, gpus", [(r, g) for r in sorted(SFT) for g in (1, 2, 4)])
def test_the_recorded_sft_dry_runs_fit_an_h100_on_1_2_and_4_gpus(recipe, gpus):
    from paravt.core.config import load_config
    from paravt.models.reference_shapes import PUBLISHED_PARAMS
    from paravt.sft.config import SFTConfig

    cfg, size = load_config(SFTConfig, recipe), SFT[recipe]
    res = record(f"{Path(recipe).stem}_{gpus}gpu")
    assert (res["recipe"], res["world"], res["gpu"]["key"], res["extrapolated"]) == (recipe, gpus, "h100", False)
    assert res["model"] == {"name": f"Qwen3-VL-{size.upper()}", "text_layers": {"2b": 28, "4b": 36}[size],
                            "vision_blocks": 24, "params": PUBLISHED_PARAMS[size]}
    w = res["work"]
    assert (w["packs_per_rank"], w["pack_tokens"]) == (cfg.step_split(gpus).passes, cfg.max_length)
    assert all(r["fits"] and r["memory"]["peak"] <= 79.2 * GIB for r in res["ranks"])


@pytest.mark.parametrize("recipe", sorted(RL))
def test_the_recorded_rl_dry_runs_fit_their_gpus(recipe):
    from paravt.core.config import load_config
    from paravt.models.reference_shapes import PUBLISHED_PARAMS
    from paravt.rl.config import RLConfig

    cfg = load_config(RLConfig, recipe)
    size, ngpu, gpu, train, _, _, _ = RL[recipe]
    res = record(Path(recipe).stem)
    assert (res["recipe"], res["world"], res["gpus_per_node"], res["gpu"]["key"], res["extrapolated"]) == \
        (recipe, len(train), ngpu, gpu, False)
    assert res["model"]["name"] == f"Qwen3-VL-{size.upper()}" and res["model"]["params"] == PUBLISHED_PARAMS[size]
    w, g = res["work"], cfg.grpo
    assert (w["samples_per_step"], w["pack_tokens_budget"], w["answer_tokens"], w["overview_frames"]) == \
        (g.prompts_per_step * g.n_samples, cfg.trainer.pack_tokens, cfg.hierarchical_agent.max_new_tokens,
         max(cfg.paravt.gating.choices))
    assert w["reference_model"] and all(r["memory"]["peak"] <= budget_gib(recipe) * GIB for r in res["ranks"])


def test_the_4b_on_one_gpu_does_not_fit_an_h100():
    """Why paragrpo_4b_1gpu is sized for an H200: on an 80 GB card its state alone (fp32 weights, gradients,
    AdamW moments: 16 bytes a parameter) and the reference leave no room for the step (the peak does not
    depend on the GPU the dry run names)."""
    peak = record("paragrpo_4b_1gpu")["ranks"][0]["memory"]
    assert peak["parameters"] + peak["gradients"] + peak["optimizer"] > 70 * GIB
    assert peak["peak"] > 79.2 * GIB


# At real width, every text layer traced: 1-2 min each on 2 cores (more on a busy machine).
@pytest.mark.slow
def test_the_4b_sft_step_fits_one_h100(tmp_path):
    """The tightest SFT recipe: the 4B on one GPU, its whole fp32 state on one rank."""
    proc, res = dry_run("configs/sft/qwen3vl_4b.yaml", "--gpus", "1", json_out=tmp_path / "sft.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert res["world"] == 1 and res["model"]["name"] == "Qwen3-VL-4B" and res["ranks"][0]["fits"]
    assert res["ranks"][0]["memory"]["peak"] == pytest.approx(record("qwen3vl_4b_1gpu")["ranks"][0]["memory"]["peak"],
                                                             rel=0.02)  # the record still holds


@pytest.mark.slow
def test_the_4b_on_two_gpus_fits_beside_its_in_process_engine(tmp_path):
    """The tightest RL recipe on 80 GB cards: two trainer ranks, the engine's weights on rank 0's GPU."""
    recipe = "configs/rl/paragrpo_4b_2gpu.yaml"
    proc, res = dry_run(recipe, "--gpus", "2", "--gpu-memory", f"{budget_gib(recipe):.2f}",
                        json_out=tmp_path / "rl.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert res["world"] == 2 and res["model"]["name"] == "Qwen3-VL-4B" and all(r["fits"] for r in res["ranks"])
    assert res["ranks"][0]["memory"]["peak"] == pytest.approx(record("paragrpo_4b_2gpu")["ranks"][0]["memory"]["peak"],
                                                             rel=0.02)  # the record still holds


def test_a_state_bound_overflow_asks_for_more_gpus_first():
    """The one-line advice when the sharded state outweighs activations (a 4B on one 80 GB card): more GPUs
    first, then the step's knobs, as one sentence."""
    from paravt.core.config import load_config
    from paravt.dryrun.report import advice
    from paravt.rl.config import RLConfig

    cfg = load_config(RLConfig, "configs/rl/paragrpo_4b_1gpu.yaml")
    split = {"parameters": 24.8, "gradients": 16.5, "optimizer": 33.1, "activations": 16.3, "temporaries": 13.9}
    text = advice("rl", cfg, split, 1, True)
    assert text.startswith("use more GPUs than 1 (parameters, gradients and optimizer state shard over them), or "
                           "lower trainer.pack_tokens")
    split.update(activations=80.0)  # activations and temporaries outweigh the state: the step's knobs first
    assert advice("rl", cfg, split, 1, True).startswith("lower trainer.pack_tokens")
