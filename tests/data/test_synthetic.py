import hashlib
import json
from dataclasses import replace

import pyarrow.parquet as pq
import pytest

from paravt.core.scoring import score
from paravt.core.toolcall import ToolCallParser
from paravt.data.schema import RowError, RLRow, load_rl_rows, load_sft_rows
from paravt.data.synthetic.world import WorldConfig, make_spec
from paravt.data.synthetic.writer import build_world
from paravt.data.tool_specs import CROP_VIDEO_SYNTAX

parse_tool_calls = ToolCallParser([CROP_VIDEO_SYNTAX]).parse  # the calls the traces write


def _digest(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((d / "parquet").glob("*.parquet"))}


def test_a_clip_encodes_to_the_same_bytes_every_time(tmp_path):
    """The needle world's clip_0091, which x264's AVX-512 code encoded to three different files in 20 encodes
    (and different decoded pixels) on a CPU that has it; the encoder's C path gives one."""
    from paravt.data.synthetic.__main__ import PRESETS
    from paravt.data.synthetic.render import write_video

    spec = make_spec(WorldConfig(seed=0, **PRESETS["needle"]), "train", 91)
    digests = set()
    for i in range(6):
        write_video(spec, tmp_path / f"{i}.mp4")
        digests.add(hashlib.sha256((tmp_path / f"{i}.mp4").read_bytes()).hexdigest())
    assert len(digests) == 1


def test_same_seed_same_bytes(tmp_path):
    cfg = WorldConfig(seed=5, n_train_videos=3, n_eval_videos=2)
    build_world(tmp_path / "a", cfg, progress=False)
    build_world(tmp_path / "b", cfg, progress=False)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    vids = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.mp4"))
    for v in vids:
        assert (tmp_path / "a" / v).read_bytes() == (tmp_path / "b" / v).read_bytes()
    build_world(tmp_path / "c", WorldConfig(seed=6, n_train_videos=3, n_eval_videos=2), progress=False)
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")


def test_sentinel_paths_and_materialized_rows(world):
    raw, _ = load_rl_rows([world / "parquet" / "paravt_rl_synth.parquet"], check_media=False)
    assert all(r.videos[0]["video"].split("/")[0] in ("selfqa", "longvt_source") for r in raw)
    rows, rep = load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])
    assert rep.kept == rep.total == len(rows) > 0
    assert all(r.videos[0]["video"].startswith("file://") for r in rows)
    assert {r.question_type for r in rows} == {"mcq", "oe", "tvg"}
    report = json.loads((world / "local" / "materialize_report.json").read_text())
    assert report["missing_total"] == 0 and set(report["rewritten_per_bucket"]) == {"selfqa", "longvt_source"}


def test_missing_video_rows_are_skipped_with_a_count(world, tmp_path):
    rows, _ = load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])
    victim = rows[0].video
    import shutil
    moved = tmp_path / "moved.mp4"
    shutil.move(victim, moved)
    try:
        rows2, rep = load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])
        n_same_video = sum(r.video == victim for r in rows)
        assert rep.skipped["missing video"] == n_same_video and len(rows2) == len(rows) - n_same_video
    finally:
        shutil.move(moved, victim)


def test_expert_sft_rows_are_well_formed_and_correct(world):
    rows, rep = load_sft_rows([world / "local" / "paravt_sft_synth.parquet"])
    assert rep.kept == rep.total
    n_multi = n_direct = n_two_round = 0
    for r in rows:
        assistant = [m for m in r.messages if m["role"] == "assistant"]
        texts = [m["content"][0]["text"] for m in assistant]
        if r.messages[0]["role"] == "user":  # sub-agent example
            assert len(texts) == 1 and "seconds" in texts[0]
            continue
        calls = [parse_tool_calls(t) for t in texts]
        assert all(not c.errors for c in calls)
        assert not calls[-1].calls and "<answer>" in texts[-1]
        n_multi += len(calls[0].calls) >= 2
        n_direct += len(texts) == 1
        n_two_round += len(texts) == 3
        for t in texts:
            assert t.startswith("<think>\n") and "</think>" in t
    assert n_multi > 0 and n_direct > 0 and n_two_round > 0


def test_expert_answers_score_well(world):
    """The expert's final answer, scored by the shared scorer, is right (tvg: high IoU)."""
    sft = pq.read_table(world / "local" / "paravt_sft_synth.parquet").to_pylist()
    rl = {json.loads(r["extra_info"])["id"]: json.loads(r["extra_info"]) for r in
          pq.read_table(world / "local" / "paravt_rl_synth.parquet").to_pylist()}
    accs = []
    for r in sft:
        if r["kind"] != "main":
            continue
        final = json.loads(r["messages"])[-1]["content"][0]["text"]
        ex = rl[r["id"]]
        accs.append(score(final, ex["answer"], ex["question_type"]).value)
    assert min(accs) > 0.5 and sum(accs) / len(accs) > 0.9


