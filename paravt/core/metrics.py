"""Metrics logging shared by the stages: plain JSONL (always), wandb (offline by default) and
PNG curves a person can look at."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterable, Literal

WandbMode = Literal["offline", "online", "disabled"]  # a recipe's logging.wandb_mode (WANDB_MODE wins)

log = logging.getLogger(__name__)


class MetricsLogger:
    """Append one JSON line per step to ``path``; mirror to wandb when it can start.

    On resume, lines with ``step >= resume_step`` are dropped first so the file never holds
    two records of one step."""

    def __init__(self, path: str | Path, enabled: bool = True, wandb_project: str | None = None,
                 wandb_mode: WandbMode | None = None, run_name: str | None = None, config: dict | None = None,
                 resume_step: int | None = None):
        self.path = Path(path)
        self.enabled = enabled
        self._wandb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            trim_jsonl(self.path, lambda r: r.get("step", -1) < resume_step)
        if wandb_project:
            # WANDB_MODE set by the user wins, then the config's logging.wandb_mode (the launchers set neither)
            mode = os.environ.get("WANDB_MODE") or wandb_mode or "offline"
            try:
                import wandb  # noqa: PLC0415

                # One wandb run per run directory: its id is kept beside the metrics, so a resumed run
                # (resume=auto after a crash or a kill) continues the same wandb run online.
                id_file = self.path.parent / "wandb_run_id"
                run_id = id_file.read_text().strip() if id_file.exists() else ""
                if not run_id:  # an identifier, not a draw that touches any result
                    import uuid  # noqa: PLC0415

                    run_id = uuid.uuid4().hex[:8]
                    id_file.write_text(run_id + "\n")
                common = dict(project=wandb_project, name=run_name, mode=mode, config=config or {},
                              dir=str(self.path.parent), reinit="finish_previous")
                self._wandb = None
                if mode == "online" and resume_step is not None and resume_step > 1:
                    # Rewind the online run to the last step kept in metrics.jsonl (steps from resume_step
                    # on are redone and logged again), as the JSONL was trimmed: wandb's resume_from. A
                    # server without rewind falls back to resume="allow", which keeps the old records of
                    # the redone steps and drops their new ones (warned).
                    try:
                        self._wandb = wandb.init(resume_from=f"{run_id}?_step={resume_step - 1}", **common)
                    except Exception as exc:  # noqa: BLE001
                        log.warning("wandb could not rewind run %s to step %d (%s): steps redone after this "
                                    "resume keep their first records in wandb; metrics.jsonl has the new ones",
                                    run_id, resume_step - 1, exc)
                if self._wandb is None:
                    # Offline, wandb ignores resume: each launch writes its own offline-run folder under
                    # this id, and steps redone after a resume appear in both; metrics.jsonl is the record.
                    self._wandb = wandb.init(id=run_id, resume="allow", **common)
            except Exception as exc:  # noqa: BLE001 - logging must never stop training
                log.warning("wandb disabled: %s", exc)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if not self.enabled:
            return
        rec = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        append_jsonl(self.path, [rec])
        if self._wandb is not None:
            try:
                self._wandb.log({k: v for k, v in rec.items() if isinstance(v, (int, float))}, step=step)
            except Exception as exc:  # noqa: BLE001
                log.warning("wandb log failed: %s", exc)

    def close(self) -> None:
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception:  # noqa: BLE001
                pass


def _jsonable(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# ---------------------------------------------------------------------------------------------
# Append-only JSONL outputs (metrics, RL trajectories, eval results): strict JSON, whole lines,
# tolerant readers. A kill -9 can tear at most the last line; readers drop it with a warning.
# ---------------------------------------------------------------------------------------------

def strict_json(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, ±Infinity) replaced by its text, so that
    ``json.dumps(..., allow_nan=False)`` writes standard JSON that every reader (browsers too) parses."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def json_line(obj: Any) -> str:
    return json.dumps(strict_json(obj), allow_nan=False, default=str) + "\n"


def append_jsonl(path: str | Path, records: Iterable[Any]) -> None:
    """Append whole lines and fsync them (a crash leaves at most a torn last line, never a lost one)."""
    data = "".join(json_line(r) for r in records)
    if not data:
        return
    with open(path, "a") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a line that does not parse (torn by a crash) is dropped with a warning."""
    p = Path(path)
    if not p.exists():
        return []
    out, bad = [], []
    for i, ln in enumerate(p.read_text(errors="replace").splitlines(), 1):
        if not ln.strip():
            continue
        try:
            out.append(json.loads(ln))
        except json.JSONDecodeError:
            bad.append(i)
    if bad:
        log.warning("%s: dropped %d unreadable line(s) (torn by a crash?): line %s", p, len(bad),
                    ", ".join(map(str, bad[:5])))
    return out


def trim_jsonl(path: str | Path, keep) -> int:
    """Rewrite ``path`` (atomically) with the records for which ``keep(record)`` is true; torn lines
    go too. Used on resume so a redone step replaces its records instead of doubling them.
    Returns the number of records dropped."""
    p = Path(path)
    if not p.exists():
        return 0
    recs = read_jsonl(p)
    kept = [r for r in recs if isinstance(r, dict) and keep(r)]
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text("".join(json_line(r) for r in kept))
    os.replace(tmp, p)
    return len(recs) - len(kept)


def plot_curves(jsonl: str | Path, keys: Iterable[str], out_png: str | Path, title: str = "",
                smooth: int = 1) -> Path | None:
    """One subplot per key (step on x); keys missing from the file are skipped."""
    rows = read_jsonl(jsonl)
    keys = [k for k in keys if any(r.get(k) is not None for r in rows)]
    if not rows or not keys:
        return None
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    n = len(keys)
    cols = min(3, n)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
    for ax, k in zip(axes.flat, keys):
        pts = [(r["step"], r[k]) for r in rows if r.get(k) is not None]
        xs, ys = zip(*pts)
        ax.plot(xs, ys, lw=1, alpha=0.5 if smooth > 1 else 1.0)
        if smooth > 1 and len(ys) >= smooth:
            sm = [sum(ys[max(0, i - smooth + 1): i + 1]) / len(ys[max(0, i - smooth + 1): i + 1]) for i in range(len(ys))]
            ax.plot(xs, sm, lw=2)
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
