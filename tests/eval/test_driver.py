import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paravt.core.config import load_config
from paravt.eval.driver import EvalConfig, Evaluator, score, summarize
from paravt.eval.splits import EvalSample


def test_scoring_edge_cases():
    m = EvalSample("1", "s", "v", "q", "B")
    assert score(m, "<think>\nhm\n</think>\n<answer>(B) blue</answer>")["correct"] == 1.0
    assert score(m, "<think>\nhm\n</think>\nThe answer is B")["correct"] == 1.0  # text after </think>
    assert score(m, "<think>\nunsure")["correct"] == 0.0
    t = EvalSample("2", "s", "v", "q", [10.0, 20.0], "tvg")
    assert score(t, "<answer>10.0 - 20.0 seconds</answer>")["iou"] == 1.0
    assert score(t, "<answer>00:15 - 00:25</answer>")["iou"] == pytest.approx(5 / 15)
    assert score(t, "<answer>no idea</answer>")["iou"] == 0.0
    s = summarize([{"question_type": "tvg", "iou": 0.6, "score": 0.6, "tool_calls": 2},
                   {"question_type": "tvg", "iou": 0.2, "score": 0.2, "tool_calls": 0},
                   {"question_type": "tvg", "missing_video": "x.mp4", "tool_calls": 0}])
    # over the samples that ran, and over every sample (the missing one counts as IoU 0, as in the paper's tables)
    assert s["mIoU_ran"] == pytest.approx(0.4) and s["mIoU"] == pytest.approx(0.8 / 3)
    assert s["R@0.5"] == pytest.approx(1 / 3) and s["missing_video"] == 1 and s["evaluated"] == 2 and s["lost"] == 1
    assert s["avg_tool_calls"] == 1.0 and s["tool_usage_rate"] == 0.5


def _cfg(world, tiny_dir, out, **kw):
    o = [f"model={tiny_dir}", f"out={out}", f"split_paths={{synthetic: {world}/local}}", "max_new_tokens=24",
         "progress=false", "limit=4", "nframes=4", "max_turns=1"] + [f"{k}={v}" for k, v in kw.items()]
    return load_config(EvalConfig, None, o)


def test_agentic_eval_with_trajectories(world, tiny_dir, tmp_path):
    res = Evaluator(_cfg(world, tiny_dir, tmp_path, save_trajectory=True, row="tiny")).run()["synthetic"]
    assert res["evaluated"] == 4 and res["errors"] == 0
    lines = [json.loads(x) for x in (tmp_path / "tiny/image_url/synthetic.jsonl").read_text().splitlines()]
    assert len(lines) == 4
    traj = lines[0]["trajectory"]
    assert traj["images"].endswith("frame(s) omitted>") and "image" not in json.dumps(traj["turns"]).lower().replace("image_", "")
    assert json.loads((tmp_path / "tiny/image_url/synthetic.json").read_text())["n"] == 4
    all_ = json.loads((tmp_path / "summary_all.json").read_text())
    assert "synthetic" in all_["tiny"]["image_url"] and "| tiny | image_url |" in (tmp_path / "summary.md").read_text()


def test_direct_mode_has_no_tools(world, tiny_dir, tmp_path):
    res = Evaluator(_cfg(world, tiny_dir, tmp_path, prompt_mode="direct", row="d")).run()["synthetic"]
    assert res["avg_tool_calls"] == 0 and res["evaluated"] == 4


