import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from paravt.core.config import load_config
from paravt.rl.config import RLConfig
from paravt.rl.trainer import PromptSchedule, RLTrainer

REQUIRED = ["reward/total", "reward/acc", "reward/format", "reward/tool", "format/compliance", "tools/call_frequency",
            "tools/calls_per_turn", "tools/failure_frequency", "frac_reward_zero_std", "completions/clipped_ratio",
            "ppo/clip_ratio", "ppo/kl", "ppo/entropy", "completions/mean_length", "rollout/logprob_gap",
            "time/rollout", "time/train", "time/sync"]


def _over(world, tiny_dir, out, **kw):
    o = [f"model_path={tiny_dir}", f"output_dir={out}", f"train_data=[{world}/local/paravt_rl_synth.parquet]",
         "hierarchical_agent.max_new_tokens=40", "hierarchical_agent.crop.subagent_max_tokens=16",
         "grpo.prompts_per_step=2", "grpo.n_samples=2", "logging.wandb_project=null", "logging.progress=false"]
    return o + [f"{k}={v}" for k, v in kw.items()]


def _alive_mentioning(text: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def _metrics(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_two_steps_in_one_process(world, tiny_dir, tmp_path):
    out = tmp_path / "rl"
    cfg = load_config(RLConfig, "configs/rl/tiny.yaml", _over(world, tiny_dir, out, max_steps=2, save_every=2))
    tr = RLTrainer(cfg)
    final = tr.train()
    rec = _metrics(out)
    assert [r["step"] for r in rec] == [1, 2]
    for k in REQUIRED:
        assert k in rec[0], k
    assert any(k.startswith("nframes/K") for k in rec[0])
    assert rec[0]["rollout/logprob_gap"] < 1e-3  # the trainer re-scores the engine's tokens to the same logprobs
    assert (final / "model.safetensors").exists() and (out / "curves.png").exists()
    trajs = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert trajs and "<" in trajs[0]["images"] and "reward" in trajs[0]
    t = trajs[0]  # what the viewer needs: thumbnails with timestamps, question, answer span
    assert len(t["overview"]) == t["k"] and t["overview"][0]["jpeg"].startswith("data:image/jpeg")
    assert t["question"] and t["span"] and t["question_type"] in ("mcq", "oe", "tvg")
    from paravt.viz import load_episodes
    eps, skipped = load_episodes([out / "trajectories.jsonl"])
    assert len(eps) == len(trajs) and not skipped


def test_any_world_size_up_to_the_samples_of_a_step():
    """7 prompts on 15 trainer ranks (two 8-GPU nodes, one rollout GPU) is fine: no divisibility; more ranks
    than a step's main-agent samples is one line naming the limit."""
    cfg = load_config(RLConfig, "configs/rl/paragrpo_8b.yaml")
    assert (cfg.grpo.prompts_per_step, cfg.grpo.n_samples) == (7, 8)
    for w in (1, 2, 3, 7, 14, 15, 56):
        cfg.check_world_size(w)
    with pytest.raises(ValueError, match=r"= 56 samples a step cannot keep 57 trainer ranks busy.*at most 56"):
        cfg.check_world_size(57)
    with pytest.raises(ValueError, match=">= 1"):
        cfg.check_world_size(0)


def test_prompt_schedule_is_seeded():
    from paravt.agent.episode import EpisodeSample
    s = [EpisodeSample(f"q{i}", "q", "v") for i in range(5)]
    a = PromptSchedule(s, 2, seed=1)
    assert [x.sample_id for i in range(5) for x in a.batch(i)] == \
           [x.sample_id for i in range(5) for x in PromptSchedule(s, 2, seed=1).batch(i)]
    from collections import Counter
    seen = Counter(x.sample_id for i in range(5) for x in a.batch(i))  # 10 positions = 2 epochs of 5
    assert set(seen.values()) == {2}


RELEASE = {"grpo.kl_mode": "reward_k1", "grpo.adv_norm_level": "token", "grpo.reward_clip": 20.0,
           "paravt.reward.rules": "release", "hierarchical_agent.prompt_source": "row",
           "hierarchical_agent.max_parallel": "null"}


@pytest.mark.launcher
def test_two_gloo_processes(world, tiny_dir, tmp_path):
    """run_rl.sh with two FSDP2 ranks over gloo and the 8B recipe's release settings: the k1 KL reward
    and the token-level advantage normalisation all-reduce across ranks; the row's own prompt."""
    out = tmp_path / "rl2"
    cmd = ["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml", *_over(world, tiny_dir, out, max_steps=2, save_every=2,
                                                                       **RELEASE)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parents[2],
                       env={**os.environ, "OMP_NUM_THREADS": "1", "NPROC": "2"})
    assert r.returncode == 0, r.stderr[-3000:]
    rec = _metrics(out)
    assert [x["step"] for x in rec] == [1, 2] and all(x["ppo/tokens"] > 0 for x in rec)
    assert all(x["ppo/kl"] == 0.0 for x in rec)  # the KL moved from the loss to the reward:
    assert rec[1]["ppo/kl_reward"] != 0.0  # after one update the policy differs from the reference
    assert (out / "checkpoints/step_000002/COMPLETE").exists()


@pytest.mark.launcher
def test_kill_and_resume(world, tiny_dir, tmp_path):
    """run_rl.sh killed (-9, its whole process group) mid-run, then the same command again."""
    out = tmp_path / "rlk"
    args = ["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml",
            *_over(world, tiny_dir, out, max_steps=4, save_every=2, **{"grpo.max_staleness": 0})]
    root = Path(__file__).resolve().parents[2]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=root, start_new_session=True,
                         env={**os.environ, "NPROC": "1"})
    deadline = time.time() + 600
    while time.time() < deadline and not (out / "checkpoints/step_000002/COMPLETE").exists():
        if p.poll() is not None:
            pytest.fail("run ended before its first checkpoint")
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)  # killed mid-run: step 3 is in flight
    p.wait()
    deadline = time.time() + 60  # the workers follow their agent (PR_SET_PDEATHSIG), the lock with them
    while time.time() < deadline and _alive_mentioning(str(out)):
        time.sleep(0.3)
    before = _metrics(out)
    assert before[-1]["step"] >= 2
    r = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=root, env={**os.environ, "NPROC": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    rec = _metrics(out)
    assert [x["step"] for x in rec] == [1, 2, 3, 4]  # same counter, each step logged once
    assert rec[0] == before[0] and rec[1] == before[1]  # the steps before the checkpoint were kept
    # data order: step 3 and 4 train on the prompts the schedule assigns them
    trajs = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    cfg = load_config(RLConfig, "configs/rl/tiny.yaml", _over(world, tiny_dir, out))
    from paravt.agent.episode import EpisodeSample
    from paravt.data.schema import load_rl_rows
    rows, _ = load_rl_rows(cfg.train_data)
    sched = PromptSchedule([EpisodeSample.from_row(r) for r in rows], 2, cfg.seed)
    for t in trajs:  # the saved episodes are a seeded sample of the step's prompts
        assert t["sample_id"] in {s.sample_id for s in sched.batch(t["step"])}
    assert {t["step"] for t in trajs} == {0, 1, 2, 3}  # rollout batch index of every step
    from collections import Counter  # a redone step replaced its records instead of doubling them
    assert set(Counter(t["step"] for t in trajs).values()) == {cfg.logging.save_trajectories}
    assert (out / "checkpoints/step_000004/COMPLETE").exists()


def test_rl_step_through_the_http_rollout_server(world, tiny_dir, tmp_path):
    """rollout.engine=hf_server: the rollout server runs in its own process and takes one
    <|image_pad|> per image as SGLang does; the trainer re-scores the ids it kept locally to the
    server's logprobs, so the server generated from exactly the trajectory's ids."""
    out = tmp_path / "rl_http"
    cfg = load_config(RLConfig, "configs/rl/tiny.yaml",
                      _over(world, tiny_dir, out, max_steps=1, save_every=1, **{"rollout.engine": "hf_server",
                                                                                  "grpo.max_staleness": 0}))
    RLTrainer(cfg).train()
    rec = _metrics(out)[0]
    assert rec["ppo/tokens"] > 0 and rec["rollout/logprob_gap"] < 1e-3
    trajs = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert trajs and all(t.get("error") is None for t in trajs)
    assert not list((out / "weights").glob("v*"))[1:]  # exports pruned to what staleness needs (1)


@pytest.mark.launcher
def test_a_rollout_server_that_does_not_start_ends_every_rank_with_one_line(world, tiny_dir, tmp_path):
    """run_rl.sh, two ranks, torchrun's default restarts: rank 0 launches the server; the other ranks
    wait for it through the group's store (as long as a server may take to start), not in a
    collective, and end with rank 0's error. The run stopped itself: exit 3, never restarted into a
    second try, the reason as the launcher's last line."""
    out = tmp_path / "rl_nostart"
    cmd = ["bash", "scripts/run_rl.sh", "configs/rl/tiny_vllm.yaml",
           *_over(world, tiny_dir, out, max_steps=2, **{"rollout.vllm.python": str(tmp_path / "no-such-python"),
                                                      "rollout.vllm.port": 0, "rollout.vllm.startup_timeout_s": 30})]
    env = {k: v for k, v in os.environ.items() if k != "MAX_RESTARTS"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[2],
                       env={**env, "OMP_NUM_THREADS": "1", "NPROC": "2"})
    assert r.returncode == 3, r.stderr[-3000:]
    last = [ln for ln in r.stderr.splitlines() if ln.strip()][-1]
    assert "the rollout engine did not start" in last and "no-such-python" in last, r.stderr[-3000:]
    assert r.stderr.count("the rollout engine did not start") <= 3  # rank 0's line, the report, the launcher's
    workers = r.stderr.split("torch/distributed/elastic")[0]  # torchrun's own failure report follows
    assert "Traceback" not in workers, workers[-3000:]
