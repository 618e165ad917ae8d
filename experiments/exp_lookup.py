"""Experiment: can the tiny text stack learn to look a value up in earlier reports?

    .venv-cpu/bin/python experiments/exp_lookup.py --steps 1500 --loss answer            # the setting of docs/RESULTS.md
    .venv-cpu/bin/python experiments/exp_lookup.py --steps 1500 --loss all --heads 8 --kv-heads 8 --head-dim 16

Text only, random init, the tiny model's tokenizer and Qwen3-VL text stack. One sequence: 1-N
reports in the world's own wording ("The circle is yellow, from 14.0 to 17.0 seconds."), then
"What colour is the square? The square is" -> the square's colour. Accuracy = greedy first token
of the answer colour, on 256 fresh sequences with the maximum number of reports (chance = 1/N).
Writes one JSON line per evaluation to --out.

Variants of the needle runs (RESULTS.md): ``--wording needle`` (one sighting among N window reports, the others
empty; answer = its colour, no key to match), ``needle_t`` (answer = its times, scored on every answer
token, i.e. greedy exact match), ``mcq`` (the option letter of an already named colour among four
random options: a key-matching lookup again).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from paravt.data.synthetic.world import COLOURS, SHAPES  # noqa: E402
from paravt.models.tiny import TinyShape, build_config, build_tokenizer  # noqa: E402


def make_needle(rng: random.Random, n_reports: int, times: bool = False) -> tuple[list[str], list[str]]:
    """One sighting among ``n_reports`` window reports (the others empty), the world's
    colour_first wording; the question names the shape, the answer copies colour (no key to match)."""
    shape, colour = rng.choice(SHAPES), rng.choice(list(COLOURS))
    hit = rng.randrange(n_reports)
    lines = []
    for i in range(n_reports):
        lo, hi = i * 30, i * 30 + 28
        if i == hit:
            a = rng.randrange(lo, hi - 5)
            b = f"{a + rng.randrange(1, 4)}.{rng.choice('05')}"
            a = f"{a}.{rng.choice('05')}"
            lines.append(f"A {colour} {shape} is visible from {a} to {b} seconds.")
        else:
            lines.append(f"From {lo}.0 to {hi}.5 seconds no coloured shape is visible.")
    if times:
        return [" ".join(lines) + f" When does the {colour} {shape} appear? It is visible from"], [f" {a} to {b} seconds."]
    return [" ".join(lines) + f" What colour is the {shape}? It is"], [" " + colour]


def make_multi(rng: random.Random, n_reports: int, wording: str, queries: int) -> tuple[list[str], list[str]]:
    """Reports, then ``queries`` questions each followed by its answer (multi-query recall): the
    pieces alternate prompt / answer so every answer word can carry the loss."""
    if wording in ("needle", "needle_t"):
        return make_needle(rng, n_reports, wording == "needle_t")
    if wording == "mcq":  # the option letter of a colour already named: match it among the options
        opts = rng.sample(list(COLOURS), 4)
        k = rng.randrange(4)
        shape = rng.choice(SHAPES)
        head = f"What colour is the {shape}?\n" + "\n".join(f"{l}. {o}" for l, o in zip("ABCD", opts))
        return [head + f"\nAnswer with the option letter. It is {opts[k]}, option"], [" " + "ABCD"[k]]
    shapes = rng.sample(SHAPES, n_reports)
    colours = rng.sample(list(COLOURS), n_reports)
    lines = []
    for s, c in zip(shapes, colours):
        a = rng.randrange(0, 110)
        b = a + rng.randrange(2, 9)
        lines.append(f"The {s} is {c}, from {a}.0 to {b}.0 seconds." if wording == "forward"
                     else f"A {c} {s} is visible from {a}.0 to {b}.0 seconds.")
    prompts, answers = [], []
    head = " ".join(lines)
    for q in range(queries):
        k = rng.randrange(n_reports)
        prompts.append((head if q == 0 else ".") + f" What colour is the {shapes[k]}? The {shapes[k]} is")
        answers.append(" " + colours[k])
    return prompts, answers


def make(rng: random.Random, n_reports: int, wording: str) -> tuple[str, str]:
    """Reports then one question (the evaluation sequence): (prompt, answer)."""
    prompts, answers = make_multi(rng, n_reports, wording, 1)
    return prompts[0], answers[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--reports", type=int, default=3)
    ap.add_argument("--curriculum", type=int, default=0, help="steps over which the report count grows 1 -> N")
    ap.add_argument("--loss", choices=["answer", "all"], default="answer")
    ap.add_argument("--wording", choices=["forward", "reverse", "needle", "needle_t", "mcq"], default="forward")
    ap.add_argument("--queries", type=int, default=1, help="questions per training sequence (each answered)")
    ap.add_argument("--copy-steps", type=int, default=0, help="first grow an induction circuit: random x, then x again")
    ap.add_argument("--copy-lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/exp_lookup.jsonl")
    a = ap.parse_args(argv)
    from transformers import Qwen3VLForConditionalGeneration

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    tok = build_tokenizer(0)
    half = a.head_dim // 2
    mrope = [half - 2 * (half // 3), half // 3, half // 3]
    shape = TinyShape(hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, head_dim=a.head_dim, mrope_section=mrope,
                      intermediate_size=3 * a.hidden)
    model = Qwen3VLForConditionalGeneration(build_config(shape, tok)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, a.warmup)))
    rng = random.Random(a.seed)
    pad = tok.pad_token_id or 0

    def batch(n_reports_fn, size):
        seqs, labs = [], []
        for _ in range(size):
            ps, ans = make_multi(rng, n_reports_fn(), a.wording, a.queries)
            ids, lab = [], []
            for p, an in zip(ps, ans):
                pi, ai = tok.encode(p, add_special_tokens=False), tok.encode(an, add_special_tokens=False)
                ids += pi + ai
                lab += ([-100] * len(pi) + ai) if a.loss == "answer" else pi + ai
            seqs.append(ids)
            labs.append(lab)
        L = max(map(len, seqs))
        x = torch.full((size, L), pad)
        y = torch.full((size, L), -100)
        m = torch.zeros((size, L), dtype=torch.long)
        for i, (s, lb) in enumerate(zip(seqs, labs)):
            x[i, :len(s)] = torch.tensor(s)
            y[i, :len(lb)] = torch.tensor(lb)
            m[i, :len(s)] = 1
        return x, y, m

    @torch.no_grad()
    def evaluate(n=256):
        model.eval()
        erng = random.Random(12345)
        ok = 0
        for _ in range(n // 64):
            items = [make(erng, a.reports, a.wording) for _ in range(64)]
            for p, ans in items:  # one at a time: no padding questions
                pi = tok.encode(p, add_special_tokens=False)
                ai = tok.encode(ans, add_special_tokens=False)
                logits = model(input_ids=torch.tensor([pi + ai])).logits[0, len(pi) - 1:-1]
                ok += int(logits.argmax(-1).tolist() == ai)  # every answer token (= greedy exact match)
        model.train()
        return ok / n

    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if a.copy_steps:  # the copy warm-up RESULTS.md records: prefix + x + x over ordinary tokens, loss on the 2nd x
        special = set(tok.all_special_ids)
        pool = [i for i in range(len(tok)) if i not in special]
        copt = torch.optim.AdamW(model.parameters(), lr=a.copy_lr)
        for step in range(1, a.copy_steps + 1):
            rows = []
            for _ in range(a.batch):
                pre = [rng.choice(pool) for _ in range(rng.randrange(0, 33))]
                x = [rng.choice(pool) for _ in range(rng.randrange(8, 33))]
                rows.append((pre + x + x, [-100] * (len(pre) + len(x)) + x))
            L = max(len(r[0]) for r in rows)
            xx = torch.full((a.batch, L), pad)
            yy = torch.full((a.batch, L), -100)
            mm = torch.zeros((a.batch, L), dtype=torch.long)
            for i, (ids, lab) in enumerate(rows):
                xx[i, :len(ids)], yy[i, :len(lab)], mm[i, :len(ids)] = torch.tensor(ids), torch.tensor(lab), 1
            loss = model(input_ids=xx, attention_mask=mm, labels=yy).loss
            copt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            copt.step()
            if step % 500 == 0:
                print(json.dumps({"copy_step": step, "loss": round(loss.item(), 3), "seconds": round(time.time() - t0)}),
                      flush=True)
    for step in range(1, a.steps + 1):
        def n_rep():
            if a.curriculum and step < a.curriculum:
                return 1 + rng.randrange(1 + (a.reports - 1) * step // a.curriculum)
            return rng.randrange(1, a.reports + 1)
        x, y, m = batch(n_rep, a.batch)
        loss = model(input_ids=x, attention_mask=m, labels=y).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % a.eval_every == 0 or step == a.steps:
            rec = {"step": step, "loss": round(loss.item(), 4), "acc": evaluate(), "seconds": round(time.time() - t0),
                   "args": vars(a)}
            print(json.dumps({k: v for k, v in rec.items() if k != "args"}), flush=True)
            with open(out, "a") as f:
                f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
