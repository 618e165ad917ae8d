"""Nothing lost in silence: launches as a container's PID 1, RL that would train on nothing,
evals whose videos are missing, and bad input that must end in one line with a non-zero exit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
LINUX = sys.platform.startswith("linux")


def _unshare_works() -> bool:
    if not LINUX or shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", "echo $$"], capture_output=True,
                       text=True)
    return r.returncode == 0 and r.stdout.strip() == "1"


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert lines and "Traceback" not in stderr, stderr[-3000:]
    return lines[-1]


# --------------------------------------------------------------------------- a container's PID 1
@pytest.mark.launcher
@pytest.mark.skipif(not _unshare_works(), reason="needs Linux PID namespaces (unshare --pid --fork --mount-proc)")
@pytest.mark.parametrize("stage", ["sft", "rl"])
def test_launcher_as_pid_1_trains_with_two_ranks(stage, world, tiny_dir, tmp_path):
    """`docker run ... bash scripts/run_*.sh`: the launcher is PID 1 of its PID namespace, torchrun its
    child. The workers must not take PID 1 for a dead parent."""
    out = tmp_path / stage
    if stage == "sft":
        args = ["bash", "scripts/run_sft.sh", "configs/sft/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={out}",
                f"data.0.path={world}/local/paravt_sft_synth.parquet", "max_steps=2", "save_every=2",
                "max_length=1024", "logging.wandb_project=null", "logging.progress=false"]
    else:
        args = ["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={out}",
                f"train_data=[{world}/local/paravt_rl_synth.parquet]", "hierarchical_agent.max_new_tokens=16",
                "hierarchical_agent.crop.subagent_max_tokens=8", "grpo.prompts_per_step=2", "grpo.n_samples=2",
                "logging.wandb_project=null", "logging.progress=false", "max_steps=1", "save_every=1"]
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "env", "NPROC=2", "MAX_RESTARTS=0", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "final/config.json").is_file()


# --------------------------------------------------------------------------- RL never trains on nothing
def _rl_rows_with_broken_videos(world: Path, tmp_path: Path) -> Path:
    rows = pq.read_table(world / "local/paravt_rl_synth.parquet").to_pylist()
    media = tmp_path / "media"
    media.mkdir()
    for i, r in enumerate(rows):
        dst = media / f"{i}.mp4"
        src = Path(r["videos"][0]["video"].removeprefix("file://"))
        dst.write_bytes(src.read_bytes()[:200] if i % 2 else b"")  # truncated or zero bytes: none decodes
        r["videos"] = [{"video": "file://" + str(dst)}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rl.parquet")
    return tmp_path / "rl.parquet"


def _launch(script: str, nproc: int, *args: str) -> subprocess.CompletedProcess:
    """A stage as users start it: its launcher, torchrun with ``nproc`` ranks, the default restart policy."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAX_RESTARTS", "NPROC")}
    return subprocess.run(["bash", f"scripts/{script}", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**env, "NPROC": str(nproc)})


def _last_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert lines, stderr
    return lines[-1]


@pytest.mark.launcher
def test_rl_whose_every_rollout_fails_stops_with_one_line_and_exit_3(world, tiny_dir, tmp_path):
    """run_rl.sh, two trainer ranks: the run stops itself after rollout.max_bad_steps steps that lost
    every rollout; torchrun's restarts must not resume it into a success."""
    data = _rl_rows_with_broken_videos(world, tmp_path)
    out = tmp_path / "rl"
    r = _launch("run_rl.sh", 2, "configs/rl/tiny.yaml",
                f"model_path={tiny_dir}", f"output_dir={out}", f"train_data=[{data}]",
                "hierarchical_agent.max_new_tokens=16", "grpo.prompts_per_step=2", "grpo.n_samples=2",
                "logging.wandb_project=null", "logging.progress=false", "max_steps=10", "save_every=10",
                "rollout.max_bad_steps=2")
    assert r.returncode == 3, r.stderr[-3000:]
    line = _last_line(r.stderr)
    assert "rollouts lost work on 2 steps in a row" in line and "first error:" in line and ".mp4" in line, line
    assert "RL done" not in r.stdout and not (out / "final").exists()
    rec = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in rec] == [1]  # one bad step logged, the second stopped the run
    assert rec[0]["ppo/optimizer_skipped"] == 1.0 and rec[0]["rollout/skipped_fraction"] == 1.0
    # a resumable checkpoint at the last step reached, holding the weights it started from
    assert (out / "checkpoints/step_000001/COMPLETE").exists()
    from safetensors.torch import load_file
    a = load_file(next((out / "checkpoints/step_000001/hf").glob("*.safetensors")))
    b = load_file(next(Path(tiny_dir).glob("*.safetensors")))
    assert all((a[k] == b[k]).all() for k in b)  # no optimizer step was taken on an empty batch