def test_tool_necessity_gap():
    """Small K misses most events, K = 64 catches all (the world's design goal)."""
    from paravt.data.synthetic.writer import world_stats
    cfg = WorldConfig(seed=0, n_train_videos=0, n_eval_videos=60)
    specs = {"train": [], "eval": [make_spec(cfg, "eval", i) for i in range(60)]}
    vis = world_stats(specs, cfg)["eval_event_visible_in_overview"]
    assert vis["64"] == 1.0 and vis["4"] < 0.35 and vis["4"] < vis["16"] < vis["64"]


def test_row_errors_name_file_and_row():
    with pytest.raises(RowError, match="f.parquet:row 3: extra_info has no 'answer'"):
        RLRow.from_record({"prompt": "<video>q", "videos": [{"video": "v.mp4"}], "extra_info": "{}"}, "f.parquet:row 3")
    with pytest.raises(RowError, match="not valid JSON"):
        RLRow.from_record({"prompt": "q", "videos": [], "extra_info": "{bad"}, "f:row 0")
    with pytest.raises(RowError, match="question_type"):
        RLRow.from_record({"prompt": "q", "videos": ["v"], "extra_info": {"answer": 1, "question_type": "x"}}, "f:row 0")
    r = RLRow.from_record({"prompt": [{"role": "user", "content": "<video>\nWhat?"}], "videos": ["v.mp4"],
                           "extra_info": {"answer": "B", "question_type": "mcq", "id": "q7"}}, "f:row 0")
    assert r.question == "What?" and r.sample_id == "q7" and r.video == "v.mp4"


def test_perception_rows_are_short_windows_described_correctly(world):
    """paravt_perception_synth: 1-4 s sub-agent windows, two thirds on an event, and every
    summary names exactly the events visible at the frames the window samples."""
    from paravt.core.video import crop_timestamps
    from paravt.data.synthetic.world import Event

    specs = json.loads((world / "world.json").read_text())["videos"]
    rows, rep = load_sft_rows([world / "local" / "paravt_perception_synth.parquet"])
    assert rep.kept == rep.total == 8 * WorldConfig().perception_windows
    n_event = 0
    for r in rows:
        (user, assistant) = r.messages
        item = user["content"][0]
        s, e = item["video_start"], item["video_end"]
        assert 1.0 - 1e-6 <= e - s <= 4.0 + 1e-6
        spec = next(v for v in specs.values() if item["video_url"]["url"].endswith(v["rel_path"]))
        ts = crop_timestamps(spec["duration"] * spec["fps"], spec["fps"], s, e, 1.0, 1, 16)
        visible = [ev for ev in map(lambda d: Event(**d), spec["events"]) if any(ev.visible_at(t) for t in ts)]
        text = assistant["content"][0]["text"]
        n_event += bool(visible)
        for ev in visible:
            assert f"A {ev.colour} {ev.shape} is visible" in text
        if not visible:
            assert "no coloured shape is visible" in text
    assert 0.5 <= n_event / len(rows) <= 0.8


def test_reading_rows_answer_from_the_matching_report(world):
    """paravt_reading_synth: text-only reports then a question; the answer restates the task and
    copies the times and colour of the one report that shows the asked shape (never a guess)."""
    import re

    from paravt.data.synthetic.rows import reading_rows

    rows, rep = load_sft_rows([world / "local" / "paravt_reading_synth.parquet"])
    assert rep.kept == rep.total == WorldConfig().reading_rows and all(not r.videos for r in rows)
    n_reports = []
    for r in rows:
        (user, assistant) = r.messages
        text, answer = user["content"][0]["text"], assistant["content"][0]["text"]
        reports = [ln for ln in text.splitlines() if ln.startswith("[")]
        n_reports.append(len(reports))
        m = re.search(r"the (red|green|blue|yellow|white|magenta|cyan|orange) (circle|square|triangle) appear", text) \
            or re.search(r"What colour is the (circle|square|triangle)\?", text)
        shape = m.groups()[-1]
        seen = [re.search(rf"A (\w+) {shape} is visible (?:from ([\d.]+) to ([\d.]+)|at ([\d.]+)) seconds", ln)
                for ln in reports]
        seen = [s for s in seen if s]
        assert seen, r.where
        colour = seen[0].group(1)
        first = seen[0].group(2) or seen[0].group(4)
        last = seen[-1].group(3) or seen[-1].group(4)
        at = f"at {first} seconds" if first == last else f"from {first} to {last} seconds"
        assert f"visible {at}." in answer, (r.where, answer)
        assert re.search(rf"the (\w+ )?{shape}", answer.split(".")[0]), (r.where, answer)
        if "Answer with one word" in text:
            assert answer.endswith(f"It is {colour}."), (r.where, answer)
        elif "option letter" in text:
            letter = re.search(rf"^([ABCD])\. {colour}$", text, re.M).group(1)
            opts = ", ".join(re.findall(r"^([ABCD]\. \w+)$", text, re.M))
            assert f"as an option letter: {opts}." in answer, (r.where, answer)  # restated as the question writes them
            assert answer.endswith(f"It is {colour}, option {letter}."), (r.where, answer)
    assert set(n_reports) >= {2, 3, 4}  # 40-120 s videos in 30 s windows
    # deterministic, and never the probe's videos (split "reading" vs "probe")
    again = reading_rows(WorldConfig(), 5)
    assert [json.loads(x["messages"]) for x in again] == [r.messages for r in rows[:5]]
    assert all(x["id"].startswith("reading_") for x in again)