def test_resume_after_kill_and_sharding(world, tiny_dir, tmp_path):
    args = [sys.executable, "-m", "paravt.eval.driver", f"model={tiny_dir}", f"out={tmp_path}", "row=k",
            f"split_paths={{synthetic: {world}/local}}", "max_new_tokens=24", "progress=false", "nframes=4",
            "max_turns=1", "limit=12", "concurrency=1"]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = tmp_path / "k/image_url/synthetic.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 2):
        time.sleep(0.1)
    p.send_signal(signal.SIGKILL)
    p.wait()
    n_before = len(out.read_text().splitlines())
    assert 2 <= n_before < 12
    with open(out, "a") as f:
        f.write('{"id": "half-writ')  # a line cut by the kill
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    ids = [json.loads(x)["id"] for x in out.read_text().splitlines() if x.startswith('{"id": "') and x.endswith("}")]
    assert len(ids) == len(set(ids)) == 12  # finished samples were not redone
    summary = json.loads((tmp_path / "k/image_url/synthetic.json").read_text())
    assert summary["n"] == 12
    s0 = _cfg(world, tiny_dir, tmp_path / "s", num_shards=2, shard_id=0, limit="null")
    s1 = _cfg(world, tiny_dir, tmp_path / "s", num_shards=2, shard_id=1, limit="null")
    a, b = Evaluator(s0)._load("synthetic"), Evaluator(s1)._load("synthetic")
    assert not {x.id for x in a} & {x.id for x in b} and len(a) + len(b) == len(Evaluator(_cfg(
        world, tiny_dir, tmp_path / "s", limit="null"))._load("synthetic"))


def test_missing_videos_are_counted(world, tiny_dir, tmp_path):
    import shutil
    local = tmp_path / "local"
    shutil.copytree(world / "local", local)
    from paravt.data.schema import load_rl_rows
    rows, _ = load_rl_rows([local / "paravt_eval_synth.parquet"], check_media=False)
    # point the split at a copy whose first video is gone
    import pyarrow.parquet as pq
    t = pq.read_table(local / "paravt_eval_synth.parquet").to_pylist()
    t[0]["videos"] = [{"video": "file:///nonexistent/gone.mp4"}]
    import pyarrow as pa
    pq.write_table(pa.Table.from_pylist(t), local / "paravt_eval_synth.parquet")
    res = Evaluator(load_config(EvalConfig, None, [f"model={tiny_dir}", f"out={tmp_path}/o", f"split_paths={{synthetic: {local}}}",
                                                   "max_new_tokens=16", "progress=false", "limit=3", "nframes=4",
                                                   "prompt_mode=direct"])).run()["synthetic"]
    assert res["missing_video"] == 1 and res["evaluated"] == 2 and res["n"] == 3 and res["lost"] == 1
    from paravt.eval.driver import lost_work
    assert lost_work({"synthetic": res}) and not lost_work({"synthetic": res}, max_error_fraction=0.5)


def test_config_errors():
    with pytest.raises(ValueError, match="unknown splits"):
        EvalConfig(model="m", splits=["videomme", "imagenet"])
    with pytest.raises(ValueError, match="video_url"):
        EvalConfig(model="m", channel="video_url")
    with pytest.raises(ValueError, match="shard_id"):
        EvalConfig(model="m", shard_id=2, num_shards=2)
    with pytest.raises(ValueError, match="frequency_penalty=3"):
        EvalConfig(model="m", frequency_penalty=3)


def test_penalties_reach_the_episode_and_the_resume_identity(tiny_dir):
    from paravt.eval.driver import episode_config, run_identity

    off, on = EvalConfig(model=str(tiny_dir)), EvalConfig(model=str(tiny_dir), frequency_penalty=0.5, presence_penalty=0.1)
    assert "penalties" not in run_identity(off, "synthetic")  # off: identities of earlier runs unchanged
    assert run_identity(on, "synthetic")["penalties"] == [0.5, 0.1]
    ep = episode_config(on, "mcq")
    assert (ep.frequency_penalty, ep.presence_penalty) == (0.5, 0.1)


