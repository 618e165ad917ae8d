"""The paper's claims in the form the authors state them, each checked against a finished run.

* ``avg_relative_gain`` ("+7.9%"): the mean over the splits of (row − base) / base, in percent, from the
  two rows' measured cells (every split of both needed).
* ``split_value``: one measured cell against its published value.
* ``format_reward`` (f_τ, "0.13 → 0.64"): the mean training-time format reward of TWO runs, vanilla GRPO
  and PARA-GRPO (its mean and its peak), read from each run's ``metrics.jsonl`` (``reward/format`` of
  every step's rollouts). The run's recorded settings (the newest ``checkpoints/step_*/trainer_state.json``
  beside the metrics) must show the rollout temperature τ and the arm's method; a run that shows another
  τ, or the other arm's method, is not compared.
* ``best_open``: the row's measured cell against every other open row's published cell per split (a row
  measured in the same run stands in where nothing is published); a split with nothing to compare is
  undetermined. The claim holds when the row is best (ties share) on at least ``value`` splits.

Each result: PASS / FAIL (outside the tolerance) / n.a. (the run lacks what the claim needs; ``note`` says what).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paravt.eval.table1 import SpecError, measured


def relative_gain(row: dict, base: dict, splits: list[str]) -> tuple[float | None, list[str]]:
    """Mean of (row − base) / base over ``splits`` in percent, and the splits either row lacks."""
    gains, missing = [], []
    for s in splits:
        a, b = measured(row.get(s)), measured(base.get(s))
        if a is None or b is None or b == 0:
            missing.append(s)
        else:
            gains.append((a - b) / b)
    return (100 * sum(gains) / len(gains) if gains and not missing else None), missing


def read_metric(path: Path, key: str) -> list[float]:
    """``key`` of every step in a metrics.jsonl, in step order (a step logged twice keeps its last line)."""
    by_step: dict[Any, float] = {}
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}:{i}: not a JSON line ({exc.msg})") from exc
        v = rec.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            by_step[rec.get("step", i)] = float(v)
    return [by_step[k] for k in sorted(by_step, key=lambda s: (not isinstance(s, (int, float)), s))]


def run_settings(metrics: Path) -> dict | None:
    """The config the run recorded in its newest checkpoint beside ``metrics`` (None: none found)."""
    states = sorted((metrics.parent / "checkpoints").glob("step_*/trainer_state.json"))
    for p in reversed(states):
        try:
            return json.loads(p.read_text()).get("config")
        except (OSError, json.JSONDecodeError):
            continue
    return None


def _arm_problem(cfg: dict, arm: str, tau: float) -> str | None:
    """Why this run is not the ``arm`` run at ``tau`` (None: it is)."""
    t = (cfg.get("grpo") or {}).get("temperature")
    if t is not None and abs(float(t) - tau) > 1e-9:
        return f"rollouts sampled at temperature {t}, not {tau}"
    p = cfg.get("paravt") or {}
    weight = (p.get("anchoring") or {}).get("weight")
    gating = (p.get("gating") or {}).get("nframes_gating")
    para = bool(weight) or bool(gating)
    if arm == "vanilla" and para:
        return f"the vanilla run has PARA-GRPO parts on (anchoring.weight {weight}, nframes_gating {gating})"
    if arm == "paragrpo" and weight is not None and gating is not None and not para:
        return "the PARA-GRPO run has anchoring and gating off (a vanilla run)"
    return None


def format_reward_arm(path: str | None, arm: str, metric: str, tau: float) -> tuple[dict | None, str]:
    """(mean, peak, steps) of ``metric`` over the run at ``path``, or None with why."""
    if not path:
        return None, f"no {arm} metrics given (--{arm}_metrics RUN/metrics.jsonl)"
    p = Path(path)
    if not p.is_file():
        return None, f"{arm} metrics {p}: no such file"
    vals = read_metric(p, metric)
    if not vals:
        return None, f"{p}: no step has {metric}"
    cfg = run_settings(p)
    problem = _arm_problem(cfg, arm, tau) if cfg else None
    if problem:
        return None, f"{p}: {problem}"
    note = "" if cfg else f"{arm}: no recorded settings beside {p.name}, τ and arm not verified"
    return {"mean": sum(vals) / len(vals), "peak": max(vals), "steps": len(vals)}, note


def best_open(row: str, spec: dict, results: dict, exclude: tuple = ()) -> tuple[int, int, list[str], list[str]]:
    """(splits where ``row`` is best, splits compared, undetermined splits, splits where it is not best),
    from ``row``'s measured cells when it ran, else from its published ones (the paper's own numbers).
    The rivals are the table's other open rows, less ``exclude``."""
    mine = results.get(row)
    own_pub = next((r["published"] for r in spec["rows"] if r["row"] == row), {}) if mine is None else {}
    others = [r for r in spec["rows"] if r["row"] != row and r["row"] not in exclude]
    best = compared = 0
    undetermined, lost = [], []
    for s in spec["splits"]:
        v = measured(mine.get(s)) if mine is not None else (own_pub[s].value if s in own_pub else None)
        rivals = []
        for r in others:
            c = r["published"].get(s)
            x = c.value if c is not None else (measured(results[r["row"]].get(s)) if r["row"] in results else None)
            if x is not None:
                rivals.append(x)
        if v is None or not rivals:
            undetermined.append(s)
            continue
        compared += 1
        if v >= max(rivals) - 1e-9:
            best += 1
        else:
            lost.append(s)
    return best, compared, undetermined, lost