@pytest.mark.launcher
def test_a_short_rl_run_that_lost_every_prompt_does_not_end_as_a_success(world, tiny_dir, tmp_path):
    """run_rl.sh, one rank, 2 steps, every video unreadable, rollout.max_bad_steps at its default (3):
    the abort never fires, yet the run must not write final/ and exit 0 with "RL done" (neither by
    itself nor by torchrun restarting it from its step-2 checkpoint)."""
    data = _rl_rows_with_broken_videos(world, tmp_path)
    out = tmp_path / "rl_short"
    r = _launch("run_rl.sh", 1, "configs/rl/tiny.yaml",
                f"model_path={tiny_dir}", f"output_dir={out}", f"train_data=[{data}]",
                "hierarchical_agent.max_new_tokens=16", "grpo.prompts_per_step=2", "grpo.n_samples=2",
                "logging.wandb_project=null", "logging.progress=false", "max_steps=2", "save_every=2")
    assert r.returncode == 3, r.stderr[-3000:]
    line = _last_line(r.stderr)
    assert "ended with its last 2 step(s) losing work" in line and ".mp4" in line and "checkpoint" in line, line
    assert "RL done" not in r.stdout and not (out / "final").exists()
    assert (out / "checkpoints/step_000002/COMPLETE").exists()


# --------------------------------------------------------------------------- eval: missing videos are lost work
def _eval_args(tiny_dir, local, out, *extra):
    return [sys.executable, "-m", "paravt.eval.driver", f"model={tiny_dir}", f"out={out}",
            f"split_paths={{synthetic: {local}}}", "max_new_tokens=8", "progress=false", "limit=4", "nframes=4",
            "prompt_mode=direct", *extra]


