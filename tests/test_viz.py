"""The trajectory viewer: real eval/RL JSONL in, one self-contained HTML page out; the slow test
renders it in a real headless Chromium (Debian package) and checks the page."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from paravt.viz import episode_from_record, load_episodes, render_html


@pytest.fixture(scope="module")
def eval_jsonl(world, tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("viz_eval")
    r = subprocess.run([sys.executable, "-m", "paravt.eval.driver", f"model={tiny_dir}", f"out={out}", "row=t",
                        f"split_paths={{synthetic: {world}/local}}", "max_new_tokens=24", "progress=false", "limit=3",
                        "nframes=4", "max_turns=1", "save_trajectory=true", "trajectory_thumbnails=32",
                        "overview=paravt"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return out / "t/image_url/synthetic.jsonl"


def test_eval_records_become_episodes_with_thumbnails(eval_jsonl, tmp_path):
    eps, skipped = load_episodes([eval_jsonl])
    assert len(eps) == 3 and skipped == 0
    ep = eps[0]
    assert ep["k"] == 4 and len(ep["overview"]) == 4 and ep["overview"][0]["jpeg"].startswith("data:image/jpeg;base64,")
    assert ep["question"] and ep["span"] and len(ep["span"]) == 2 and ep["qtype"] in ("mcq", "oe", "tvg")
    assert [f["t"] for f in ep["overview"]] == sorted(f["t"] for f in ep["overview"])
    (tmp_path / "no_traj.jsonl").write_text(json.dumps({"id": "x", "score": 1.0}) + "\nnot json\n")
    eps2, skipped2 = load_episodes([eval_jsonl, tmp_path / "no_traj.jsonl"])
    assert len(eps2) == 3 and skipped2 == 2
    out = tmp_path / "v.html"
    r = subprocess.run([sys.executable, "-m", "paravt.viz", str(eval_jsonl), "-o", str(out)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "3 episodes" in r.stdout
    html = out.read_text()
    assert html.count('"overview"') == 3 and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    r = subprocess.run([sys.executable, "-m", "paravt.viz", str(tmp_path / "nope.jsonl"), "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "nope.jsonl" in r.stderr


def test_rl_record_and_escaping():
    rec = {"sample_id": "q1", "k": 8, "end_reason": "answer", "error": None, "duration": 60.0, "step": 3,
           "question": "What happens </script><img src=x onerror=alert(1)>?", "question_type": "mcq", "answer": "B",
           "span": [10.0, 12.0], "reward": {"total": 1.5, "acc": 1.0, "format": 0.4, "tool": 0.1}, "score": 1.0,
           "turns": [{"index": 0, "text": "<think>\nlook\n</think>\n<tool_call>...", "finish_reason": "stop",
                      "parse_errors": [], "dropped_calls": 0,
                      "calls": [{"name": "crop_video", "arguments": {}, "ok": True, "window": [8.0, 14.0],
                                 "error": None, "clamped": False, "response": "a red circle at 11 s"},
                                {"name": "crop_video", "arguments": {}, "ok": False, "window": None,
                                 "error": "start >= end", "clamped": False, "response": ""}]}]}
    ep = episode_from_record(rec)
    assert ep["correct"] and ep["step"] == 3 and len(ep["turns"][0]["calls"]) == 2
    html = render_html([ep])
    assert "</script><img" not in html  # the payload cannot close the data block
    assert json.loads(html.split('id="data">')[1].split("</script>")[0].replace("<\\/", "</"))[0]["id"] == "q1"


@pytest.mark.slow
def test_viewer_renders_in_headless_chromium(eval_jsonl, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("PARAVT_REQUIRE_CHROMIUM") == "1":
            pytest.fail("chromium not installed (CI installs the Debian package)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    page = tmp_path / "v.html"
    subprocess.run([sys.executable, "-m", "paravt.viz", str(eval_jsonl), "-o", str(page)], check=True)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--enable-logging=stderr",
             "--v=0", "--virtual-time-budget=5000"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0
    assert dom.stdout.count('class="ep"') == 3  # the script ran and drew every episode
    assert dom.stdout.count('class="crop"') >= 0 and "3 of 3 episodes" in dom.stdout
    assert "Uncaught" not in dom.stderr and "SyntaxError" not in dom.stderr  # no console errors
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, *flags, f"--screenshot={shot}", "--window-size=1000,800", page.as_uri()],
                   capture_output=True, timeout=120)
    from PIL import Image
    im = Image.open(shot).convert("RGB")
    assert im.size == (1000, 800) and len(set(im.getdata())) > 50  # a rendered page, not a blank one
