import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from paravt.core.config import load_config
from paravt.sft.config import SFTConfig
from paravt.sft.trainer import SFTTrainer


def _cfg(world, tiny_dir, out, **kw):
    over = [f"model_path={tiny_dir}", f"output_dir={out}", f"data.0.path={world}/local/paravt_sft_synth.parquet",
            "max_length=1024", "logging.wandb_project=null", "logging.progress=false", "save_every=2"]
    over += [f"{k}={v}" for k, v in kw.items()]
    return load_config(SFTConfig, "configs/sft/tiny.yaml", over)


def _weights(path):
    return load_file(str(path / "model.safetensors"))


def test_resume_gives_the_same_weights(world, tiny_dir, tmp_path):
    straight = SFTTrainer(_cfg(world, tiny_dir, tmp_path / "a", max_steps=4))
    straight.train()
    half = SFTTrainer(_cfg(world, tiny_dir, tmp_path / "b", max_steps=4))
    half.train(until=3)  # "crash" after step 3; the last checkpoint is step 2
    assert (tmp_path / "b/checkpoints/step_000002/COMPLETE").exists()
    assert not (tmp_path / "b/checkpoints/step_000003").exists()
    resumed = SFTTrainer(_cfg(world, tiny_dir, tmp_path / "b", max_steps=4))
    resumed.train()
    assert resumed.global_step == 4
    wa = _weights(tmp_path / "a/checkpoints/step_000004/hf")
    wb = _weights(tmp_path / "b/checkpoints/step_000004/hf")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k
    w0 = _weights(tiny_dir)
    assert any(not torch.allclose(w0[k], wa[k]) for k in wa)  # training changed the weights
    # metrics.jsonl has each step once, in order, after the resume
    import json
    steps = [json.loads(ln)["step"] for ln in (tmp_path / "b/metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # step 3 was redone after the resume, and logged once
    assert (tmp_path / "b/loss_curve.png").stat().st_size > 1000
    assert (tmp_path / "b/final/config.json").exists()


def test_missing_shard_is_an_error_unless_optional(world, tiny_dir, tmp_path):
    from paravt.sft.data import MissingShardError, Shard
    cfg = _cfg(world, tiny_dir, tmp_path / "c", max_steps=1)
    cfg.data.append(Shard(path=str(tmp_path / "paravt_sft_gemini_cot_4k8.parquet"), name="gemini_cot"))
    with pytest.raises(MissingShardError, match="gemini_cot_4k8.parquet"):
        SFTTrainer(cfg)
    cfg = _cfg(world, tiny_dir, tmp_path / "c", max_steps=1)
    cfg.data.append(Shard(path=str(tmp_path / "nope.parquet"), name="missing", optional=True))
    tr = SFTTrainer(cfg)
    assert tr.data_report["missing_shards"] == [str(tmp_path / "nope.parquet")]
    with pytest.raises(ValueError, match="model_path"):
        SFTConfig(model_path="", data=[Shard(path="x")])
    with pytest.raises(ValueError, match="strategy"):
        load_config(SFTConfig, None, ["model_path=m", "data=[{path: x}]", "dist.strategy=horovod"])
    with pytest.raises(Exception, match="not_a_key"):
        load_config(SFTConfig, "configs/sft/tiny.yaml", ["not_a_key=1"])


def test_8b_manifest_uses_the_released_shard_names(tmp_path):
    """The authors' SFT manifest names (geminicot, selftrace, videor1): an 8B run on the released
    parquets finds all seven shards."""
    cfg = load_config(SFTConfig, "configs/sft/qwen3vl_8b.yaml", [f"data_root={tmp_path}"])
    names = sorted(os.path.basename(sh.path) for sh in cfg.data)
    assert names == sorted(["paravt_sft_geminicot_4k8.parquet", "paravt_sft_selftrace_15k3.parquet",
                            "paravt_sft_tvg_6k3.parquet", "paravt_sft_museg_2k5.parquet",
                            "paravt_sft_charades_12k4.parquet", "paravt_sft_longvideoreason_5k2.parquet",
                            "paravt_sft_videor1_50k.parquet"])
    assert not any(sh.optional for sh in cfg.data)


def test_schedule_planned_over_1500_steps_stops_at_500():
    """The released SFT checkpoint is step 500 of a cosine planned over 1500 steps (lr ≈ 0.8x peak there)."""
    from paravt.sft.trainer import lr_lambda
    cfg = load_config(SFTConfig, "configs/sft/qwen3vl_8b.yaml")
    assert cfg.max_steps == 500 and cfg.optim.schedule_steps == 1500
    f = lr_lambda(cfg)
    assert f(0) == pytest.approx(1 / 75) and f(74) == pytest.approx(1.0)  # 5% of 1500 = 75 warm-up steps
    assert 0.75 < f(499) < 0.85
    own = load_config(SFTConfig, "configs/sft/qwen3vl_8b.yaml", ["optim.schedule_steps=null"])
    assert lr_lambda(own)(499) < 1e-4  # our old schedule: cosine finished at max_steps


def test_help_lists_settings():
    r = subprocess.run([sys.executable, "-m", "paravt.sft.train", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "optim.lr" in r.stdout and "dist.strategy" in r.stdout


def _two_ranks(world, tiny_dir, out, *over):
    """``python -m paravt.sft.train`` on two gloo ranks under torchrun; its metrics.jsonl records."""
    import json
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           "-m", "paravt.sft.train", "configs/sft/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={out}",
           f"data.0.path={world}/local/paravt_sft_synth.parquet", "max_length=1024", "max_steps=2", "save_every=2",
           "logging.wandb_project=null", "logging.progress=false", *over]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def test_two_process_gloo_fsdp2(world, tiny_dir, tmp_path):
    """The tiny recipe (one pack a step) on two ranks: each step one rank trains the pack and the other
    runs a zero-weight pass, by turns, so both ranks' data cursors move one pack in two steps."""
    out = tmp_path / "ddp"
    rec = _two_ranks(world, tiny_dir, out)
    assert [x["step"] for x in rec] == [1, 2] and all(x["loss"] > 0 for x in rec)
    assert all(x["micro_batches"] == 1 and x["filler_passes"] == 1 for x in rec)
    cursors = [torch.load(out / f"checkpoints/step_000002/rank{r}.pt", weights_only=False)["stream"] for r in (0, 1)]
    assert cursors[0]["cursor"] >= 1 and cursors[1]["cursor"] >= 1  # both ranks saved their data cursor and trained
    from paravt.models.loading import load_model
    m = load_model(out / "final")
    assert sum(p.numel() for p in m.parameters()) > 1_000_000


@pytest.mark.launcher  # torchrun on one rank and on two: CI's launcher group
def test_the_step_is_the_same_on_one_rank_or_two(world, tiny_dir, tmp_path):
    """global_batch_size=3 padded rows, one a pass: one rank trains them in three passes, two gloo ranks in
    two each (one rank's spare pass has no weight, and it moves to the other rank next step). Either way a
    step trains the same rows: the same tokens, loss and weights after each of two steps."""
    over = ["packing=false", "global_batch_size=3", "per_device_batch_size=1", "max_length=2048", "save_every=1",
            "keep_last=2"]
    one = SFTTrainer(_cfg(world, tiny_dir, tmp_path / "one", max_steps=2,
                          **dict(o.split("=") for o in over)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the two ranks run (OMP_NUM_THREADS=1): another thread count sums in another order
    try:
        one.train()
    finally:
        torch.set_num_threads(threads)
    import json
    a = [json.loads(ln) for ln in (tmp_path / "one/metrics.jsonl").read_text().splitlines()]
    b = _two_ranks(world, tiny_dir, tmp_path / "two", *over)
    for x, y in zip(a, b, strict=True):
        assert x["rows_per_step"] == y["rows_per_step"] == 3
        assert (x["tokens_per_step"], x["supervised_tokens"]) == (y["tokens_per_step"], y["supervised_tokens"])
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
        assert (x["micro_batches"], x["filler_passes"], y["micro_batches"], y["filler_passes"]) == (3, 0, 2, 1)
    for step in (1, 2):
        wa = _weights(tmp_path / f"one/checkpoints/step_{step:06d}/hf")
        wb = _weights(tmp_path / f"two/checkpoints/step_{step:06d}/hf")
        assert wa.keys() == wb.keys()
        worst = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
        assert worst < 1e-6, (step, worst)  # measured: ~1e-7 (the order of the ranks' sums)


def test_vision_lr_scale_and_freeze(tiny_dir):
    from paravt.models.loading import load_model
    from paravt.sft.trainer import param_groups
    m = load_model(tiny_dir)
    groups = param_groups(m, 0.01, vision_lr_scale=0.1, lr=1e-3)
    vis = {id(p) for n, p in m.named_parameters() if ".visual." in f".{n}"}
    for g in groups:
        is_vis = {id(p) in vis for p in g["params"]}
        assert len(is_vis) == 1
        assert g["lr"] == pytest.approx(1e-4 if is_vis.pop() else 1e-3)
    assert sum(len(g["params"]) for g in groups) == len(list(m.parameters()))
    frozen = param_groups(m, 0.01, vision_lr_scale=0.0, lr=1e-3)
    assert all(id(p) not in vis for g in frozen for p in g["params"])
    assert not any(p.requires_grad for n, p in m.named_parameters() if ".visual." in f".{n}")


def test_copy_aux_is_logged_resumable_and_trains_the_text_stack(world, tiny_dir, tmp_path):
    """copy_aux.weight > 0: each step adds one seeded copy batch; its loss is logged as copy_loss, a
    resumed run draws the same batches (same weights as a straight run), and the vision tower gets no
    gradient from it (text only)."""
    import json
    aux = {"copy_aux.weight": 1.0, "copy_aux.batch": 4}
    straight = SFTTrainer(_cfg(world, tiny_dir, tmp_path / "a", max_steps=4, **aux))
    straight.train()
    half = SFTTrainer(_cfg(world, tiny_dir, tmp_path / "b", max_steps=4, **aux))
    half.train(until=3)
    resumed = SFTTrainer(_cfg(world, tiny_dir, tmp_path / "b", max_steps=4, **aux))
    resumed.train()
    wa, wb = _weights(tmp_path / "a/final"), _weights(tmp_path / "b/final")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    rec = [json.loads(ln) for ln in (tmp_path / "a/metrics.jsonl").read_text().splitlines()]
    assert all(5.0 < r["copy_loss"] < 9.0 for r in rec)  # ~ln(vocab) at random init: a real loss was computed
    plain = SFTTrainer(_cfg(world, tiny_dir, tmp_path / "c", max_steps=4))
    plain.train()
    assert "copy_loss" not in json.loads((tmp_path / "c/metrics.jsonl").read_text().splitlines()[0])
    wc = _weights(tmp_path / "c/final")
    text = [k for k in wa if "language_model" in k and "layers.0.self_attn.q_proj" in k]
    assert text and not torch.allclose(wa[text[0]], wc[text[0]])  # the copy loss moved the text stack
    with pytest.raises(ValueError, match="copy_aux"):
        _cfg(world, tiny_dir, tmp_path / "d", **{"copy_aux.weight": -1})
    with pytest.raises(ValueError, match="deepspeed"):
        _cfg(world, tiny_dir, tmp_path / "d", **{"copy_aux.weight": 1, "dist.strategy": "deepspeed"})


def test_freeze_lm_head_keeps_the_output_rows_and_refuses_a_tied_model(world, tiny_dir, tmp_path):
    """optim.freeze_lm_head: the saved lm_head equals the base's after training while the input
    embeddings move; on the tied tiny base (lm_head = input embeddings) it is refused by name."""
    from paravt.models.tiny import main as build

    with pytest.raises(ValueError, match="freeze_lm_head needs a model whose lm_head is not tied"):
        SFTTrainer(_cfg(world, tiny_dir, tmp_path / "tied", max_steps=1, **{"optim.freeze_lm_head": "true"}))
    assert build(["--out", str(tmp_path / "base"), "--no-tie-embeddings", "--no-progress"]) == 0
    t = SFTTrainer(_cfg(world, tmp_path / "base", tmp_path / "run", max_steps=2, **{"optim.freeze_lm_head": "true"}))
    t.train()
    before, after = _weights(tmp_path / "base"), _weights(tmp_path / "run" / "final")
    head = next(k for k in after if k.endswith("lm_head.weight"))
    emb = next(k for k in after if k.endswith("embed_tokens.weight"))
    assert torch.equal(before[head], after[head])
    assert not torch.equal(before[emb], after[emb])


def test_fsdp2_over_one_fp32_rank_is_the_plain_module_with_the_same_steps(tiny_dir):
    """One rank in fp32: wrap_fsdp2 returns the module itself, and two AdamW steps on it give the same
    losses and weights as the same steps through fully_shard on that one rank."""
    from paravt.models import parallel
    from paravt.models.loading import load_model

    d = parallel.init_distributed()
    assert d.world_size == 1
    plain = load_model(tiny_dir)
    assert parallel.wrap_fsdp2(plain, d, torch.float32) is plain
    assert not any(type(m).__name__.startswith("FSDP") for m in plain.modules())
    sharded = parallel.wrap_fsdp2(load_model(tiny_dir), d, torch.float32, shard_one_rank=True)
    assert any(type(m).__name__.startswith("FSDP") for m in sharded.modules())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 500, (2, 48), generator=g)
    losses = {}
    for name, m in (("plain", plain), ("sharded", sharded)):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        losses[name] = []
        for _ in range(2):
            out = m(input_ids=ids, labels=ids)
            out.loss.backward()
            parallel.clip_grad_norm(m.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses[name].append(float(out.loss.detach()))
    assert losses["plain"] == losses["sharded"]
    sd = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in sharded.state_dict().items()}
    for k, v in plain.state_dict().items():
        assert torch.equal(v, sd[k]), k
