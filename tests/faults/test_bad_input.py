"""Bad input corpus: each case is a user's or a model's mistake that must end in one clear line (or an
error tool response for model text), a known exit code, and nothing written or lost."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paravt.core.toolcall import ToolCallParser
from paravt.data.tool_specs import CROP_VIDEO_SYNTAX

parse_tool_calls = ToolCallParser([CROP_VIDEO_SYNTAX]).parse  # the default recipe's one tool

CALL = '<tool_call>\n{{"name": "crop_video", "arguments": {{"video_path": "v.mp4", "start_time": {s}, "end_time": {e}}}}}\n</tool_call>'
GOOD = CALL.format(s=1, e=5)

# --------------------------------------------------------------------------- model text -> tool calls
# (text, calls that must survive, errors expected). A bad call never drops the valid ones of the turn.
PARSER_CASES = [
    (CALL.format(s="9" * 400, e=5) + GOOD, 2, 0),  # 400-digit integer: kept as text, validation rejects it
    (CALL.format(s="NaN", e=5) + GOOD, 2, 0),
    (CALL.format(s="Infinity", e="-Infinity") + GOOD, 2, 0),
    (CALL.format(s="1e309", e=5) + GOOD, 2, 0),
    ('<tool_call>\n{"name": "crop_video", "arguments": [1, 2]}\n</tool_call>' + GOOD, 1, 1),
    ('<tool_call>\n{"name": 7}\n</tool_call>' + GOOD, 1, 1),
    ("<tool_call>\n{not json at all\n</tool_call>" + GOOD, 1, 1),
    ("<tool_call></tool_call>" + GOOD, 1, 1),
    ("<tool_call>\n" + "[" * 5000 + "\n</tool_call>" + GOOD, 1, 1),  # deep nesting
    ('<tool_call>\n{"name": "crop_video", "arguments": "{\\"start_time\\": 1"}\n</tool_call>' + GOOD, 1, 1),
    ("<tool_call>\n" + "1" * 20000 + "\n</tool_call>" + GOOD, 1, 1),  # over the block bound
    ("<tool_code>crop_video('v.mp4', " + "9" * 400 + ", 5)</tool_code>", 1, 0),
    ("<tool_code>crop_video(**{'a': 1})</tool_code>", 0, 1),
    ("<tool_code>__import__('os').system('echo pwned')</tool_code>", 0, 1),  # not a literal call: an error, never run
    ("<tool_code>" + "(" * 3000 + "</tool_code>", 0, 1),
    ("<video_zoom>" + "1" * 4000 + "</video_zoom>", 0, 1),
    ("<video_zoom>" + "1" * 20000 + "</video_zoom>", 0, 1),
    ('<video_zoom>{"start_time": NaN, "end_time": 3}</video_zoom>', 1, 0),
    ("<tool_call>\n" + json.dumps({"name": "crop_video", "arguments": {"start_time": 1, "end_time": 2}}) * 3
     + "\n</tool_call>", 1, 0),  # trailing junk after the first object
    (None, 0, 0),
]


@pytest.mark.parametrize("text,n_calls,n_errors", PARSER_CASES, ids=[f"parse{i}" for i in range(len(PARSER_CASES))])
def test_parser_never_raises_and_isolates_calls(text, n_calls, n_errors):
    r = parse_tool_calls(text)
    assert len(r.calls) == n_calls and len(r.errors) == n_errors, (r.calls, r.errors)
    # every argument is strict JSON (no NaN/Infinity tokens) whatever the model wrote
    json.dumps([c.arguments for c in r.calls], allow_nan=False)
    for c in r.calls:
        for v in c.arguments.values():
            assert not (isinstance(v, float) and not math.isfinite(v))


@pytest.mark.parametrize("s,e,why", [("9" * 400, 5, "must be a number"), ("NaN", 5, "must be a number"),
                                     ("1e309", 5, "must be a number"), (5, 1, "must be before"),
                                     (-1e308, "Infinity", "must be a number")])
def test_bad_numbers_become_clear_tool_errors(s, e, why):
    from paravt.agent.tools import validate_window
    call = parse_tool_calls(CALL.format(s=s, e=e)).calls[0]
    with pytest.raises(ValueError, match=why):
        validate_window(call.arguments, 60.0)


def test_strict_jsonl_writer_and_torn_reader(tmp_path, caplog):
    from paravt.core.metrics import append_jsonl, read_jsonl, trim_jsonl
    p = tmp_path / "x.jsonl"
    append_jsonl(p, [{"step": 1, "v": float("nan")}, {"step": 2, "v": float("inf")}])
    for ln in p.read_text().splitlines():
        json.loads(ln, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    with open(p, "a") as f:
        f.write('{"step": 3, "v": 0.')  # torn by a kill
    assert [r["step"] for r in read_jsonl(p)] == [1, 2] and "unreadable" in caplog.text
    assert trim_jsonl(p, lambda r: r["step"] < 2) == 1
    assert [r["step"] for r in read_jsonl(p)] == [1] and p.read_text().endswith("\n")


def test_metrics_logger_resumes_over_a_torn_line(tmp_path):
    from paravt.core.metrics import MetricsLogger, read_jsonl
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.9}\n{"step": 3, "lo')
    lg = MetricsLogger(p, resume_step=3)
    lg.log({"loss": 0.8}, 3)
    assert [r["step"] for r in read_jsonl(p)] == [1, 2, 3]


# --------------------------------------------------------------------------- configs on the command line
# (module, argv, message fragment). Each: exit 2, one line on stderr, no traceback, nothing written.
EVAL = "paravt.eval.driver"
RL = "paravt.rl.train"
SFT = "paravt.sft.train"
CONFIG_CASES = [
    (EVAL, ["concurrency=0"], "concurrency=0"),
    (EVAL, ["limit=-1"], "limit=-1"),
    (EVAL, ["nframes=0"], "nframes=0"),
    (EVAL, ["nframes=-4"], "nframes=-4"),
    (EVAL, ["max_turns=-1"], "max_turns=-1"),
    (EVAL, ["temperature=-0.5"], "temperature=-0.5"),
    (EVAL, ["max_new_tokens=0"], "max_new_tokens=0"),
    (EVAL, ["max_parallel=0"], "max_parallel=0"),
    (EVAL, ["retries=-1"], "retries=-1"),
    (EVAL, ["max_error_fraction=2"], "max_error_fraction"),
    (EVAL, ["splits=[]"], "splits is empty"),
    (EVAL, ["splits=[nope]"], "unknown splits"),
    (EVAL, ["backend=tpu"], "backend"),
    (EVAL, ["channel=video_url"], "video_url needs a server"),
    (EVAL, ["server.launch=docker", "backend=openai"], "server.launch"),
    (EVAL, ["concurrncy=2"], "did you mean 'concurrency'"),
    (EVAL, ["nframes=abc"], "nframes"),
    (EVAL, ["resume=maybe"], "resume"),
    (RL, ["paravt.gating.choices=[0]"], "choices"),
    (RL, ["paravt.gating.choices=[-4,8]"], "choices"),
    (RL, ["paravt.gating.choices=[]"], "choices"),
    (RL, ["grpo.prompts_per_step=0"], "prompts_per_step"),
    (RL, ["grpo.n_samples=1"], "n_samples"),
    (RL, ["grpo.temperature=-1"], "temperature"),
    (RL, ["hierarchical_agent.max_turns=-2"], "max_turns"),
    (RL, ["hierarchical_agent.nframes=0"], "nframes"),
    (RL, ["paravt.reward.mode=llm"], "judge.base_url"),
    (RL, ["max_steps=0"], "max_steps"),
    (RL, ["max_step=3"], "did you mean 'max_steps'"),
    (SFT, ["optim.lrr=1e-3"], "did you mean 'optim.lr'"),
    (SFT, ["max_steps=abc"], "max_steps"),
    (SFT, ["video.open_videos=0"], "video.open_videos must be >= 1"),
]


def _run_cli(module, argv):
    from importlib import import_module
    from paravt.core.config import parse_cli
    schema = {EVAL: "EvalConfig", RL: "RLConfig", SFT: "SFTConfig"}[module]
    mod = import_module({EVAL: "paravt.eval.driver", RL: "paravt.rl.config", SFT: "paravt.sft.config"}[module])
    return parse_cli(getattr(mod, schema), argv, module)


@pytest.mark.parametrize("module,argv,fragment", CONFIG_CASES, ids=[f"cfg{i}" for i in range(len(CONFIG_CASES))])
def test_bad_config_is_one_line_exit_2(module, argv, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written: the working directory stays empty
    base = {EVAL: ["model=/m"], RL: ["model_path=/m", "train_data=[x.parquet]"], SFT: ["model_path=/m"]}[module]
    recipe = [str(Path(__file__).resolve().parents[2] / "configs/rl/tiny.yaml")] if module == RL else []
    with pytest.raises(SystemExit) as e:
        _run_cli(module, recipe + base + argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert fragment in err, err
    assert list(tmp_path.iterdir()) == []


def test_malformed_yaml_recipe_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_path: [unclosed\n")
    r = subprocess.run([sys.executable, "-m", RL, str(bad)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "not valid YAML" in r.stderr and "line 1" in r.stderr


def test_wrong_type_in_recipe_names_the_key(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_steps: lots\n")
    with pytest.raises(SystemExit) as e:
        _run_cli(RL, [str(bad), "model_path=/m", "train_data=[x.parquet]"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "max_steps" in err and "lots" in err, err


# --------------------------------------------------------------------------- data files
def _rl_table(**over):
    row = {"prompt": json.dumps([{"role": "user", "content": "<video>\nWhat colour?"}]),
           "videos": [{"video": "file:///nonexistent/v.mp4"}],
           "extra_info": json.dumps({"answer": "red", "question_type": "oe"})}
    row.update(over)
    return pa.table({k: [v] for k, v in row.items()})


def test_rl_data_problems_are_one_line(tmp_path):
    from paravt.data.schema import DataError, load_rl_rows
    junk = tmp_path / "junk.parquet"
    junk.write_text("not a parquet")
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    nocol = tmp_path / "nocol.parquet"
    pq.write_table(pa.table({"prompt": ["x"]}), nocol)
    for path, frag in ((junk, "not a readable parquet"), (empty, "not a readable parquet"),
                       (nocol, "missing column(s) ['videos', 'extra_info']")):
        with pytest.raises(DataError, match=frag.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            load_rl_rows([path])
    onlybad = tmp_path / "onlybad.parquet"
    pq.write_table(_rl_table(extra_info=json.dumps({"answer": None})), onlybad)
    with pytest.raises(DataError, match="no usable rows.*1 answer is null"):
        load_rl_rows([onlybad])


@pytest.mark.parametrize("extra,reason", [
    ({"answer": None}, "answer is null"), ({"answer": ""}, "answer is null"), ({"answer": {"x": 1}}, "answer has a wrong type"),
    ({"answer": True}, "answer has a wrong type"), ({"question_type": "mcq"}, "no answer"),
    ({"answer": "A", "question_type": "essay"}, "unknown question_type"),
    ({"answer": [1, "b"], "question_type": "tvg"}, "answer has a wrong type")])
def test_bad_rl_rows_are_counted_by_reason(extra, reason, tmp_path):
    from paravt.data.schema import load_rl_rows
    p = tmp_path / "rows.parquet"
    good = _rl_table()
    bad = _rl_table(extra_info=json.dumps(extra))
    pq.write_table(pa.concat_tables([good, bad]), p)
    rows, rep = load_rl_rows([p], check_media=False)
    assert len(rows) == 1 and rep.skipped == {reason: 1} and reason in rep.summary()


def test_materialize_lists_every_unresolved_path(tmp_path):
    root = tmp_path / "media"
    (root / "selfqa").mkdir(parents=True)
    (root / "selfqa/a.mp4").write_bytes(b"x")
    src = tmp_path / "pq"
    src.mkdir()
    vids = [[{"video": "selfqa/a.mp4"}], [{"video": "elsewhere/b.mp4"}], [{"video": "other/c.mp4"}],
            [{"video": "selfqa/missing.mp4"}]]
    pq.write_table(pa.table({"videos": vids, "messages": ["[]"] * 4}), src / "paravt_x.parquet")
    args = [sys.executable, "-m", "paravt.data.materialize", "--root", str(root), "--parquet-dir", str(src),
            "--output-dir", str(tmp_path / "out")]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "2 media path(s) under none of the sentinel roots" in r.stderr and "elsewhere/b.mp4" in r.stderr
    assert "1 media file(s) missing" in r.stderr
    rep = json.loads((tmp_path / "out/materialize_report.json").read_text())
    assert rep["unresolved_total"] == 2 and sorted(rep["unresolved_examples"]) == ["elsewhere/b.mp4", "other/c.mp4"]
    r = subprocess.run(args + ["--allow-unresolved", "--allow-missing"], capture_output=True, text=True)
    assert r.returncode == 0 and "warning: 2 media path(s)" in r.stderr
    r = subprocess.run(args[:4] + [str(tmp_path / "nope")] + args[5:], capture_output=True, text=True)
    assert r.returncode == 2


def test_eval_missing_data_root_fails_the_run(tmp_path, tiny_dir):
    r = subprocess.run([sys.executable, "-m", EVAL, f"model={tiny_dir}", f"data_root={tmp_path / 'nothing'}",
                        f"out={tmp_path / 'out'}", "progress=false"], capture_output=True, text=True)
    assert r.returncode == 1 and "did not run" in r.stderr and "not found" in r.stderr


@pytest.mark.launcher
def test_run_rl_preflight_rejects_bad_data_before_torchrun(tmp_path, tiny_dir):
    junk = tmp_path / "junk.parquet"
    junk.write_text("nope")
    r = subprocess.run(["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml", f"model_path={tiny_dir}",
                        f"train_data=[{junk}]", f"output_dir={tmp_path / 'rl'}"], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("run_rl.sh: ")
    assert "not a readable parquet" in r.stderr and "torchrun" not in r.stderr and not (tmp_path / "rl").exists()


@pytest.mark.parametrize("extra,fragment", [(["--nframes", "0"], "--nframes must be >= 1"),
                                            (["--temperature", "-1"], "--temperature must be >= 0"),
                                            (["--video", "MISSING"], "--video"),
                                            (["--video", "CORRUPT"], "cannot decode"),
                                            (["--model", "NOMODEL"], "not a checkpoint directory")])
def test_inference_script_bad_input(extra, fragment, tiny_dir, tmp_path):
    corrupt = tmp_path / "c.mp4"
    corrupt.write_bytes(b"\x00" * 100)
    subst = {"MISSING": str(tmp_path / "none.mp4"), "CORRUPT": str(corrupt), "NOMODEL": str(tmp_path / "m")}
    argv = {"--model": str(tiny_dir), "--video": str(corrupt), "--question": "q"}
    for k, v in zip(extra[::2], extra[1::2]):
        argv[k] = subst.get(v, v)
    if "--video" not in extra and "--model" in extra or extra[0] in ("--nframes", "--temperature"):
        argv["--video"] = str(corrupt)
    r = subprocess.run([sys.executable, "scripts/inference.py", *[x for kv in argv.items() for x in kv]],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert fragment in r.stderr.strip().splitlines()[-1]


# --------------------------------------------------------------------------- cluster variables of the launchers
# (launcher, variables, message fragment). Each refused by scripts/_common.sh cluster_check before any preflight
# or torchrun: exit 2, one line naming the variable, within seconds.
CLUSTER = ("NPROC", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "HEARTBEAT_S", "RDZV_TIMEOUT",
           "FS_CHECK_TIMEOUT", "SERVERS_TIMEOUT", "MAX_RESTARTS", "NODE_GPUS")
CLUSTER_CASES = [
    ("run_rl.sh", {"NPROC": "0"}, "NPROC=0 must be a whole number >= 1"),
    ("run_sft.sh", {"NPROC": "0"}, "NPROC=0 must be a whole number >= 1"),
    ("run_rl.sh", {"NPROC": "two"}, "NPROC=two must be a whole number >= 1"),
    ("run_sft.sh", {"NPROC": "two"}, "NPROC=two must be a whole number >= 1"),
    ("run_rl.sh", {"MASTER_PORT": "70000"}, "MASTER_PORT=70000 must be a TCP port, 1..65535"),
    ("run_sft.sh", {"MASTER_PORT": "0"}, "MASTER_PORT=0 must be a TCP port"),
    ("run_rl.sh", {"HEARTBEAT_S": "0"}, "HEARTBEAT_S=0 must be a number of seconds > 0"),
    ("run_sft.sh", {"RDZV_TIMEOUT": "soon"}, "RDZV_TIMEOUT=soon must be a number of seconds > 0"),
    ("run_rl.sh", {"MAX_RESTARTS": "-1"}, "MAX_RESTARTS=-1 must be a whole number >= 0"),
    ("run_rl.sh", {"NNODES": "two"}, "NNODES=two must be a whole number >= 1"),
    ("run_sft.sh", {"NNODES": "0"}, "NNODES=0 must be a whole number >= 1"),
    ("run_rl.sh", {"NNODES": "2", "NODE_RANK": "one", "MASTER_ADDR": "127.0.0.1"}, "NODE_RANK=one must be one of 0..1"),
    ("run_sft.sh", {"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "127.0.0.1"}, "NODE_RANK=2 must be one of 0..1"),
    ("run_rl.sh", {"NNODES": "2", "NODE_RANK": "1"}, "set MASTER_ADDR to node 0's address"),
    ("run_rl.sh", {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "no-such-host.invalid"},
     "MASTER_ADDR=no-such-host.invalid does not resolve"),
    ("run_sft.sh", {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "no-such-host.invalid"},
     "MASTER_ADDR=no-such-host.invalid does not resolve"),
    ("run_rl.sh", {"NODE_GPUS": "eight"}, "NODE_GPUS=eight must be a whole number >= 0"),
]


@pytest.mark.parametrize("script,env,fragment", CLUSTER_CASES, ids=[f"cluster{i}" for i in range(len(CLUSTER_CASES))])
def test_bad_cluster_variables_are_one_line_before_torchrun(script, env, fragment, tmp_path):
    import os
    import time
    base = {k: v for k, v in os.environ.items() if k not in CLUSTER}
    recipe = "configs/rl/tiny.yaml" if script == "run_rl.sh" else "configs/sft/tiny.yaml"
    t0 = time.monotonic()
    r = subprocess.run(["bash", f"scripts/{script}", recipe, f"output_dir={tmp_path / 'out'}"], capture_output=True,
                       text=True, cwd=Path(__file__).resolve().parents[2], env={**base, **env}, timeout=60)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and err[0].startswith(f"{script}: ") and fragment in err[0], r.stderr
    assert time.monotonic() - t0 < 20 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("url,why", [("not-a-url", "scheme must be http or https"), ("ftp://h:1", "scheme"),
                                     ("http://:8000", "names no host"), ("http://h:99999", "port must be 1..65535"),
                                     ("http://h:port", "port must be 1..65535"), ("https://h:0", "port must be")])
def test_a_rollout_url_of_the_wrong_form_is_one_line_naming_it(url, why):
    from paravt.core.cluster import check_url
    with pytest.raises(ValueError) as e:
        check_url(url)
    assert str(e.value).startswith(f"rollout.urls: {url!r} is not a server URL") and why in str(e.value)
    for good in ("http://10.0.0.5:30000", "https://rollout.example.org", "http://[::1]:8000/v1"):
        assert check_url(good) == good


def test_run_rl_refuses_a_malformed_rollout_url_in_its_preflight(tmp_path):
    r = subprocess.run(["bash", "scripts/run_rl.sh", "configs/rl/tiny.yaml", "rollout.urls=[not-a-url]",
                        f"output_dir={tmp_path / 'rl'}"], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[2], timeout=120)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and "rollout.urls: 'not-a-url' is not a server URL" in err[0], r.stderr
    assert not (tmp_path / "rl").exists()