def test_reproduce_smoke_prints_the_table(world, tiny_dir, tmp_path):
    r = subprocess.run([sys.executable, "-m", "paravt.eval.reproduce", "--smoke", "--model", str(tiny_dir),
                        "--synthetic", str(world / "local"), "--limit", "2", "--out", str(tmp_path),
                        "max_new_tokens=16"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    table = (tmp_path / "table.md").read_text()
    for row in ("sft-no-tool-K4", "sft-tool-K4", "sft-no-tool-K64", "sft-tool-K64"):
        assert f"| {row} |" in table
    res = json.loads((tmp_path / "table.json").read_text())["results"]
    assert res["sft-no-tool-K4"]["synthetic"]["avg_tool_calls"] == 0  # no tool round


def test_table1_rows_match_the_authors_per_row_scripts():
    """Charades-STA runs every row on the video_url channel with the row's own mode (only
    ParaVT-8B switches to agentic_minimal); Conan runs agentic_general; Table 1 uses the release
    overview protocol."""
    import yaml
    from paravt.eval.reproduce import row_overrides
    spec = yaml.safe_load(open("configs/eval/paper_table1.yaml"))
    rows = {r["row"]: r for r in spec["rows"]}
    assert spec["protocol"]["overview"] == "release"
    cha = {name: row_overrides(r, "charades_sta") for name, r in rows.items()}
    assert all(c["channel"] == "video_url" for c in cha.values())
    assert cha["paravt-8b"]["prompt_mode"] == "agentic_minimal"
    assert cha["qwen3-vl-8b-tool"]["prompt_mode"] == "agentic_general"
    assert cha["qwen2.5-vl-7b"]["prompt_mode"] == "direct" and cha["video-r1"]["prompt_mode"] == "reasoning"
    assert rows["conan-7b"]["prompt_mode"] == "agentic_general"
    assert row_overrides(rows["paravt-8b"], "mlvu")["channel"] == "image_url"
    assert "charades" not in row_overrides(rows["paravt-8b"], "mlvu")


def test_paper_claims_are_checked():
    import yaml
    from paravt.eval.reproduce import run_checks
    spec = yaml.safe_load(open("configs/eval/paper_table1.yaml"))
    splits = spec["splits"]
    res = {"paravt-8b": {s: {"accuracy": 0.60} for s in splits}, "qwen3-vl-8b-tool": {s: {"accuracy": 0.52} for s in splits}}
    res["paravt-8b"]["videomme_sub"] = {"accuracy": 0.694}
    got = {c["kind"]: c for c in run_checks(spec["checks"], res, splits)}
    assert got["split_value"]["status"] == "PASS"
    assert got["avg_gain"]["status"] == "PASS" and 7.0 < got["avg_gain"]["got"] < 10.0
    assert got["training_curve"]["status"] == "n.a."  # no RL log given
    res["qwen3-vl-8b-tool"] = {s: {"accuracy": 0.60} for s in splits}
    assert {c["kind"]: c for c in run_checks(spec["checks"], res, splits)}["avg_gain"]["status"] == "FAIL"


def test_overview_protocols(world):
    """release (Table 1): bare frames at qwen-vl-utils' bounds, no timestamps/header/think prefix,
    the video-path sentence; paravt: the training format."""
    from paravt.agent.episode import EpisodeSample, build_overview
    from paravt.core.toolcall import CROP_VIDEO_SCHEMA
    from paravt.eval.driver import episode_config
    from paravt.eval.splits import load_split
    s = load_split("synthetic", "", str(world / "local"))[0]
    sample = EpisodeSample(s.id, s.question, s.video, s.duration, s.answer, s.question_type)
    rel = episode_config(EvalConfig(model="m"), "mcq")
    assert (rel.overview_min_pixels, rel.overview_max_pixels, rel.think_prefix) == (100352, 602112, False)
    ov = build_overview(sample, 4, rel, None, [CROP_VIDEO_SCHEMA])
    items = ov.messages[1]["content"]
    assert [i["type"] for i in items] == ["image"] * 4 + ["text"]
    assert items[-1]["text"].endswith(f"The video path for this video is: {Path(s.video).name}")
    assert min(f.image.size[0] * f.image.size[1] for f in ov.frames) >= 100352 * 0.9
    ours = episode_config(EvalConfig(model="m", overview="paravt"), "mcq")
    assert (ours.overview_min_pixels, ours.overview_max_pixels, ours.think_prefix) == (784, 50176, True)
    items = build_overview(sample, 4, ours, None, [CROP_VIDEO_SCHEMA]).messages[1]["content"]
    assert items[0]["text"].startswith("Video: ") and items[1]["text"].endswith("seconds>")
    assert episode_config(EvalConfig(model="m", think_prefix=True), "mcq").think_prefix  # explicit wins
    with pytest.raises(ValueError, match="overview"):
        EvalConfig(model="m", overview="mine")


def test_changed_settings_refuse_to_resume(world, tiny_dir, tmp_path):
    """A rerun with another K (or checkpoint) must not relabel old answers: refused (exit 2 on
    the CLI), resume=restart starts over keeping the old file, resume=force reuses it."""
    first = Evaluator(_cfg(world, tiny_dir, tmp_path, row="r", limit=2)).run()["synthetic"]
    rc = json.loads((tmp_path / "r/image_url/synthetic.run_config.json").read_text())
    assert rc["identity"]["nframes"] == 4 and rc["identity"]["weights"] != "name:" + str(tiny_dir)
    assert first["config"]["identity"] == rc["identity"] and set(first["stderr"]) >= {"score", "format_compliance"}
    again = Evaluator(_cfg(world, tiny_dir, tmp_path, row="r", limit=2)).run()["synthetic"]  # same settings: resumes
    assert again["n"] == 2
    with pytest.raises(Exception, match="nframes differ"):
        Evaluator(_cfg(world, tiny_dir, tmp_path, row="r", limit=2, nframes=8)).run()
    r = subprocess.run([sys.executable, "-m", "paravt.eval.driver", f"model={tiny_dir}", f"out={tmp_path}", "row=r",
                        f"split_paths={{synthetic: {world}/local}}", "max_new_tokens=24", "progress=false",
                        "nframes=8", "max_turns=1", "limit=2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "nframes" in r.stderr and "Traceback" not in r.stderr
    forced = Evaluator(_cfg(world, tiny_dir, tmp_path, row="r", limit=2, nframes=8, resume="force")).run()["synthetic"]
    assert forced["n"] == 2 and forced["config"]["identity"]["nframes"] == 4  # K=4 answers, labelled K=4
    assert forced["config"]["forced_resumes"][0]["differs"] == ["nframes"]
    Evaluator(_cfg(world, tiny_dir, tmp_path, row="r", limit=2, nframes=8, resume="restart")).run()
    assert list((tmp_path / "r/image_url").glob("synthetic.jsonl.*.bak"))
    assert json.loads((tmp_path / "r/image_url/synthetic.run_config.json").read_text())["identity"]["nframes"] == 8


def test_bootstrap_stderr_is_seeded():
    from paravt.eval.driver import bootstrap_stderr
    v = [1.0, 0.0] * 50
    assert bootstrap_stderr(v) == bootstrap_stderr(v) and 0.03 < bootstrap_stderr(v) < 0.07  # ~sqrt(.25/100)
    assert bootstrap_stderr([1.0]) == 0.0


def test_answers_do_not_depend_on_samples_in_flight(world, tiny_dir, tmp_path):
    """The quickstart runs its eval with 64 samples in flight so the in-process engine fills its batches; the
    greedy episodes must be the ones of one at a time (the untrained tiny model seldom calls a tool, so the
    batching itself is checked on mixed prompts in tests/engines/test_hf_engine.py)."""
    def run(c):
        cfg = _cfg(world, tiny_dir, tmp_path / f"c{c}", row="r", concurrency=c, limit=6, max_turns=2,
                   **{"crop.mode": "subagent", "crop.subagent_temperature": 0.0, "crop.subagent_max_tokens": 16,
                      "save_trajectory": True})
        assert Evaluator(cfg).run()["synthetic"]["errors"] == 0
        rows = [json.loads(x) for x in (tmp_path / f"c{c}/r/image_url/synthetic.jsonl").read_text().splitlines()]
        return {r["id"]: (r.get("pred"), r["tool_calls"], json.dumps(r["trajectory"]["turns"])) for r in rows}

    one, many = run(1), run(8)
    assert len(one) == 6 and one == many
