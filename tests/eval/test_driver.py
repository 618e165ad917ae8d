import json
import signal
import subprocess
import sys
import time

import pytest

from paravt.core.config import load_config
from paravt.eval.config import EvalConfig, episode_config
from paravt.eval.driver import Evaluator
from paravt.eval.identity import IDENTITY_EXCLUDED, run_identity
from paravt.eval.sample import BenchmarkItem
from paravt.eval.summary import lost_work, score, summarize


def test_scoring_edge_cases():
    m = BenchmarkItem("1", "s", "v", "q", "B")
    assert score(m, "<think>\nhm\n</think>\n<answer>(B) blue</answer>")["correct"] == 1.0
    assert score(m, "<think>\nhm\n</think>\nThe answer is B")["correct"] == 1.0  # text after </think>
    assert score(m, "<think>\nunsure")["correct"] == 0.0
    t = BenchmarkItem("2", "s", "v", "q", [10.0, 20.0], "tvg")
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


@pytest.mark.parametrize("override, message", [
    ("server.launch=tgi", "server.launch must be one of none | sglang | vllm, got 'tgi'"),
    ("backend=vllm", "backend must be one of hf | openai, got 'vllm'"),
    ("channel=audio", "channel must be one of image_url | video_url, got 'audio'"),
    ("overview=full", "overview must be one of release | paravt, got 'full'"),
    ("resume=maybe", "resume must be one of auto | restart | force | never, got 'maybe'"),
])
def test_a_bad_choice_is_one_line_naming_the_options(override, message):
    with pytest.raises(ValueError) as e:
        load_config(EvalConfig, None, ["model=m", override])
    assert str(e.value) == message


def test_penalties_reach_the_episode_and_the_resume_identity(tiny_dir):

    off, on = EvalConfig(model=str(tiny_dir)), EvalConfig(model=str(tiny_dir), frequency_penalty=0.5, presence_penalty=0.1)
    assert run_identity(off, "synthetic") != run_identity(on, "synthetic")
    assert (run_identity(on, "synthetic")["frequency_penalty"], run_identity(on, "synthetic")["presence_penalty"]) == (0.5, 0.1)
    ep = episode_config(on, "mcq")
    assert (ep.frequency_penalty, ep.presence_penalty) == (0.5, 0.1)


def test_resume_identity_is_derived_from_the_config(tiny_dir):
    """Every field that changes answers is in it (a new setting too, with nothing to edit); the listed
    run-only fields are not."""
    import dataclasses


    base = EvalConfig(model=str(tiny_dir))
    ident = run_identity(base, "synthetic")
    changed = {"crop": dataclasses.replace(base.crop, fps=2.0),
               "nframes": 16, "temperature": 0.3, "overview_max_pixels": 1000, "max_turns": 1, "dtype": "bfloat16"}
    for k, v in changed.items():
        assert run_identity(dataclasses.replace(base, **{k: v}), "synthetic") != ident, k
    same = {"concurrency": 3, "progress": False, "limit": 7, "out": "/elsewhere", "row": "r", "retries": 0,
            "save_trajectory": True, "max_error_fraction": 0.5}
    for k, v in same.items():
        assert k in IDENTITY_EXCLUDED and run_identity(dataclasses.replace(base, **{k: v}), "synthetic") == ident, k
    assert "crop.decoder" in ident and "crop.fps" in ident  # the decoder is part of it: no run mixes decoders
    # a field the identity has never heard of is in it as soon as it exists
    @dataclasses.dataclass
    class Newer(EvalConfig):
        new_knob: int = 0
    a, b = Newer(model=str(tiny_dir)), Newer(model=str(tiny_dir), new_knob=1)
    assert run_identity(a, "synthetic")["new_knob"] == 0 and run_identity(a, "synthetic") != run_identity(b, "synthetic")


