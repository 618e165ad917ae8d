import subprocess
import sys


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
    r = subprocess.run([sys.executable, "-m", "paravt.eval.probe", "--model", str(tiny_dir), "--world", str(world),
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
