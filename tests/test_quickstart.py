"""The main job end to end, shortened (QUICKSTART_SMALL=1): setup -> tiny model -> world -> perception -> SFT ->
vanilla GRPO and PARA-GRPO -> eval at K = 4 and 64 -> report; its rerun; Format Fragility in its folder; a second
seed through reproduce_tiny.sh and the report across seeds. Slow: run with -m slow (CI does)."""

import os
import subprocess

import pytest


@pytest.mark.slow
@pytest.mark.timeout(6000)  # the pipeline, a rerun and a second seed: beyond the suite's per-test limit
def test_short_quickstart(tmp_path):
    out = tmp_path / "qs"
    r = subprocess.run(["bash", "scripts/quickstart.sh", str(out)], capture_output=True, text=True, timeout=3000,
                       env={**os.environ, "QUICKSTART_SMALL": "1"})
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    report = (out / "report.md").read_text()
    for row in ("SFT, no tools", "SFT, with tools", "vanilla GRPO", "PARA-GRPO"):
        assert row in report
    assert (out / "report_curves.png").stat().st_size > 1000
    assert (out / "rl_paragrpo/final/config.json").exists() and (out / "sft/loss_curve.png").exists()
    assert (out / "perception/final/config.json").exists()
    import json

    import pyarrow.parquet as pq

    # the tiny base got its copy warm-up, the SFT stage its reading rows, the probe reads
    assert json.loads((out / "tiny_model/paravt_tiny.json").read_text())["copy_warmup"]["steps"] == 10
    assert pq.read_metadata(out / "world/local/paravt_reading_synth.parquet").num_rows == 300
    assert json.loads((out / "probe_sft.json").read_text())["reading"]["n"] == 4  # EVAL_LIMIT at CI size
    for stage in ("perception", "sft"):  # COPY_AUX=1: both stages trained the copy task beside their rows
        assert "copy_loss" in json.loads((out / stage / "metrics.jsonl").read_text().splitlines()[-1])
    assert "reading: shape / colour / times" in report
    speed = json.loads((out / "machine_speed.json").read_text())["machine_speed_gflops"]
    assert f"Machine speed: {speed} GFLOP/s" in report  # the header names the machine the times were taken on
    # the defaults: the needle world, an untied lm_head, sub-agents at the world's 30 frames
    assert json.loads((out / "world/world.json").read_text())["config"]["max_events"] == 1
    assert json.loads((out / "tiny_model/paravt_tiny.json").read_text())["shape"]["tie_word_embeddings"] is False
    run_cfg = out / "eval/sft-tool-K4/image_url/synthetic.run_config.json"
    assert json.loads(run_cfg.read_text())["identity"]["crop.max_frames"] == 30
    # the no-tools arm answers from its frames: direct rows in the SFT data, the direct prompt in eval
    assert json.loads((out / "world/world_stats.json").read_text())["sft_direct_rows"] > 0
    notool = json.loads((out / "eval/sft-notool-K64/image_url/synthetic.run_config.json").read_text())["identity"]
    assert notool["prompt_mode"] == "direct"
    # SFT in phases (reading -> reading_long -> reading_episode), each from the previous final
    assert pq.read_metadata(out / "world/local/paravt_reading_episode_synth.parquet").num_rows == 300
    for phase in ("sft_reading", "sft_reading_long"):
        assert (out / phase / "final/config.json").exists()
    stages = (out / "stage_seconds.tsv").read_text()
    assert all(f"{s}\t" in stages for s in ("sft_reading", "sft_reading_long", "sft_reading_episode"))
    if len(os.sched_getaffinity(0)) >= 2:  # QUICKSTART_JOBS' default there: two chains (an RL arm, then eval cells) side by side
        assert "rl_eval\t" in stages and "side by side" in r.stdout
        assert "finished beside it" in r.stdout and (out / "rl_vanilla.log").stat().st_size > 0
        assert (out / "eval_b.log").stat().st_size > 0 and (out / "eval.log").stat().st_size > 0
    # rerunning reuses every finished stage
    r2 = subprocess.run(["bash", "scripts/quickstart.sh", str(out)], capture_output=True, text=True, timeout=900,
                        env={**os.environ, "QUICKSTART_SMALL": "1"})
    assert r2.returncode == 0 and r2.stdout.count("reusing") >= 7
    # a rerun asking another seed stops at the first stage it would reuse, naming the argument that differs
    rs = subprocess.run(["bash", "scripts/quickstart.sh", str(out)], capture_output=True, text=True, timeout=900,
                        env={**os.environ, "QUICKSTART_SMALL": "1", "SEED": "1"})
    assert rs.returncode == 2 and f"{out}/tiny_model was made with other settings" in rs.stderr, rs.stderr[-2000:]
    assert "  this run:   --seed 1" in rs.stderr and "  that stage: --seed 0" in rs.stderr
    # Format Fragility in this quickstart's folder, as a user runs it after a quickstart (CI runs it in one seed:
    # the same stage per seed; the table and interval across seeds are tested in tests/analysis/test_seeds.py)
    rf = subprocess.run(["bash", "scripts/fragility_tiny.sh", str(out)], capture_output=True, text=True, timeout=3000,
                        env={**os.environ, "QUICKSTART_SMALL": "1"})
    assert rf.returncode == 0, (rf.stdout[-3000:], rf.stderr[-3000:])
    assert pq.read_metadata(out / "fragility/native.parquet").num_rows > 0
    # across seeds: this run is seed 0 (every stage reused), seed 1 trains on the same world
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "seed_0").symlink_to(out)
    r3 = subprocess.run(["bash", "scripts/reproduce_tiny.sh", str(rep)], capture_output=True, text=True, timeout=3000,
                        env={**os.environ, "QUICKSTART_SMALL": "1", "SEEDS": "0 1", "FRAGILITY": "0"})
    assert r3.returncode == 0, (r3.stdout[-3000:], r3.stderr[-3000:])
    assert (rep / "seed_1/world").is_symlink() and (rep / "seed_1/rl_paragrpo/final/config.json").exists()
    assert not (rep / "seed_1/fragility").exists()  # FRAGILITY=0
    md = (rep / "report.md").read_text()
    assert "Seeds 0, 1" in md and "| PARA-GRPO vs vanilla GRPO | 4 |" in md
    # every stage's recorded settings compared across the two seeds: the same but the seed; fragility in seed 0 only
    assert "settings are the same in every seed" in md and "fragility/rl_vanilla: in seed_0 only" in md
    assert "training format compliance, PARA-GRPO" in md
    # the report's Format Fragility section from the seed that has it (its row, its curves)
    assert "## Format Fragility" in md and (rep / "fragility_curves.png").stat().st_size > 1000
    assert "Settings: both arms at K = 4; native rows' reasoning keep" in md and "E3 asks" in md
    assert (rep / "seed_0/fragility/rl_vanilla/final/config.json").exists()
    assert (rep / "seed_0/fragility/rl_paragrpo/final/config.json").exists()
