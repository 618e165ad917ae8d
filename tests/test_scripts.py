import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_inference_demo_prints_the_episode(world, tiny_dir):
    video = next((world / "media/selfqa").glob("clip_*.mp4"))
    r = subprocess.run([sys.executable, "scripts/inference.py", "--model", str(tiny_dir), "--video", str(video),
                        "--question", "What colour is the circle?", "--nframes", "4", "--max-new-tokens", "24",
                        "--max-turns", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "--- turn 1" in out and "answer:" in out and "timings:" in out and "overview K = 4" in out


def test_reward_cli_help_and_setup_script_usage():
    r = subprocess.run([sys.executable, "-m", "paravt.rl.rewards", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--recipe" in r.stdout
    r = subprocess.run(["bash", "scripts/setup_env.sh", "gpu-please"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr


def test_perception_probe_reports_every_window(world, tiny_dir, tmp_path):
    import json

    out = tmp_path / "probe.json"
    r = subprocess.run([sys.executable, "-m", "paravt.analysis.probe", "--model", str(tiny_dir), "--world", str(world),
                        "--limit", "3", "--max-tokens", "16", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert set(res["windows"]) == {"event", "short", "empty"} and res["windows"]["event"]["n"] == 3
    for w in res["windows"].values():
        assert all(0.0 <= w[k] <= 1.0 for k in ("colour_acc", "colour_shape_acc", "says_empty", "times_inside_window"))
    import math

    assert set(res["features"]) == {"image_embedding_norm", "text_embedding_norm", "image_feature_spread",
                                    "mean_abs_dlogit_pixels_zeroed"}
    assert all(math.isfinite(v) and v > 0 for v in res["features"].values())
    rd = res["reading"]  # text-only lookup tasks on fresh videos: a random-init model does not read them
    assert rd["n"] == 3 and len(rd["examples"]) == 3 and rd["exact"] == 0.0
    assert all(ex["expected"].startswith("The question asks") for ex in rd["examples"])
    cp = res["copying"]  # the random-init tiny model has no induction circuit
    assert cp["n"] == 40 and cp["tokens"] > 300 and abs(cp["repeat_gain"]) < 0.1


def test_setup_env_pip_retries_a_dropped_download(tmp_path):
    """setup_env.sh's pip wrapper: a failed install is tried again, its log shown; a lasting failure exits 1."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls"
    # A pip that fails like a dropped connection until its third call.
    (venv / "bin/pip").write_text(
        "#!/usr/bin/env bash\n"
        f'echo x >> {calls}; n=$(wc -l < {calls})\n'
        'if (( n < 3 )); then echo "ReadTimeoutError: read timed out (call $n)"; exit 1; fi\n'
        'echo "Successfully installed torch-2.13.0"\n')
    (venv / "bin/pip").chmod(0o755)
    # Under the options setup_env.sh itself runs with: a failing pipeline must not end the script unseen.
    script = ('set -euo pipefail; source <(sed -n "/^pipq()/,/^}/p" scripts/setup_env.sh); '
              'pipq "$1" torch==2.13.0; echo done')
    env = {"PATH": "/usr/bin:/bin", "PIPQ_RETRY_SLEEP": "0"}
    r = subprocess.run(["bash", "-c", script, "_", str(venv)], capture_output=True, text=True,
                       env={**env, "PIPQ_ATTEMPTS": "3"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "attempt 1 of 3" in r.stdout and "attempt 2 of 3" in r.stdout and "(call 2)" in r.stdout
    assert "[pip] Successfully installed torch-2.13.0" in r.stdout and r.stdout.rstrip().endswith("done")
    calls.unlink()
    r = subprocess.run(["bash", "-c", script, "_", str(venv)], capture_output=True, text=True,
                       env={**env, "PIPQ_ATTEMPTS": "2"})
    assert r.returncode == 1 and "done" not in r.stdout
    assert "failed 2 times" in r.stderr and "ReadTimeoutError" in r.stdout


def test_setup_env_names_a_disk_too_small_for_the_venv(tmp_path):
    """Short of disk, a venv build stops before pip starts, with one line naming the need and what is free."""
    script = ('set -euo pipefail; source <(sed -n "/^enough_disk()/,/^}/p" scripts/setup_env.sh); '
              'ROOT="$1"; enough_disk vllm; echo checked')
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)}
    r = subprocess.run(["bash", "-c", script, "_", str(tmp_path)], capture_output=True, text=True,
                       env={**env, "PARAVT_MIN_FREE_GB": "1000000"})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and "checked" not in r.stdout and len(lines) == 1, (r.stdout, r.stderr)
    assert ".venv-vllm needs about 1000000 GB free" in lines[0] and str(tmp_path) in lines[0]
    r = subprocess.run(["bash", "-c", script, "_", str(tmp_path)], capture_output=True, text=True,
                       env={**env, "PARAVT_MIN_FREE_GB": "0"})
    assert r.returncode == 0 and r.stdout.strip() == "checked", (r.stdout, r.stderr)


@pytest.mark.launcher
def test_a_gpu_recipe_without_cuda_is_one_line_and_exit_2():
    """No silent CPU fallback: the 8B recipes on a torch without CUDA name what is missing."""
    import torch
    if torch.cuda.is_available():
        import pytest
        pytest.skip("this machine has CUDA")
    for script, recipe, stage in (("run_sft.sh", "configs/sft/qwen3vl_8b.yaml", "sft"),
                                  ("run_rl.sh", "configs/rl/paragrpo_8b.yaml", "rl")):
        r = subprocess.run(["bash", f"scripts/{script}", recipe], capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, (script, r.stderr[-2000:])
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "needs CUDA" in lines[0] and f"setup_env.sh {stage}" in lines[0], lines


@pytest.mark.launcher
def test_more_trainer_ranks_than_samples_stop_before_torchrun(world, tiny_dir, tmp_path):
    """Any world size up to the step's samples trains (uneven splits allowed); more ranks than samples is one
    line before torchrun."""
    r = subprocess.run(["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml", f"model_path={tiny_dir}",
                        f"train_data=[{world}/local/paravt_rl_synth.parquet]", f"output_dir={tmp_path / 'rl'}",
                        "grpo.prompts_per_step=1", "grpo.n_samples=2"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "NPROC": "3"})
    assert r.returncode == 2, r.stderr[-2000:]
    line = [ln for ln in r.stderr.splitlines() if ln.strip()][-1]
    assert "= 2 samples a step cannot keep 3 trainer ranks busy" in line and "prompts_per_step to 2" in line, line
    assert not (tmp_path / "rl").exists()  # torchrun never started


def test_server_gpus_are_the_jobs_logical_gpus(monkeypatch):
    """A scheduler that gave the job GPUs 4-7: the recipe's gpus=[3] is physical GPU 7."""
    import pytest

    from paravt.engines.sglang import SGLangServerConfig, launch_command, physical_gpus
    from paravt.engines.vllm import VLLMServerConfig
    from paravt.engines.vllm import launch_command as vllm_launch

    monkeypatch.setenv("PARAVT_VISIBLE_DEVICES", "4,5,6,7")
    assert launch_command(SGLangServerConfig(model_path="m", gpus=[3]))[1]["CUDA_VISIBLE_DEVICES"] == "7"
    assert vllm_launch(VLLMServerConfig(model_path="m", gpus=[2, 3], tp_size=2))[1]["CUDA_VISIBLE_DEVICES"] == "6,7"
    with pytest.raises(ValueError, match="not among the 4"):
        physical_gpus([4])
    monkeypatch.setenv("PARAVT_VISIBLE_DEVICES", "")
    assert physical_gpus([0, 7]) == "0,7"


def test_a_cpu_vllm_server_runs_its_worker_in_the_engine_core_only_when_asked():
    """cpu_worker_process=false: vLLM's uni executor (the worker inside the engine core, as on one GPU), which the
    CPU build allows only with VLLM_ENABLE_V1_MULTIPROCESSING=0; the default and any GPU server keep vLLM's own."""
    import pytest

    from paravt.engines.vllm import VLLMServerConfig
    from paravt.engines.vllm import launch_command as vllm_launch

    argv, env = vllm_launch(VLLMServerConfig(model_path="m", cpu_worker_process=False))
    assert argv[argv.index("--distributed-executor-backend") + 1] == "uni"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    for cfg in (VLLMServerConfig(model_path="m"), VLLMServerConfig(model_path="m", gpus=[0], cpu_worker_process=False)):
        argv, env = vllm_launch(cfg)
        assert "--distributed-executor-backend" not in argv and "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
    with pytest.raises(ValueError, match="tp_size must be 1"):
        VLLMServerConfig(model_path="m", tp_size=2, cpu_worker_process=False)


def test_gpu_tests_fail_rather_than_skip_without_cuda():
    import torch
    if torch.cuda.is_available():
        import pytest
        pytest.skip("this machine has CUDA")
    r = subprocess.run(["bash", "scripts/test.sh", "--gpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "test.sh --gpu:" in r.stderr and "setup_env.sh rl" in r.stderr, r.stderr[-1000:]


def test_the_gpu_split_of_run_rl():
    """Node 0 gives the rollout GPU to the servers, the other nodes train on all of theirs; the
    scheduler's CUDA_VISIBLE_DEVICES maps logical to physical ids; the trainer world of the run."""
    from paravt.rl.launch import trainer_gpus, world_size

    assert trainer_gpus(8, [7], [], node_rank=0) == [str(i) for i in range(7)]
    assert trainer_gpus(8, [7], [], node_rank=1) == [str(i) for i in range(8)]
    assert trainer_gpus(4, [3], ["4", "5", "6", "7"], node_rank=0) == ["4", "5", "6"]
    assert world_size(8, [7], nnodes=1, nproc=None) == 7
    assert world_size(8, [7], nnodes=2, nproc=None) == 15
    assert world_size(8, [6, 7], nnodes=1, nproc=None) == 6
    assert world_size(8, [7], nnodes=2, nproc=4) == 8
    r = subprocess.run([sys.executable, "-m", "paravt.rl.launch", "8", "7"], capture_output=True, text=True,
                       env={**os.environ, "NNODES": "2", "NODE_RANK": "1", "PARAVT_VISIBLE_DEVICES": ""})
    assert r.stdout.split() == ["0,1,2,3,4,5,6,7", "8", "15"]


def test_fragility_tiny_names_a_bad_knob_and_refuses_a_folder_made_with_other_settings(tmp_path):
    """FRAG_K and NATIVE_REASONING are checked before any work; a fragility folder made with other settings (or
    with none recorded) is never reused for a run that asks for different ones."""
    src = tmp_path / "seed_0"
    for f in ("world/local/paravt_sft_synth.parquet", "world/local/paravt_reading_episode_synth.parquet",
              "sft/final/config.json"):
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        (src / f).write_text("")

    def run(**env):
        return subprocess.run(["bash", "scripts/fragility_tiny.sh", str(src)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, **env})

    for env, msg in (({"FRAG_K": "many"}, "FRAG_K must be a frame count or 'recipe', got 'many'"),
                     ({"NATIVE_REASONING": "some"}, "NATIVE_REASONING must be keep or drop, got 'some'"),
                     ({"COLD_STEPS": "40", "COLD_SCHEDULE_STEPS": "20"},
                      "COLD_SCHEDULE_STEPS must be a step count >= COLD_STEPS (40), got '20'")):
        r = run(**env)
        assert r.returncode == 2 and r.stderr.strip() == msg, r.stderr
    frag = src / "fragility"
    frag.mkdir()
    (frag / "settings.json").write_text('{"frag_k": "recipe", "native_reasoning": "drop", "prior_steps": 300, '
                                        '"cold_steps": 150, "rl_steps": 60}\n')
    r = run()
    assert r.returncode == 2 and "was made with" in r.stderr and "set FRAG_DIR to a fresh folder" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    (frag / "settings.json").unlink()
    (frag / "native.parquet").write_text("")
    r = run()
    assert r.returncode == 2 and "settings were not recorded" in r.stderr, r.stderr


def test_quickstart_reuses_a_stage_only_if_made_with_the_same_arguments(world, tiny_dir, tmp_path):
    """A finished stage records its arguments; a rerun that would give it others stops with the lines that differ.
    A stage that is a link (a base shared between seeds) or records nothing is reused as is."""
    out = tmp_path / "qs"
    shared = tmp_path / "seed_0_tiny"  # another seed's base, linked as rl_effects_pilot.sh's SHARE_FROM does
    shared.mkdir()
    (shared / "paravt_tiny.json").write_text("{}")
    (shared / "quickstart_args.txt").write_text("--out <out>/tiny_model\n--seed 7\n")
    out.mkdir()
    (out / "tiny_model").symlink_to(shared)
    (out / "world").symlink_to(world)
    (out / "perception").mkdir()
    (out / "perception" / "final").symlink_to(tiny_dir)
    (out / "perception" / "quickstart_args.txt").write_text(
        "configs/sft/tiny_perception.yaml\nmodel_path=<out>/tiny_model\nmax_steps=999\nseed=0\n")
    r = subprocess.run(["bash", "scripts/quickstart.sh", str(out)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "QUICKSTART_SMALL": "1"})  # its perception: 10 steps
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    err = r.stderr.splitlines()
    assert f"quickstart: {out}/perception was made with other settings than this run gives it:" in err
    assert "  this run:   max_steps=10" in err and "  that stage: max_steps=999" in err
    assert "  this run:   seed=0" not in err  # the lines both share are not listed
    # before it: the tiny model (a link, its record another seed's), the world (a link) and materialize (no record)
    assert r.stdout.count("reusing") == 3 and not (out / "eval").exists()


@pytest.mark.launcher
def test_quickstart_side_by_side_chains_fail_loudly(world, tiny_dir, tmp_path):
    """QUICKSTART_JOBS=2 runs two chains side by side (an RL arm, then eval cells): a chain that fails stops
    the quickstart with its exit code before any eval, and stops the other chain at once, nothing of it left
    running."""
    import json
    import shutil
    import time

    out = tmp_path / "qs"
    out.mkdir()
    # every stage before RL finished (reused): the tiny model, the world, perception and one SFT phase
    (out / "world").symlink_to(world)
    assert (world / "world_stats.json").exists() and (world / "local/materialize_report.json").exists()
    shutil.copytree(tiny_dir, out / "tiny_model")
    (out / "tiny_model/paravt_tiny.json").write_text("{}")
    for stage in ("perception", "sft"):
        (out / stage).mkdir()
        (out / stage / "final").symlink_to(tiny_dir)
    for probe in ("probe_perception.json", "probe_sft.json"):
        (out / probe).write_text(json.dumps({}))
    # RL_STEPS=0 is refused by both arms' start-up check (max_steps >= 1)
    env = {**os.environ, "QUICKSTART_JOBS": "2", "RL_STEPS": "0", "SFT_READING": "0", "SFT_PHASES": ""}
    r = subprocess.run(["bash", "scripts/quickstart.sh", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert "side by side" in r.stdout and "failed (exit 2)" in r.stderr and "max_steps" in r.stderr
    assert not (out / "eval").exists()

    # PARA-GRPO's output_dir is a file: its arm stops at once while vanilla GRPO has 500 steps to go
    (out / "rl_paragrpo").write_text("not a directory")
    t0 = time.monotonic()
    r = subprocess.run(["bash", "scripts/quickstart.sh", str(out)], capture_output=True, text=True, timeout=600,
                       env={**env, "RL_STEPS": "500"})
    took = time.monotonic() - t0
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert "RL PARA-GRPO failed (exit 2)" in r.stderr and "the other was stopped" in r.stderr, r.stderr[-2000:]
    assert not (out / "rl_vanilla/final").exists() and not (out / "eval").exists()

    def arm_processes(arms=("rl_vanilla", "rl_paragrpo")):
        found = []
        for p in Path("/proc").glob("[0-9]*"):
            try:
                cmd = (p / "cmdline").read_bytes()
            except OSError:  # ended meanwhile
                continue
            if any(f"{out}/{arm}".encode() in cmd for arm in arms):
                found.append(cmd[:200])
        return found

    def all_end():  # the launchers, torchrun and trainers of both arms
        left = arm_processes()
        for _ in range(30):
            if not left:
                break
            time.sleep(0.5)
            left = arm_processes()
        return left

    assert not all_end(), took
    # a signal while both arms train (a container stopped, Ctrl-C) stops both trees too
    (out / "rl_paragrpo").unlink()
    p = subprocess.Popen(["bash", "scripts/quickstart.sh", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**env, "RL_STEPS": "500"})
    deadline = time.monotonic() + 300
    while not all((out / f"rl_{arm}/.paravt.lock").exists() for arm in ("vanilla", "paragrpo")):  # both trainers up
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.5)
    assert len(arm_processes()) >= 6  # per arm: run_rl.sh, torchrun, the trainer
    p.terminate()
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143 and "stopped by a signal; both chains stopped" in err, err[-2000:]
    assert not all_end()
    # a bad knob is one line
    r = subprocess.run(["bash", "scripts/quickstart.sh", str(out)], capture_output=True, text=True, timeout=600,
                       env={**env, "QUICKSTART_JOBS": "3"})
    assert r.returncode == 2 and "QUICKSTART_JOBS must be 1 or 2, got '3'" in r.stderr