def test_server_settings_become_one_launch_config_per_replica(tmp_path):
    """server.* is turned into the engine factory's launch config in one place: replica i gets port
    base_port + i and GPUs [i*g, (i+1)*g) in tensor parallel; the launch command carries the settings."""
    from paravt.engines import sglang, vllm
    from paravt.eval.config import ServerConfig

    sv = ServerConfig(launch="vllm", base_port=31000, gpus_per_replica=2, dtype="float32", enforce_eager=True,
                      kv_cache_gb=4, extra_args=["--max-model-len", "8192"])
    c = sv.launch_config(1, "sft", tmp_path)
    assert (c.port, c.gpus, c.tp_size, c.served_model_name, c.log_file) == (31001, [2, 3], 2, "sft", str(tmp_path / "vllm_1.log"))
    c.model_path = "/ckpt"
    argv, env = vllm.launch_command(c)
    assert "--enforce-eager" in argv and "--max-model-len" in argv and argv[argv.index("--dtype") + 1] == "float32"
    assert env.get("VLLM_CPU_KVCACHE_SPACE") == "4"
    sg = ServerConfig(launch="sglang", model_name="paravt-8b", deterministic=True).launch_config(0, "row", tmp_path, 16)
    sg.model_path = "/ckpt"
    argv, _ = sglang.launch_command(sg)
    assert sg.video_nframes == 16 and "--enable-deterministic-inference" in argv and "paravt-8b" in argv
    with pytest.raises(ValueError, match="no server to launch"):
        ServerConfig().launch_config(0, "row", tmp_path)


def test_sampled_eval_draws_each_question_several_times_from_its_own_seed(world, tiny_dir, tmp_path):
    """samples_per_question=3 at T = 1: three records per question (ids QID#s0..2), the run's seed
    reproduces every completion exactly, another seed draws others; the summary splits the score by
    whether the episode called a tool."""
    def run(out, seed):
        cfg = _cfg(world, tiny_dir, out, temperature=1.0, samples_per_question=3, sample_seed=seed, limit=2,
                   save_trajectory=True, row="s")
        res = Evaluator(cfg).run()["synthetic"]
        recs = [json.loads(x) for x in (out / "s/image_url/synthetic.jsonl").read_text().splitlines()]
        return res, {r["id"]: json.dumps(r["trajectory"]["turns"]) for r in recs}

    res, a = run(tmp_path / "a", 7)
    _, again = run(tmp_path / "b", 7)
    _, other = run(tmp_path / "c", 8)
    assert res["n"] == 6 and res["questions"] == 2 and res["errors"] == 0
    assert sorted(k.rpartition("#s")[2] for k in a) == ["0", "0", "1", "1", "2", "2"]
    assert a == again
    assert a != other
    assert len(set(a.values())) > 2  # the draws of a question differ
    assert res["calling"]["n"] + res["skipping"]["n"] == 6


def test_sampled_eval_needs_a_temperature(world, tiny_dir, tmp_path):
    with pytest.raises(ValueError, match="needs temperature > 0"):
        _cfg(world, tiny_dir, tmp_path, samples_per_question=2)


def test_a_finished_split_starts_no_engine_and_a_symlinked_checkpoint_resumes(world, tiny_dir, tmp_path, monkeypatch):
    """Resuming reuses finished samples without loading the model (on a GPU node: without launching a
    server); the same checkpoint reached through a symlink is the same run."""
    import paravt.eval.driver as drv

    built = []
    real = drv.build_engine
    monkeypatch.setattr(drv, "build_engine", lambda *a, **k: built.append(a) or real(*a, **k))
    first = Evaluator(_cfg(world, tiny_dir, tmp_path, row="r", prompt_mode="direct")).run()["synthetic"]
    assert first["evaluated"] == 4 and len(built) == 1
    link = tmp_path / "link_to_ckpt"
    link.symlink_to(tiny_dir, target_is_directory=True)
    again = Evaluator(_cfg(world, link, tmp_path, row="r", prompt_mode="direct")).run()["synthetic"]
    assert len(built) == 1, "a finished split loaded the model"
    assert again["score"] == first["score"] and not list((tmp_path / "r/image_url").glob("*.bak"))
    # cells sharing engines (reproduce_paper's rows): the first has nothing left, the second starts them
    # through the first, so the first's stop_engines still stops what was started
    owner = Evaluator(_cfg(world, tiny_dir, tmp_path, row="r", prompt_mode="direct"))
    owner.run(keep_engines=True)
    adopter = Evaluator(_cfg(world, tiny_dir, tmp_path, row="r2", prompt_mode="direct"))
    adopter.adopt(owner)
    assert adopter.run(keep_engines=True)["synthetic"]["evaluated"] == 4
    assert len(built) == 2 and owner.handles and owner.handles is adopter.handles
    owner.stop_engines()
    assert owner.handles == []
