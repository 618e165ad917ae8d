"""Can the model SEE? Probe the sub-agent on the held-out synthetic videos.

    python -m paravt.analysis.probe --model runs/quickstart/sft/final --world runs/quickstart/world

For each eval event the crop_video tool (sub-agent mode, greedy) summarises three windows:

* ``event``: the event ± 6 s (up to 16 frames at 1 fps; the event is in 2-4 of them),
* ``short``: 2 s centred on the event (2 frames, both usually on the event),
* ``empty``: 8 s away from every event.

Reported: colour accuracy (the first colour word in the summary is the event's colour; chance
is 1/8), colour+shape accuracy, the rate at which empty windows are called empty, and the rate
at which a summary's times fall inside its window. A model that learned only the format scores
chance on colour and 0 or 1 on "empty" whatever it sees. The features section reports the image
embedding norm against the text embedding norm and how much the logits move when every pixel is
zeroed: a collapsed vision pathway shows a large near-constant image embedding and |Δlogit| ≈ 0.

Can the model READ? The ``reading`` section gives the model, as plain text, the reports a perfect
sub-agent writes for the coarse windows of fresh random videos plus a question
(``paravt.data.synthetic.lookup_example``, a split never trained on) and checks the greedy answer:
the restated shape is the question's, the colour and the times are copied from the matching
report. This is the main agent's last step with perfect perception: a model that cannot copy
from its context scores chance here (1/3 shape, 1/8 colour) however well its sub-agents see.

Does the model COPY at all? The ``copying`` section is format-free (no chat template, so it
works on any checkpoint, the random-init base included): teacher-forced next-token accuracy on
a world sentence ("A red circle is visible from 12.0 to 15.5 seconds.") the first time it
appears and again after three other sentences. A model with an induction circuit predicts the
repeat far better than the first occurrence (``repeat_gain`` > 0); a local n-gram model does not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path

import torch

from paravt.agent.tools import CropConfig, CropVideo, ToolContext, subagent_messages
from paravt.core.startup import ready
from paravt.core.toolcall import ToolCall
from paravt.data.schema import load_rl_rows
from paravt.core.seeding import py_rng
from paravt.data.synthetic.traces import where
from paravt.data.synthetic.rows import lookup_example
from paravt.data.synthetic.world import COLOURS, SHAPES, WorldConfig, make_spec
from paravt.engines.base import SamplingParams

SHAPE_RE = re.compile(r"\b(" + "|".join(SHAPES) + r")\b")
COLOUR_RE = re.compile(r"\b(" + "|".join(COLOURS) + r")\b")
TIME_RE = re.compile(r"(\d+(?:\.\d+)?) seconds|from (\d+(?:\.\d+)?) to")


def _windows(info: dict, events: list[dict], duration: float) -> dict[str, tuple[float, float]]:
    s, e = info["span"]
    mid = (s + e) / 2
    out = {"event": (max(0.0, s - 6.0), min(duration, e + 6.0)),
           "short": (max(0.0, mid - 1.0), min(duration, mid + 1.0))}
    # an 8 s window at least 1 s away from every event, scanning from the start
    t = 0.0
    while t + 8.0 <= duration:
        if all(t + 8.0 < ev["start"] - 1.0 or t > ev["end"] + 1.0 for ev in events):
            out["empty"] = (t, t + 8.0)
            break
        t += 1.0
    return out


def _times_inside(text: str, s: float, e: float) -> bool | None:
    nums = [float(x) for m in TIME_RE.finditer(text) for x in m.groups() if x]
    if not nums:
        return None
    return all(s - 0.6 <= x <= e + 0.6 for x in nums)


def summary_hits(text: str, colour: str, shape: str) -> dict[str, bool]:
    """What one sub-agent summary gets right: the first colour named is the event's; the colour is
    tied to the shape in either report wording (``WorldConfig.report_wording``: "A yellow circle is
    visible ..." or "The circle is yellow, visible ..."); no colour named at all (an empty window)."""
    m = COLOUR_RE.search(text)
    return {"colour": bool(m and m.group(1) == colour),
            "colour_shape": f"{colour} {shape}" in text or f"{shape} is {colour}" in text,
            "says_empty": m is None}


async def probe_summaries(engine, rows, world: dict, max_tokens: int) -> dict:
    tool = CropVideo(CropConfig(subagent_temperature=0.0, subagent_max_tokens=max_tokens))
    jobs, meta = [], []
    seen_videos: set[str] = set()
    for r in rows:
        info = r.extra_info
        vid = info["video_id"]
        events = world["videos"][vid]["events"]
        for kind, (s, e) in _windows(info, events, info["duration"]).items():
            if kind == "empty" and vid in seen_videos:
                continue
            ctx = ToolContext(r.video, info["duration"], engine, engine.processor, seed=0)
            jobs.append(tool.execute(ToolCall("crop_video", {"start_time": s, "end_time": e}), ctx))
            meta.append((kind, info, s, e))
        seen_videos.add(vid)
    results = await asyncio.gather(*jobs)
    stats: dict[str, dict[str, float]] = {}
    examples = []
    for (kind, info, s, e), res in zip(meta, results):
        st = stats.setdefault(kind, {"n": 0, "colour": 0, "colour_shape": 0, "says_empty": 0, "times_inside": 0, "times_n": 0})
        text = res.text
        st["n"] += 1
        got = summary_hits(text, info["colour"], info["shape"])
        for key in ("colour", "colour_shape", "says_empty"):
            st[key] += got[key]
        inside = _times_inside(text, s, e)
        if inside is not None:
            st["times_n"] += 1
            st["times_inside"] += inside
        if len(examples) < 6:
            examples.append({"window": kind, "span": [s, e], "gold": f"{info['colour']} {info['shape']} {info['span']}",
                             "summary": text})
    table = {}
    for kind, st in stats.items():
        n = max(st["n"], 1)
        table[kind] = {"n": st["n"], "colour_acc": round(st["colour"] / n, 3),
                       "colour_shape_acc": round(st["colour_shape"] / n, 3),
                       "says_empty": round(st["says_empty"] / n, 3),
                       "times_inside_window": round(st["times_inside"] / max(st["times_n"], 1), 3)}
    return {"windows": table, "examples": examples}


async def probe_reading(engine, cfg: WorldConfig, n: int, max_tokens: int = 96) -> dict:
    """Greedy answers to ``n`` text-only lookup tasks on fresh random videos (split "probe")."""
    r = py_rng(cfg.seed, "reading-probe")
    exs: list[dict] = []
    j = 0
    while len(exs) < n:
        ex = lookup_example(cfg, "probe", j, r)
        j += 1
        if ex is not None:
            exs.append(ex)
    tok = engine.processor.tokenizer
    jobs = []
    for ex in exs:
        msgs = [{"role": "user", "content": [{"type": "text", "text": ex["user"]}]}]
        text = engine.processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        jobs.append(engine.generate(tok(text, add_special_tokens=False)["input_ids"], None,
                                    SamplingParams(temperature=0.0, max_new_tokens=max_tokens)))
    outs = await asyncio.gather(*jobs)
    n_shape = n_colour = n_times = n_exact = 0
    examples = []
    for ex, out in zip(exs, outs):
        got = tok.decode(out.token_ids, skip_special_tokens=True).strip()
        q = ex["question"]
        first = got.split(".")[0]
        shapes = SHAPE_RE.findall(first)
        n_shape += bool(shapes) and shapes[0] == q["shape"]
        found = COLOUR_RE.findall(got.split("seconds")[-1] if q["question_type"] != "tvg" else first)
        n_colour += bool(found) and found[-1] == q["colour"]
        n_times += f"visible {where(ex['hits'])}" in got
        n_exact += got == ex["answer"]
        if len(examples) < 4:
            examples.append({"question": q["question"], "expected": ex["answer"], "got": got})
    k = max(len(exs), 1)
    return {"n": len(exs), "restated_shape_acc": round(n_shape / k, 3), "colour_acc": round(n_colour / k, 3),
            "times_copied": round(n_times / k, 3), "exact": round(n_exact / k, 3), "examples": examples}


@torch.no_grad()
def feature_stats(engine, rows, n: int = 8) -> dict:
    """Image embedding norm vs text embedding norm; |Δlogit| at the last prompt position when
    the pixels of a crop are zeroed."""
    from paravt.core.video import sample_crop  # noqa: PLC0415

    model, proc = engine.model, engine.processor
    norms_img, norms_txt, spread, dlogit = [], [], [], []
    for r in rows[:n]:
        s, e = r.extra_info["span"]
        frames = sample_crop(r.video, max(0.0, s - 6), e + 6)
        msgs = subagent_messages(frames, s - 6, e + 6)
        text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        inp = proc(text=[text], images=[f.image for f in frames], return_tensors="pt")
        feats = model.model.get_image_features(inp["pixel_values"], inp["image_grid_thw"], return_dict=True)
        img = torch.cat(list(feats.pooler_output), 0) if hasattr(feats, "pooler_output") else torch.cat(list(feats[0]), 0)
        norms_img.append(img.norm(dim=-1).mean().item())
        spread.append((img.std(0).norm() / img.mean(0).norm().clamp_min(1e-8)).item())
        norms_txt.append(model.get_input_embeddings()(inp["input_ids"]).norm(dim=-1).mean().item())
        base = model(**inp).logits[0, -1]
        zero = dict(inp)
        zero["pixel_values"] = torch.zeros_like(inp["pixel_values"])
        dlogit.append((model(**zero).logits[0, -1] - base).abs().mean().item())
    mean = lambda xs: round(sum(xs) / max(len(xs), 1), 4)  # noqa: E731
    return {"image_embedding_norm": mean(norms_img), "text_embedding_norm": mean(norms_txt),
            "image_feature_spread": mean(spread), "mean_abs_dlogit_pixels_zeroed": mean(dlogit)}


@torch.no_grad()
def copy_stats(model, tokenizer, cfg: WorldConfig, n: int = 40, fillers: int = 3) -> dict:
    """Teacher-forced accuracy on tokens 3.. of a world sentence at its first occurrence and at
    its repeat after ``fillers`` other sentences (fresh videos of the never-trained "probe" split)."""
    def sentence(ev) -> str:
        return f"A {ev.colour} {ev.shape} is visible from {ev.start:.1f} to {ev.end:.1f} seconds."

    sents = [sentence(ev) for j in range(n * (fillers + 1)) for ev in make_spec(cfg, "probe", j).events[:1]]
    first = repeat = total = 0
    for i in range(n):
        target, filler = sents[i * (fillers + 1)], sents[i * (fillers + 1) + 1: (i + 1) * (fillers + 1)]
        a = tokenizer(target, add_special_tokens=False).input_ids
        f = tokenizer(" " + " ".join(filler) + " ", add_special_tokens=False).input_ids
        ids = torch.tensor([a + f + a])
        pred = model(input_ids=ids).logits[0].argmax(-1)
        o = len(a) + len(f)
        for j in range(3, len(a)):
            first += int(pred[j - 1] == ids[0, j])
            repeat += int(pred[o + j - 1] == ids[0, o + j])
            total += 1
    return {"n": n, "tokens": total, "first_acc": round(first / max(total, 1), 3),
            "repeat_acc": round(repeat / max(total, 1), 3), "repeat_gain": round((repeat - first) / max(total, 1), 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--world", required=True, help="the synthetic world folder (world.json, local/)")
    p.add_argument("--limit", type=int, default=60, help="eval events probed (one question row per event)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", default=None, help="write the JSON result here too")
    a = p.parse_args(argv)
    from paravt.engines.hf import HFEngine  # noqa: PLC0415

    world = json.loads((Path(a.world) / "world.json").read_text())
    rows, _ = load_rl_rows([str(Path(a.world) / "local" / "paravt_eval_synth.parquet")])
    rows = [r for r in rows if r.extra_info["question_type"] == "oe"][: a.limit]
    engine = HFEngine.from_pretrained(a.model)
    ready()  # loaded: the collector runs again (paravt.core.startup)
    t0 = time.time()
    out = asyncio.run(probe_summaries(engine, rows, world, a.max_tokens))
    out["features"] = feature_stats(engine, rows)
    out["reading"] = asyncio.run(probe_reading(engine, WorldConfig(**world["config"]), a.limit))
    out["copying"] = copy_stats(engine.model, engine.processor.tokenizer, WorldConfig(**world["config"]))
    out["seconds"] = round(time.time() - t0, 1)
    out["model"] = a.model
    print(json.dumps(out, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    asyncio.run(engine.close())
    return 0


if __name__ == "__main__":
    sys.exit(main())