def test_reading_rows_in_the_episode_format_are_text_only_episodes():
    """reading_format=episode: the main agent's own conversation (system, question, parallel crop calls,
    one perfect report per call as a tool message, the answer) on the same videos and questions as the
    user format, with no overview frames; the answer copies the report that shows the asked shape."""
    import re

    from paravt.data.synthetic.rows import reading_rows

    with pytest.raises(ValueError, match="reading_format"):
        WorldConfig(reading_format="chat")
    ep, user = reading_rows(WorldConfig(reading_format="episode"), 40), reading_rows(WorldConfig(), 40)
    assert [r["id"] for r in ep] == [r["id"] for r in user] and all(not r["videos"] for r in ep)
    ans = reading_rows(WorldConfig(reading_format="episode_answer"), 40)  # the same, loss on the last turn only
    for a, e in zip(ans, ep):
        ma, me = json.loads(a["messages"]), json.loads(e["messages"])
        assert [{k: v for k, v in m.items() if k != "weight"} for m in ma] == me
        assistant = [m for m in ma if m["role"] == "assistant"]
        assert all(m.get("weight") == 0 for m in assistant[:-1]) and "weight" not in assistant[-1]
    for row, u in zip(ep, user):
        m = json.loads(row["messages"])
        roles = [x["role"] for x in m]
        assert roles[:3] == ["system", "user", "assistant"] and roles[-1] == "assistant", roles
        assert all(c["type"] == "text" for x in m for c in x["content"])  # no frames anywhere
        lines = json.loads(u["messages"])[0]["content"][0]["text"].splitlines()
        question = "\n".join(lines[max(i for i, ln in enumerate(lines) if ln.startswith("[")) + 1:])
        assert m[1]["content"][-1]["text"].strip() == question.strip()  # the same question as the user format
        calls = parse_tool_calls(m[2]["content"][0]["text"])
        tools = [x["content"][0]["text"] for x in m if x["role"] == "tool"]
        assert len(calls.calls) >= 2 and len(tools) >= len(calls.calls)  # parallel coarse windows (+ a fine round for tvg)
        shape = re.search(r"(circle|square|triangle)", m[2]["content"][0]["text"]).group(1)
        hit = next(t for t in tools if f" {shape} is visible" in t)
        colour = re.search(rf"A (\w+) {shape}", hit).group(1)
        answer = re.search(r"<answer>(.*)</answer>", m[-1]["content"][0]["text"], re.S).group(1)
        if "Answer with one word" in question:
            assert answer == colour, (row["id"], answer, hit)
        elif "option letter" in question:
            assert answer == re.search(rf"^([ABCD])\. {colour}$", question, re.M).group(1), (row["id"], answer, hit)
        else:  # tvg: a span around the times the report gives
            first = float(re.search(r"(?:from|at) ([\d.]+)", hit).group(1))
            lo, hi = (float(x) for x in re.findall(r"[\d.]+", answer)[:2])
            assert lo <= first <= hi, (row["id"], answer, hit)