def check_claims(checks: list[dict], spec: dict, results: dict, metrics: dict[str, str | None],
                 user_rows: tuple = ()) -> list[dict]:
    """Every claim of ``checks`` against ``results`` (and the RL runs' ``metrics``, by arm). A claim copied
    onto a user's row carries ``like``: the table row it stands for (left out of that row's rivals)."""
    out = []
    for c in checks:
        kind, paper, got, note, status = c["kind"], "", None, "", "n.a."
        if kind == "avg_relative_gain":
            paper = f"{c['value']:+.1f}%"
            g, missing = relative_gain(results.get(c["row"], {}), results.get(c["baseline"], {}), spec["splits"])
            if g is None:
                note = f"needs {c['row']} and {c['baseline']} measured on every split; missing: {', '.join(missing)}"
            else:
                got, status = f"{g:+.1f}%", "PASS" if abs(g - c["value"]) <= c["tolerance"] else "FAIL"
        elif kind == "split_value":
            paper = f"{c['value']:.1f}"
            v = measured(results.get(c["row"], {}).get(c["split"]))
            if v is None:
                note = f"{c['row']} / {c['split']} not measured"
            else:
                got, status = f"{v:.1f}", "PASS" if abs(v - c["value"]) <= c["tolerance"] else "FAIL"
        elif kind == "format_reward":
            tau, tol = float(c["temperature"]), float(c["tolerance"])
            want = {"vanilla": c["vanilla"], "paragrpo": c["paragrpo"]}
            paper = "; ".join(f"{arm}: " + ", ".join(f"{k} {v:.2f}" for k, v in w.items()) for arm, w in want.items())
            arms, notes = {}, []
            for arm in want:
                arms[arm], why = format_reward_arm(metrics.get(arm), arm, c["metric"], tau)
                if why:
                    notes.append(why)
            note = "; ".join(notes)
            shown = [f"{arm}: " + ", ".join(f"{k} {m[k]:.2f}" for k in want[arm]) + f" ({m['steps']} steps)"
                     for arm, m in arms.items() if m is not None]
            got = "; ".join(shown) or None
            if all(m is not None for m in arms.values()):
                ok = all(abs(arms[a][k] - v) <= tol for a, w in want.items() for k, v in w.items())
                status = "PASS" if ok else "FAIL"
        elif kind == "best_open":
            need, like = int(c["value"]), c.get("like", c["row"])
            exclude = tuple(user_rows) + (like,)
            b, n, und, lost = best_open(like, spec, {}, tuple(user_rows))
            paper = f"best on {need} of {len(spec['splits'])} (published cells: best on {b} of {n} comparable" + \
                (f"; {', '.join(und)}: nothing to compare)" if und else ")")
            if c["row"] in results:
                b, n, und, lost = best_open(c["row"], spec, results, exclude)
                got = f"best on {b} of {n} comparable" + (f" (not on {', '.join(lost)})" if lost else "")
                note = f"undetermined: {', '.join(und)}" if und else ""
                status = "PASS" if b >= need else ("FAIL" if b + len(und) < need else "n.a.")
            else:
                note = f"{c['row']} not measured in this run"
        out.append({**c, "paper": paper, "got": got, "status": status, "note": note})
    return out


def claims_table(claims: list[dict], sources: dict) -> str:
    lines = ["| paper claim | source | paper | this run | status | note |", "|---|---|---|---|---|---|"]
    for c in claims:
        src = ", ".join(c.get("src", [])) or "n.a."
        lines.append(f"| {c['name']} | {src} | {c['paper']} | {c['got'] or 'n.a.'} | {c['status']} | {c['note']} |")
    return "\n".join(lines) + "\n"


__all__ = ["best_open", "check_claims", "claims_table", "format_reward_arm", "read_metric", "relative_gain",
           "run_settings"]
