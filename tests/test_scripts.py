import subprocess
import sys


def test_inference_demo_prints_the_episode(world, tiny_dir):
    video = next((world / "media/selfqa").glob("eval_*.mp4"))
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