def test_eval_with_missing_videos_fails_and_retries_them_when_they_arrive(world, tiny_dir, tmp_path):
    local = tmp_path / "local"
    shutil.copytree(world / "local", local)
    rows = pq.read_table(local / "paravt_eval_synth.parquet").to_pylist()[:4]
    moved = {}
    for r in rows[:2]:  # two of the four videos are gone (a partial download)
        v = Path(r["videos"][0]["video"].removeprefix("file://"))
        dst = tmp_path / "later" / v.name
        dst.parent.mkdir(exist_ok=True)
        dst.write_bytes(v.read_bytes())
        r["videos"] = [{"video": "file://" + str(v.with_name("later_" + v.name))}]
        moved[v.with_name("later_" + v.name)] = dst
    pq.write_table(pa.Table.from_pylist(rows), local / "paravt_eval_synth.parquet")
    r = subprocess.run(_eval_args(tiny_dir, local, tmp_path / "o"), cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1 and "2 of 4 samples lost (2 without their video" in r.stderr, r.stderr[-2000:]
    s = json.loads((tmp_path / "o/model/image_url/synthetic.json").read_text())
    assert s["lost"] == 2 and s["evaluated"] == 2 and s["n"] == 4
    assert s["score"] == pytest.approx(s["score_ran"] / 2)  # lost samples count as wrong over every sample
    # the videos arrive: the rerun evaluates exactly the two missing samples and succeeds
    for want, have in moved.items():
        shutil.copy(have, want)
    r = subprocess.run(_eval_args(tiny_dir, local, tmp_path / "o"), cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "retrying 2 sample(s)" in r.stdout
    lines = (tmp_path / "o/model/image_url/synthetic.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]  # every line parses: no stale record, no torn line
    assert len(recs) == 4 and not any(x.get("missing_video") for x in recs)


def test_eval_whose_every_video_is_missing_exits_non_zero(world, tiny_dir, tmp_path):
    local = tmp_path / "local"
    shutil.copytree(world / "local", local)
    t = pq.read_table(local / "paravt_eval_synth.parquet").to_pylist()
    for r in t:
        r["videos"] = [{"video": "file:///nonexistent/gone.mp4"}]
    pq.write_table(pa.Table.from_pylist(t), local / "paravt_eval_synth.parquet")
    r = subprocess.run(_eval_args(tiny_dir, local, tmp_path / "o"), cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1 and "4 of 4 samples lost" in _one_line(r.stderr) and "gone.mp4" in r.stderr


# --------------------------------------------------------------------------- bad input: one line, non-zero
def _write_eval_parquet(local: Path, world: Path, edit) -> None:
    shutil.copytree(world / "local", local)
    t = pq.read_table(local / "paravt_eval_synth.parquet").to_pylist()
    out = edit(t)
    if isinstance(out, bytes):
        (local / "paravt_eval_synth.parquet").write_bytes(out)
    else:
        pq.write_table(pa.Table.from_pylist(out), local / "paravt_eval_synth.parquet")


@pytest.mark.parametrize("case,fragment", [
    ("not_parquet", "not a readable parquet"),
    ("no_extra_info", "missing column"),
    ("answers_null", "no usable rows"),
])
def test_eval_unreadable_split_is_one_line(case, fragment, world, tiny_dir, tmp_path):
    edits = {"not_parquet": lambda t: b"PAR1 but not really",
             "no_extra_info": lambda t: [{k: v for k, v in r.items() if k != "extra_info"} for r in t],
             "answers_null": lambda t: [{**r, "extra_info": json.dumps({**json.loads(r["extra_info"]), "answer": None})
                                         if isinstance(r["extra_info"], str) else {**r["extra_info"], "answer": None}}
                                        for r in t]}
    _write_eval_parquet(tmp_path / "local", world, edits[case])
    r = subprocess.run(_eval_args(tiny_dir, tmp_path / "local", tmp_path / "o"), cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 1 and fragment in _one_line(r.stderr) and "paravt_eval_synth.parquet" in r.stderr, r.stderr


def test_eval_tvg_rows_that_are_not_spans_are_dropped_and_counted(world, tiny_dir, tmp_path):
    def edit(t):
        for r in t:
            e = json.loads(r["extra_info"]) if isinstance(r["extra_info"], str) else dict(r["extra_info"])
            if e.get("question_type") == "tvg":
                e["answer"] = "sometime in the middle"
            r["extra_info"] = json.dumps(e)
        return t
    _write_eval_parquet(tmp_path / "local", world, edit)
    r = subprocess.run(_eval_args(tiny_dir, tmp_path / "local", tmp_path / "o", "limit=null"), cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "tvg answer is not a span" in r.stdout + r.stderr and "Traceback" not in r.stderr


def test_eval_missing_model_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "paravt.eval.driver", f"model={tmp_path / 'no_model'}",
                        f"out={tmp_path / 'o'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "model: no such directory" in _one_line(r.stderr)


@pytest.mark.launcher
@pytest.mark.parametrize("case,fragment", [
    ("model", "model_path: no such directory"),
    ("resume", "resume: no such checkpoint directory"),
    ("output_file", "exists and is a file"),
    ("shard", "required shard(s) match no file"),
])
@pytest.mark.parametrize("nproc", ["1", "2"])  # 1: the trainer alone checks (no torchrun); 2: the preflight
def test_sft_bad_paths_are_one_line_before_torchrun(case, fragment, nproc, world, tiny_dir, tmp_path):
    (tmp_path / "afile").write_text("x")
    over = {"model": [f"model_path={tmp_path / 'nope'}"], "resume": [f"resume={tmp_path / 'ckpt'}"],
            "output_file": [f"output_dir={tmp_path / 'afile'}"],
            "shard": [f"data.0.path={tmp_path / 'missing.parquet'}"]}[case]
    args = ["bash", "scripts/run_sft.sh", "configs/sft/tiny.yaml", f"model_path={tiny_dir}", f"output_dir={tmp_path / 'o'}",
            f"data.0.path={world}/local/paravt_sft_synth.parquet", "max_steps=1", "logging.wandb_project=null"] + over
    r = subprocess.run(args, cwd=ROOT, env={**os.environ, "NPROC": nproc}, capture_output=True, text=True, timeout=300)
    line = _one_line(r.stderr)
    assert r.returncode == 2 and fragment in line and line.startswith("run_sft.sh: "), r.stderr[-2000:]
    assert "torchrun" not in r.stderr and not (tmp_path / "o" / "final").exists()


@pytest.mark.launcher
def test_sft_whose_every_video_is_truncated_is_one_line(world, tiny_dir, tmp_path):
    """run_sft.sh, two ranks: no usable row is exit 2 with the reason as the launcher's last line."""
    rows = pq.read_table(world / "local/paravt_sft_synth.parquet").to_pylist()
    media = tmp_path / "media"
    media.mkdir()
    for i, r in enumerate(rows):
        vids = []
        for j, v in enumerate(r["videos"] or []):
            dst = media / f"{i}_{j}.mp4"
            dst.write_bytes(Path(v["video"].removeprefix("file://")).read_bytes()[:300])
            vids.append({**v, "video": "file://" + str(dst)})
            r["messages"] = r["messages"].replace(v["video"], "file://" + str(dst))  # the row names it twice
        r["videos"] = vids
    rows = [r for r in rows if r["videos"]]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "sft.parquet")
    r = _launch("run_sft.sh", 2, "configs/sft/tiny.yaml", f"model_path={tiny_dir}",
                f"output_dir={tmp_path / 'o'}", f"data.0.path={tmp_path / 'sft.parquet'}", "max_steps=1",
                "logging.wandb_project=null", "logging.progress=false")
    line = _last_line(r.stderr)
    assert r.returncode == 2 and "no usable SFT rows" in line and "first:" in line and ".mp4" in line, r.stderr[-2000:]


def test_rl_rows_with_a_string_duration_or_a_non_span_tvg_answer_are_dropped_at_load(tmp_path):
    from paravt.data.schema import load_rl_rows
    base = {"prompt": json.dumps([{"role": "user", "content": "<video>\nWhen?"}]),
            "videos": [{"video": "file:///nonexistent/v.mp4"}]}
    rows = [{**base, "extra_info": json.dumps({"answer": [1.0, 2.0], "question_type": "tvg", "duration": 60.0})},
            {**base, "extra_info": json.dumps({"answer": "red", "question_type": "oe", "duration": "60 s"})},
            {**base, "extra_info": json.dumps({"answer": "in the middle", "question_type": "tvg"})},
            {**base, "extra_info": json.dumps({"answer": "12.5 - 20 seconds", "question_type": "tvg"})}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rl.parquet")
    got, rep = load_rl_rows([tmp_path / "rl.parquet"], check_media=False)
    assert len(got) == 2 and rep.skipped == {"duration is not a number": 1, "tvg answer is not a span": 1}


def test_materialize_a_parquet_that_is_not_one_is_one_line(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "pq").mkdir()
    (tmp_path / "pq/paravt_x.parquet").write_text("not a parquet")
    r = subprocess.run([sys.executable, "-m", "paravt.data.materialize", "--root", str(tmp_path / "root"),
                        "--parquet-dir", str(tmp_path / "pq"), "--output-dir", str(tmp_path / "out")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "paravt_x.parquet: not a readable parquet" in _one_line(r.stderr)


def test_a_runaway_number_in_a_call_block_is_named_to_the_model():
    from paravt.core import prompts
    from paravt.core.toolcall import ToolCallParser
    from paravt.data.tool_specs import CROP_VIDEO_SYNTAX
    parse_tool_calls = ToolCallParser([CROP_VIDEO_SYNTAX]).parse
    r = parse_tool_calls("<video_zoom>" + "9" * 16000 + "</video_zoom>")
    (err,) = r.errors
    text = prompts.parse_error_text(err)
    assert "a number of 16000 digits" in text and "crop_video failed" not in text and len(text) < 300