def test_episode_answer_rows_supervise_only_the_answer_through_the_real_loader(tiny, tmp_path):
    """Written to parquet, loaded by load_sft_rows and built by the SFT ExampleBuilder (the path the
    trainer takes): the ids are those of the episode format, the labels only the last assistant turn."""
    from paravt.data.schema import DataError, load_sft_rows
    from paravt.data.synthetic.rows import reading_rows
    from paravt.data.synthetic.writer import _write_parquet
    from paravt.sft.data import IGNORE, ExampleBuilder, VideoSamplingConfig

    _, proc = tiny
    for fmt in ("episode", "episode_answer"):
        _write_parquet(reading_rows(WorldConfig(reading_format=fmt), 6), tmp_path / f"{fmt}.parquet")
    ep, _ = load_sft_rows([tmp_path / "episode.parquet"])
    ans, _ = load_sft_rows([tmp_path / "episode_answer.parquet"])
    b = ExampleBuilder(proc, VideoSamplingConfig(), 8192)
    for e, a in zip(ep, ans):
        xe, xa = b(e), b(a)
        assert xe.input_ids == xa.input_ids
        sup = proc.tokenizer.decode([t for t, lab in zip(xa.input_ids, xa.labels) if lab != IGNORE])
        last = [m for m in a.messages if m["role"] == "assistant"][-1]["content"][0]["text"]
        assert sup == last + "<|im_end|>"
        assert sum(lab != IGNORE for lab in xe.labels) > sum(lab != IGNORE for lab in xa.labels)
    bad = json.loads(reading_rows(WorldConfig(reading_format="episode_answer"), 1)[0]["messages"])
    bad[2]["weight"] = 0.5
    _write_parquet([{"id": "bad", "kind": "reading", "nframes": 0, "messages": json.dumps(bad), "videos": []}],
                   tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad.parquet:row 0: weight must be 0 or 1"):
        load_sft_rows([tmp_path / "bad.parquet"])


def test_shape_first_wording_puts_the_key_before_the_values():
    """report_wording=shape_first: every report sighting reads "The <shape> is <colour>, visible ...";
    the expert's answer turn after the coarse crops starts with the very sentence of the report that
    shows the asked shape (when one window holds the whole sighting), so the answer is a
    continuation of "The <shape> is" by copying; no earlier thought starts "The <shape> is"."""
    import re

    from paravt.data.synthetic.traces import expert_trajectory
    from paravt.data.synthetic.rows import lookup_example, reading_rows
    from paravt.data.synthetic.world import QUESTION_TYPES, make_question
    from paravt.core.seeding import py_rng

    with pytest.raises(ValueError, match="report_wording"):
        WorldConfig(report_wording="value_last")
    cfg, old = WorldConfig(report_wording="shape_first"), WorldConfig()
    sight = re.compile(r"The (circle|square|triangle) is (\w+), visible (?:at [\d.]+|from [\d.]+ to [\d.]+) seconds\.")
    r, copied, checked = py_rng(0, "wording-test"), 0, 0
    for j in range(60):
        spec = make_spec(cfg, "train", j)
        ev = r.choice(spec.events)
        q = make_question(spec, ev, r.choice(QUESTION_TYPES), r)
        traj, base = expert_trajectory(spec, q, 4, cfg), expert_trajectory(spec, q, 4, old)
        assert traj["crops"] == base["crops"]  # the same policy, only the words differ
        reports = [t for turn in traj["turns"] if isinstance(turn, list) for t in turn]
        for t in reports:
            if "no coloured shape" not in t:
                assert [m.group(0) for m in sight.finditer(t)] and not t.startswith("A "), t
        thoughts = [t for t in traj["turns"] if isinstance(t, str)]
        for t in thoughts[:-1]:
            assert f"The {ev.shape} is" not in t.split("</think>")[0].split("The question asks")[0] or "visible near" in t, t
            # "<shape> is" outside a sighting would give "The circle is" a second continuation to copy
            assert f"{ev.shape} is visible" not in t and f"{ev.shape} is not" not in t, t
        last = thoughts[-1].split("</think>")[0]
        m = sight.search(last)
        if len(thoughts) > 1 and q["question_type"] != "tvg":
            assert m and m.group(1) == ev.shape and m.group(2) == ev.colour, last
            checked += 1
            copied += any(m.group(0) in t for t in reports)
    assert checked >= 10 and copied >= checked // 2, (checked, copied)
    ex = lookup_example(cfg, "probe", 0, py_rng(0, "x"))
    while ex is None:
        ex = lookup_example(cfg, "probe", 1, py_rng(1, "x"))
    assert sight.search(ex["answer"]) and "A " not in ex["user"].split("Reports:")[1].split("\n")[1][:2]
    rows = reading_rows(WorldConfig(report_wording="shape_first", reading_format="episode"), 5)
    assert all(sight.search(json.loads(x["messages"])[-1]["content"][0]["text"]) for x in rows)


def test_needle_world_knobs(tmp_path):
    """One event per video, fixed duration, 15 s coarse windows at 1 fps, no fine round, unpadded
    tvg spans, fixed MCQ letters: every answer is a copy of what the world shows (no arithmetic on
    times, no lookup among options), and the expert's answers still score."""
    import re

    from paravt.data.synthetic.world import COLOURS, mcq_slot

    with pytest.raises(ValueError, match="mcq_options"):
        WorldConfig(mcq_options="sorted")
    with pytest.raises(ValueError, match="tvg_pad_s"):
        WorldConfig(tvg_pad_s=-1)
    cfg = WorldConfig(seed=3, n_train_videos=8, n_eval_videos=4, min_events=1, max_events=1, min_duration=120,
                      max_duration=120, coarse_window_s=15, fine_round=False, tvg_pad_s=0, mcq_options="fixed",
                      reading_rows=20)
    build_world(tmp_path / "w", cfg)
    from paravt.data.materialize import main as materialize
    materialize(["--root", str(tmp_path / "w" / "media"), "--parquet-dir", str(tmp_path / "w" / "parquet"),
                 "--output-dir", str(tmp_path / "w" / "local")])
    rl = {json.loads(r["extra_info"])["id"]: json.loads(r["extra_info"]) for r in
          pq.read_table(tmp_path / "w" / "local" / "paravt_rl_synth.parquet").to_pylist()}
    assert {x["duration"] for x in rl.values()} == {120.0}
    assert len({x["video_id"] for x in rl.values()}) * 3 == len(rl)  # one event: three questions per video
    sft = pq.read_table(tmp_path / "w" / "local" / "paravt_sft_synth.parquet").to_pylist()
    accs, n_parallel = {"mcq": [], "oe": [], "tvg": []}, 0
    names = sorted(COLOURS)
    for r in sft:
        if r["kind"] != "main":
            continue
        msgs = json.loads(r["messages"])
        ex = rl[r["id"]]
        texts = [m["content"][0]["text"] for m in msgs if m["role"] == "assistant"]
        tools = [m["content"][0]["text"] for m in msgs if m["role"] == "tool"]
        assert len(texts) <= 2  # no second, finer round
        if tools:
            calls = parse_tool_calls(texts[0]).calls
            assert [(c.arguments["start_time"], c.arguments["end_time"]) for c in calls] == \
                   [(15.0 * i, 15.0 * (i + 1)) for i in range(8)]
            n_parallel += 1
        question = msgs[1]["content"][-1]["text"]
        if ex["question_type"] == "mcq":
            opts = re.findall(r"^([ABCD])\. (\w+)$", question, re.M)
            assert [names.index(o) // 2 for _, o in opts] == [0, 1, 2, 3]  # each colour under its own letter
            assert ex["answer"] == "ABCD"[mcq_slot(ex["colour"])]
        if ex["question_type"] == "tvg" and tools:
            span = re.search(r"<answer>\[([\d.]+), ([\d.]+)\]</answer>", texts[-1]).groups()
            sighting = next(t for t in tools if "visible" in t and "no coloured" not in t)
            assert all(x in sighting for x in span), (span, sighting)  # the answer copies the report's times
        accs[ex["question_type"]].append(score(texts[-1], ex["answer"], ex["question_type"]).value)
    assert n_parallel > 0 and all(accs.values())
    assert min(accs["mcq"] + accs["oe"]) == 1.0 and sum(accs["tvg"]) / len(accs["tvg"]) > 0.5


def test_reports_without_shapes():
    """report_shapes=False: sub-agent reports (and perception rows) name the colour and "shape", never
    a shape; the main agent's thoughts still name the question's shape (copied from the question)."""
    from paravt.core.seeding import py_rng
    from paravt.data.synthetic.traces import expert_trajectory
    from paravt.data.synthetic.rows import short_window_rows
    from paravt.data.synthetic.world import SHAPES, make_question

    cfg = WorldConfig(max_events=1, report_shapes=False, coarse_window_s=30, crop_max_frames=30, min_duration=120,
                      max_duration=120)
    r = py_rng(0, "noshape-test")
    n_seen = 0
    for j in range(12):
        spec = make_spec(cfg, "train", j)
        ev = spec.events[0]
        q = make_question(spec, ev, "oe", r)
        traj = expert_trajectory(spec, q, 4, cfg)
        reports = [t for turn in traj["turns"] if isinstance(turn, list) for t in turn]
        thoughts = [t for t in traj["turns"] if isinstance(t, str)]
        assert not any(s in t for t in reports for s in SHAPES), reports
        sightings = [t for t in reports if "visible" in t and "no coloured" not in t]
        n_seen += bool(sightings)
        assert all(t.startswith(f"A {ev.colour} shape is visible ") for t in sightings), sightings
        assert ev.shape in thoughts[0] and (len(thoughts) == 1 or ev.shape in thoughts[-1])
        for row in short_window_rows(spec, cfg, "t", 6):
            answer = json.loads(row["messages"])[-1]["content"][0]["text"]
            assert not any(s in answer for s in SHAPES), answer
    assert n_seen >= 8


def test_cli_preset_needle_sets_the_knobs_and_flags_override(tmp_path):
    from paravt.data.synthetic.__main__ import PRESETS, main

    assert main(["--out", str(tmp_path / "w"), "--preset", "needle", "--n-train-videos", "2", "--n-eval-videos", "1",
                 "--perception-windows", "2", "--reading-rows", "4", "--tvg-pad-s", "0.5"]) == 0
    cfg = json.loads((tmp_path / "w" / "world.json").read_text())["config"]
    assert {k: cfg[k] for k in PRESETS["needle"] if k != "tvg_pad_s"} == \
           {k: v for k, v in PRESETS["needle"].items() if k != "tvg_pad_s"}
    assert cfg["tvg_pad_s"] == 0.5 and cfg["n_train_videos"] == 2
    assert WorldConfig(**cfg).max_events == 1


def test_mixed_reading_rows_alternate_user_and_episode():
    from paravt.data.synthetic.rows import reading_rows

    rows = reading_rows(WorldConfig(reading_format="mixed", max_events=1), 6)
    kinds = [json.loads(x["messages"])[0]["role"] for x in rows]
    assert kinds == ["user", "system"] * 3  # the user-format rows, then the episodes (system prompt first)
    ep = json.loads(rows[1]["messages"])
    assert any(m["role"] == "tool" for m in ep) and "<answer>" in ep[-1]["content"][0]["text"]
    with pytest.raises(ValueError, match="reading_format"):
        WorldConfig(reading_format="both")


def test_reading_system_frac_prefixes_that_share_of_user_rows_with_the_system_prompt():
    from paravt.core.prompts import system_prompt
    from paravt.data.synthetic.rows import reading_rows
    from paravt.data.tool_specs import DATA_TOOL_SCHEMAS

    plain = reading_rows(WorldConfig(max_events=1), 8)
    rows = reading_rows(WorldConfig(max_events=1, reading_system_frac=0.5), 8)
    msgs = [json.loads(x["messages"]) for x in rows]
    assert [m[0]["role"] for m in msgs] == ["user", "system"] * 4  # spread evenly, half of them
    assert msgs[1][0]["content"][0]["text"] == system_prompt("agentic_general", DATA_TOOL_SCHEMAS)
    # the same tasks as without the prefix: only the system message is added
    assert [m[-2:] for m in msgs] == [json.loads(x["messages"])[-2:] for x in plain]
    assert all(json.loads(x["messages"])[0]["role"] == "system"
               for x in reading_rows(WorldConfig(max_events=1, reading_system_frac=1.0), 3))
    with pytest.raises(ValueError, match="reading_system_frac"):
        WorldConfig(reading_system_frac=1.5)


def test_reading_curriculum_writes_the_later_phases_on_the_same_tasks(tmp_path):
    import pyarrow.parquet as pq

    from paravt.data.synthetic.writer import build_world

    build_world(tmp_path / "w", WorldConfig(n_train_videos=2, n_eval_videos=1, perception_windows=1, reading_rows=4,
                                            max_events=1, reading_curriculum=True))
    rows = {n: [json.loads(m) for m in pq.read_table(tmp_path / f"w/parquet/paravt_{n}_synth.parquet")
                .column("messages").to_pylist()] for n in ("reading", "reading_long", "reading_episode")}
    assert [m[0]["role"] for m in rows["reading"]] == ["user"] * 4
    assert [m[0]["role"] for m in rows["reading_long"]] == ["user", "system"] * 2
    assert [m[-2:] for m in rows["reading_long"]] == [m[-2:] for m in rows["reading"]]  # same tasks, prefixed
    ep = rows["reading_episode"]
    assert ep[0] == rows["reading"][0] and any(m["role"] == "tool" for m in ep[1])
    assert "<answer>" in ep[1][-1]["content"][0]["text"]
    build_world(tmp_path / "v", WorldConfig(n_train_videos=2, n_eval_videos=1, perception_windows=1, reading_rows=4))
    assert not (tmp_path / "v/parquet/paravt_reading_long_synth.parquet").exists()  # off by default


def test_reading_answer_tags_end_the_answer_as_the_episode_does():
    from paravt.data.synthetic.rows import reading_rows

    plain = reading_rows(WorldConfig(max_events=1, tvg_pad_s=0.0), 9)
    tagged = reading_rows(WorldConfig(max_events=1, tvg_pad_s=0.0, reading_answer_tags=True), 9)
    seen = set()
    for p, t in zip(plain, tagged):
        a = json.loads(p["messages"])[-1]["content"][0]["text"]
        b = json.loads(t["messages"])[-1]["content"][0]["text"]
        assert b.startswith(f"<think>\n{a}\n</think>\n<answer>") and b.endswith("</answer>")
        tag = b.split("<answer>")[1][:-len("</answer>")]
        if "option " in a:  # mcq: the letter the thought names
            assert a.endswith(f"option {tag}."); seen.add("mcq")
        elif "It is " in a:  # oe: the colour the thought names
            assert a.endswith(f"It is {tag}."); seen.add("oe")
        else:  # tvg, unpadded: the sighted times the thought copies
            s, e = (float(x) for x in tag.strip("[]").split(", "))
            assert f"from {s:.1f} to {e:.1f} seconds" in a or f"at {s:.1f} seconds" in a; seen.add("tvg")
    assert seen == {"mcq", "oe", "tvg"}


def test_direct_rows_teach_the_no_tools_arm_to_answer(tmp_path):
    """direct_rows: a share of the train questions also as one direct-prompt turn from K overview frames
    that ends in a scoreable answer; the other rows are as without them (their own random stream)."""
    from paravt.core.prompts import system_prompt

    base = WorldConfig(seed=2, n_train_videos=4, n_eval_videos=1)
    build_world(tmp_path / "off", base, progress=False)
    st = build_world(tmp_path / "on", WorldConfig(seed=2, n_train_videos=4, n_eval_videos=1, direct_rows=0.5),
                     progress=False)
    off = pq.read_table(tmp_path / "off/parquet/paravt_sft_synth.parquet").to_pylist()
    on = pq.read_table(tmp_path / "on/parquet/paravt_sft_synth.parquet").to_pylist()
    direct = [r for r in on if r["kind"] == "direct"]
    assert st["sft_direct_rows"] == len(direct) > 0 and [r for r in on if r["kind"] != "direct"] == off
    for r in direct:
        msgs = json.loads(r["messages"])
        assert msgs[0]["content"][0]["text"] == system_prompt("direct")
        assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
        text = msgs[-1]["content"][0]["text"]
        assert text.startswith("<think>\n") and "<tool_call>" not in text and "<answer>" in text
        qid = r["id"].removesuffix("_direct")
        qtype = qid.rsplit("_", 1)[1]
        ans = next(json.loads(x["extra_info"])["answer"] for x in
                   pq.read_table(tmp_path / "on/parquet/paravt_rl_synth.parquet").to_pylist()
                   if json.loads(x["extra_info"])["id"] == qid)
        if qtype != "tvg":  # the gold answer, scored correct by the shared scorer
            assert score(text, ans, qtype).value == 1.0
    with pytest.raises(ValueError, match="direct_rows"):
        WorldConfig(direct_rows=1.5)


def test_a_k_independent_tool_habit_and_skipped_calls_that_earn_nothing_for_free():
    """sft_tool_rate=0.5: half of the cold start's rows call, by a coin that knows neither K nor whether
    the overview shows the event; rows that skip answer from the overview and, where it missed the
    event, guess: their answers are right about as often as chance, not always."""
    from paravt.core.scoring import score
    from paravt.core.video import overview_timestamps
    from paravt.data.synthetic.traces import expert_trajectory, habit_calls
    from paravt.data.synthetic.world import OVERVIEW_KS, QUESTION_TYPES, make_question
    from paravt.core.seeding import py_rng

    cfg = WorldConfig(seed=3, sft_tool_rate=0.5)
    calls = {(k, v): [] for k in OVERVIEW_KS for v in (True, False)}
    guessed = []
    for i in range(150):
        spec = make_spec(cfg, "train", i)
        r = py_rng(cfg.seed, "questions", spec.id)
        for ei, ev in enumerate(spec.events):
            for qtype in QUESTION_TYPES:
                q = make_question(spec, ev, qtype, r, cfg.mcq_options)
                qid = f"{spec.id}_e{ei}_{qtype}"
                k = r.choice(OVERVIEW_KS)
                seen = any(ev.visible_at(t) for t in overview_timestamps(spec.num_frames, spec.fps, k))
                call = habit_calls(cfg, qid)
                traj = expert_trajectory(spec, q, k, cfg, call=call)
                assert bool(traj["crops"]) == call
                calls[(k, seen)].append(call)
                if not call and not seen and qtype != "tvg":
                    guessed.append(score(traj["turns"][-1], q["answer"], qtype, "f1").value)
    rates = {key: sum(v) / len(v) for key, v in calls.items() if len(v) >= 20}
    assert len(rates) >= 4 and all(0.35 < p < 0.65 for p in rates.values()), rates
    assert len(guessed) >= 30 and 0.0 < sum(guessed) / len(guessed) < 0.5
    assert habit_calls(WorldConfig(), "x") is None  # the expert's rule by default


def test_habit_sentence_puts_the_decision_in_one_place_whatever_the_overview_shows():
    """--habit-sentence: a calling row and a skipping row of the same question and K say the same
    words up to "I will", then "check ..." or "answer from them."; seen or missed, in both wordings.
    Without it a seen event's call and skip part at the sighting's last character (";" vs ".")."""
    from paravt.core.seeding import py_rng
    from paravt.core.video import overview_timestamps
    from paravt.data.synthetic.traces import expert_trajectory
    from paravt.data.synthetic.world import QUESTION_TYPES, make_question

    def first_turns(cfg, want_seen):
        for i in range(60):
            spec = make_spec(cfg, "train", i)
            r = py_rng(cfg.seed, "questions", spec.id)
            for ev in spec.events:
                for qtype in QUESTION_TYPES:
                    q = make_question(spec, ev, qtype, r, cfg.mcq_options)
                    for k in (4, 64):
                        seen = any(ev.visible_at(t) for t in overview_timestamps(spec.num_frames, spec.fps, k))
                        if seen == want_seen:
                            yield (expert_trajectory(spec, q, k, cfg, call=True)["turns"][0],
                                   expert_trajectory(spec, q, k, cfg, call=False)["turns"][0])

    for wording in ("colour_first", "shape_first"):
        cfg = WorldConfig(seed=5, sft_tool_rate=0.5, habit_sentence=True, report_wording=wording, fine_round=False)
        for want_seen in (True, False):
            pairs = list(first_turns(cfg, want_seen))
            assert len(pairs) >= 10
            for call, skip in pairs:
                cut = call.index(" I will check ")
                assert skip.startswith(call[:cut] + " I will answer from them."), (call[:cut + 40], skip)
    old = WorldConfig(seed=5, sft_tool_rate=0.5, fine_round=False)
    call, skip = next(first_turns(old, True))
    assert "; the crops will show it" in call and "I will answer" not in skip


def test_rl_prompts_from_videos_the_cold_start_never_saw(tmp_path):
    import pyarrow.parquet as pq

    cfg = WorldConfig(seed=4, n_train_videos=2, n_eval_videos=1, n_rl_videos=2, perception_windows=0, reading_rows=0)
    stats = build_world(tmp_path, cfg, progress=False)
    sft = pq.read_table(tmp_path / "parquet/paravt_sft_synth.parquet").to_pylist()
    rl = pq.read_table(tmp_path / "parquet/paravt_rl_synth.parquet").to_pylist()
    sft_videos = {v["video"] for row in sft for v in row["videos"]}
    rl_videos = {row["videos"][0]["video"] if isinstance(row.get("videos"), list) else row.get("video") for row in rl}
    assert rl and stats["rl_videos"] == "rl" and not (sft_videos & rl_videos), (sft_videos, rl_videos)
    assert all((tmp_path / "media" / v).is_file() for v in rl_videos)


def test_reading_episodes_can_leave_the_call_turn_unsupervised():
    """--no-reading-episode-calls: the episodes (always 'not visible ... I will check', made without an
    overview) teach reading the reports, not when to call: every turn but the last has weight 0, and
    the rows are otherwise the same."""
    from paravt.data.synthetic.rows import reading_rows

    cfg = WorldConfig(max_events=1, reading_format="mixed")
    full = [json.loads(r["messages"]) for r in reading_rows(cfg, 6)]
    answer_only = [json.loads(r["messages"]) for r in reading_rows(replace(cfg, reading_episode_calls=False), 6)]
    episodes = 0
    for f, a in zip(full, answer_only):
        turns = [i for i, m in enumerate(a) if m["role"] == "assistant"]
        if len(turns) > 1:  # an episode: its call turn says "I will check"
            episodes += 1
            assert "I will check" in a[turns[0]]["content"][0]["text"]
            assert [a[i].get("weight", 1) for i in turns] == [0] * (len(turns) - 1) + [1]
            assert all("weight" not in f[i] for i in turns)
        assert [{k: v for k, v in m.items() if k != "weight"} for m in a] == f
    assert episodes == 3


def test_thought_sighting_report_copies_the_report_sentence_forward():
    """thought_sighting="report": the thought that reads the reports is the matching report's own sentence
    (colour before times, as the report has them), then the answer sentence; in the episodes and in the
    user-format reading rows alike. The default keeps the question's words ("The square is visible ...")."""
    from paravt.core.seeding import py_rng
    from paravt.data.synthetic.traces import expert_trajectory
    from paravt.data.synthetic.traces import where
    from paravt.data.synthetic.rows import lookup_example
    from paravt.data.synthetic.world import make_question

    base = WorldConfig(max_events=1, report_shapes=False, coarse_window_s=30, crop_max_frames=30, min_duration=120,
                       max_duration=120, fine_round=False, tvg_pad_s=0.0)
    cfg = replace(base, thought_sighting="report")
    r = py_rng(0, "thought-sighting-test")
    n = 0
    for j in range(10):
        spec = make_spec(cfg, "train", j)
        ev = spec.events[0]
        for qt in ("oe", "mcq", "tvg"):
            q = make_question(spec, ev, qt, r)
            traj = expert_trajectory(spec, q, 4, cfg, call=True)
            reports = [t for turn in traj["turns"] if isinstance(turn, list) for t in turn]
            sightings = [t for t in reports if t.startswith("A ")]
            last = traj["turns"][-1].split("<think>\n", 1)[1].split("\n</think>")[0]
            assert last.startswith(sightings[0].split(" from ")[0] + " from "), (last, sightings)
            assert last.index(ev.colour) < last.index("seconds")
            if qt != "tvg":
                assert last.endswith(f"It is {ev.colour}." if qt == "oe" else f"It is {ev.colour}, option {q['answer']}.")
            default = expert_trajectory(spec, q, 4, base, call=True)["turns"][-1]
            assert default.split("<think>\n", 1)[1].startswith(f"The {ev.colour + ' ' if qt == 'tvg' else ''}{ev.shape} is visible")
            n += 1
    for j in range(12):
        ex = lookup_example(cfg, "probe", j, r)
        if ex is None:
            continue
        report = next(line.split("] ", 1)[1] for line in ex["user"].splitlines() if "] A " in line)
        # an event across two windows: the thought gives the first report's words and all the sighted times
        assert f". {report.split(' visible ')[0]} visible {where(ex['hits'])}." in ex["answer"], (report, ex["answer"])
    assert n == 30
    with pytest.raises(ValueError, match="thought_sighting"):
        replace(base, thought_sighting="reverse")
