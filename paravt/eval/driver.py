"""Benchmark eval driver: ``python -m paravt.eval.driver [RECIPE.yaml] [key=value ...]``.

For each split: load the publisher's files (:mod:`paravt.eval.splits`), run every sample
through the **same episode function as RL** (:func:`paravt.agent.episode.run_episode`) in its
eval-style tool mode (crop frames go straight back to the main agent; greedy; ``max_turns``
rounds; at most ``max_parallel`` calls per turn; a forcing message at the last turn), score it
with the shared scorer, and append the result to ``<out>/<row>/<channel>/<split>.jsonl`` as
soon as it finishes. A rerun skips finished samples; summaries are written atomically
(``<split>.json``, ``summary_all.json``, ``summary.md``). ``shard_id/num_shards`` split a
dataset across processes; ``limit`` caps it; ``save_trajectory`` keeps every turn with
images replaced by "<N frame(s) omitted>". One bad sample records an error; the run goes on.

Backends: ``backend=hf`` (in-process engine, the embedded default) or ``backend=openai`` (an
OpenAI-compatible server: SGLang or vLLM; ``server.launch=sglang`` starts ``server.replicas``
SGLang servers, health-checks them and restarts them between datasets).

The stage in files: :mod:`paravt.eval.config` (the typed config), :mod:`paravt.eval.identity`
(the resume identity), this module (the run loop) and :mod:`paravt.eval.summary` (scores, summaries,
the lost-work check); what the results mean across cells and seeds is :mod:`paravt.analysis`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from paravt.agent.episode import EpisodeSample, OverviewCache, run_episode
from paravt.agent.tools import recipe_call_parser
from paravt.core.config import parse_cli
from paravt.core.metrics import append_jsonl, json_line, read_jsonl
from paravt.core.scoring import episode_well_formed, extract_mcq_letter
from paravt.data.schema import DataError
from paravt.engines.factory import build_engine
from paravt.eval.config import EvalConfig, episode_config
from paravt.eval.identity import ResumeMismatch, git_commit, run_identity
from paravt.eval.judge import MCQJudge
from paravt.eval.sample import BenchmarkItem
from paravt.eval.splits import LoadReport, count_check, load_split, read_srt
from paravt.eval.summary import answer_readable, lost_work, markdown_table, score, summarize

log = logging.getLogger("paravt.eval")

def served_video_frames(prompt_ids: list[int], processor, k: int, video: str) -> tuple[int, str | None]:
    """Frames of the one overview video in a server's prompt (video_url channel), and the problem
    when it is not the K that was asked (capped by the frames the file has). A Qwen3-VL server
    expands the template's ``<|vision_start|><|video_pad|><|vision_end|>`` into one
    ``<|vision_start|>…`` block per temporal group of ``temporal_patch_size`` frames."""
    from paravt.core.video import probe  # noqa: PLC0415

    tok = processor.tokenizer
    groups = prompt_ids.count(tok.convert_tokens_to_ids("<|vision_start|>")) - 1
    tps = int(getattr(processor.image_processor, "temporal_patch_size", 2) or 1)
    frames = groups * tps
    total = probe(video).num_frames
    want = min(k + (-k) % tps, total + (-total) % tps)  # both rounded up to whole temporal groups
    if frames != want:
        return frames, (f"the server gave the model {frames} overview frames, not K={k} (vLLM: launch with "
                        "--trust-request-mm-kwargs; SGLang: one K per server, --mm-process-config / "
                        "server.launch=sglang)")
    return frames, None


def _atomic_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


class Evaluator:
    def __init__(self, cfg: EvalConfig):
        self.cfg = cfg
        self.root = Path(cfg.out) / cfg.row / cfg.channel
        self.root.mkdir(parents=True, exist_ok=True)
        self.engine = None
        self.processor = None
        self.handles: list = []  # EngineHandle per engine (servers this run launched stop with them)
        self._owner: Evaluator | None = None  # the evaluator whose engines this one shares (adopt)
        self.judge: MCQJudge | None = None  # the MCQ judge fallback's client, per split (its own event loop)
        self.parser = recipe_call_parser(cfg.tools)  # how the well-formedness check reads the turns' tool calls

    # ------------------------------------------------------------------ engines
    def _start(self) -> None:
        """Engines through :func:`paravt.engines.factory.build_engine`: in-process, or one chat
        client per server URL / launched SGLang replica."""
        cfg = self.cfg
        if self.handles:  # built for an earlier split (clients reopen their sessions on the new loop)
            return
        if self._owner is not None:  # started once, by the evaluator that owns them, for every adopter
            self._owner._start()
            self.handles, self.engine, self.processor = self._owner.handles, self._owner.engine, self._owner.processor
            return
        if cfg.backend == "hf":
            h = build_engine("hf", cfg.model, dtype=cfg.dtype)
            self.handles, self.engine, self.processor = [h], h.engine, h.engine.processor
            return
        handles = [build_engine("openai", cfg.model, url=u, model_name=cfg.server.model_name,
                                max_retries=cfg.retries) for u in cfg.server.urls]
        if cfg.server.launch != "none":
            for i in range(cfg.server.replicas):
                vn = cfg.nframes if cfg.channel == "video_url" else None  # SGLang reads K only at launch
                handles.append(build_engine("openai", cfg.model, server=cfg.server.launch_config(i, cfg.row, self.root, vn),
                                            model_name=cfg.server.model_name, max_retries=cfg.retries))
        if not handles:
            raise ValueError("backend=openai needs server.urls or server.launch=sglang|vllm")
        self.handles = handles
        self.engine = [h.engine for h in handles]
        if self.processor is None and cfg.model not in ("", "???") and Path(cfg.model).exists():
            from paravt.models.loading import load_processor  # noqa: PLC0415
            self.processor = load_processor(cfg.model)

    def adopt(self, other: "Evaluator") -> None:
        """Use ``other``'s engines (its launched servers, or its in-process model) instead of starting
        new ones: the cells of one reproduce_paper row share them (:func:`engine_key` equal). They start
        when the first cell with samples left needs them, whichever evaluator that is."""
        self._owner = other._owner or other
        self.handles, self.engine, self.processor = other.handles, other.engine, other.processor

    def stop_engines(self) -> None:
        """Stop the servers this run launched (in-process engines are dropped)."""
        for h in self.handles:
            h.stop()
        self.handles, self.engine = [], None


    async def _split_then_close(self, split: str) -> dict[str, Any]:
        """One split on this event loop; the clients' HTTP sessions close with it."""
        self.judge = MCQJudge(self.cfg.mcq_judge) if self.cfg.mcq_judge.base_url else None
        try:
            return await self._run_split(split)
        finally:
            for h in self.handles:
                await h.aclose()
            if self.judge is not None:
                await self.judge.close()
                self.judge = None

    def _engine_for(self, i: int):
        return self.engine[i % len(self.engine)] if isinstance(self.engine, list) else self.engine

    # ------------------------------------------------------------------ one split
    def _load(self, split: str) -> list[BenchmarkItem]:
        reports: list[LoadReport] = []
        samples = load_split(split, self.cfg.data_root, self.cfg.split_paths.get(split), self.cfg.hub, reports)
        warn = count_check(split, len(samples))
        print(f"[eval] {reports[0].line(len(samples))}" + (f" -- WARNING {warn}" if warn else ""), flush=True)
        if warn:
            log.warning(warn)
        samples = samples[self.cfg.shard_id::self.cfg.num_shards]
        samples = samples[: self.cfg.limit] if self.cfg.limit else samples
        n = self.cfg.samples_per_question
        if n > 1:  # sampled eval: each question n times, each draw its own id (and so its own seeds)
            samples = [dataclasses.replace(s, id=f"{s.id}#s{k}") for s in samples for k in range(n)]
        return samples

    async def _one(self, i: int, item: BenchmarkItem, cache: OverviewCache) -> dict[str, Any]:
        cfg = self.cfg
        rec: dict[str, Any] = {"id": item.id, "split": item.split, "question_type": item.question_type,
                               "answer": item.answer, "duration_bucket": item.duration_bucket, "task": item.task,
                               "tool_calls": 0}
        if not item.video_exists:
            rec.update({"missing_video": item.video})
            return rec
        question = item.question
        if item.subtitle:
            subs = read_srt(item.subtitle, cfg.subtitle_max_chars)
            if subs:
                question = f"This video's subtitles are listed below:\n{subs}\n\n{question}"
        sample = EpisodeSample(item.id, question, item.video, item.duration, item.answer, item.question_type)
        episode_cfg = episode_config(cfg, item.question_type)
        t0 = time.perf_counter()
        try:  # the engine already retried each request (paravt.engines.http.retry): no second loop here
            traj = await run_episode(sample, self._engine_for(i), self.processor, episode_cfg, cfg.nframes,
                                     seed=cfg.sample_seed, cache=cache)
        except Exception as exc:  # noqa: BLE001 - one bad sample must not stop the run
            rec["error"] = f"{type(exc).__name__}: {exc}"
            return rec
        faults = traj.faults
        if cfg.channel == "video_url" and traj.served_prompt_ids is not None and self.processor is not None:
            rec["video_frames"], problem = served_video_frames(traj.served_prompt_ids, self.processor, cfg.nframes,
                                                               item.video)
            if problem:
                faults = [problem] + faults
        if faults:  # lost to the engine, server, video or a tool bug: an error, never a silent 0
            rec["error"] = faults[0] + (f" (+{len(faults) - 1} more)" if len(faults) > 1 else "")
            if traj.end_reason == "error":
                return rec
        rec.update(score(item, traj.completion_text))
        if self.judge is not None and item.question_type == "mcq" and extract_mcq_letter(rec["pred"] or "") is None:
            try:  # no letter for the strict scorer: the judge's reading goes beside it, never over it
                letter = await self.judge(item.question, traj.completion_text, len(item.options) or 4)
                rec["judge_pred"] = letter or ""
                rec["judge_correct"] = float(letter is not None and letter == item.answer)
            except Exception as exc:  # noqa: BLE001 - a failed judge leaves the strict score as it is
                rec["judge_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rec.update({"tool_calls": traj.stats["tool_calls"], "turns": len(traj.turns), "end_reason": traj.end_reason,
                    # direct prompts have no tool structure to follow: compliant = an answer of the
                    # question's kind was read (a letter, a span, a non-empty text)
                    "well_formed": episode_well_formed([t.text for t in traj.turns], self.parser)
                    if cfg.prompt_mode != "direct" else answer_readable(rec, item.question_type),
                    "seconds": round(time.perf_counter() - t0, 3)})
        if cfg.save_trajectory:
            rec["trajectory"] = traj.redacted(thumbnails=cfg.trajectory_thumbnails)
            rec["trajectory"].update({"question": item.question, "question_type": item.question_type,
                                      "answer": item.answer,
                                      "span": item.span or (item.answer if item.question_type == "tvg" else None),
                                      "score": rec.get("score")})
        return rec

    def _check_resume(self, split: str, out_jsonl: Path) -> dict[str, Any]:
        """Write ``<split>.run_config.json``; decide whether the existing results may be reused."""
        cfg = self.cfg
        ident = run_identity(cfg, split)
        cfg_path = self.root / f"{split}.run_config.json"
        has_results = out_jsonl.exists() and out_jsonl.stat().st_size > 0
        prev = json.loads(cfg_path.read_text()) if has_results and cfg_path.exists() else None
        old = (prev or {}).get("identity")
        diff = (sorted(k for k in set(ident) | set(old or {}) if (old or {}).get(k) != ident.get(k))
                if old is not None else ["(no run_config.json: results of unknown settings)"])
        if has_results and cfg.resume == "force" and diff:
            # The results keep the identity they were produced with; the forced reuse is noted.
            log.warning("%s: resume=force reuses results produced with other settings (%s)", split, ", ".join(diff))
            record = dict(prev or {"identity": None})
            record.setdefault("forced_resumes", []).append({"identity": ident, "differs": diff,
                                                            "date": time.strftime("%Y-%m-%dT%H:%M:%S")})
            _atomic_json(cfg_path, record)
            return record
        if has_results and cfg.resume != "force":
            if cfg.resume == "never" or diff:
                if cfg.resume == "auto":
                    raise ResumeMismatch(
                        f"{out_jsonl} holds results from other settings ({', '.join(diff)} differ). Use another "
                        "out= or row=, resume=restart to move them aside and start over, or resume=force to reuse them.")
                stamp = time.strftime("%Y%m%d-%H%M%S")
                for p in (out_jsonl, cfg_path):
                    if p.exists():
                        p.rename(p.with_name(p.name + f".{stamp}.bak"))
                log.warning("%s: starting over (%s); old results kept as *.%s.bak", split,
                            "resume=never" if cfg.resume == "never" else "settings changed: " + ", ".join(diff), stamp)
        record = {"identity": ident, "git_commit": git_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
                  "limit": cfg.limit}
        self.root.mkdir(parents=True, exist_ok=True)
        _atomic_json(cfg_path, record)
        return record

    async def _run_split(self, split: str) -> dict[str, Any]:
        cfg = self.cfg
        samples = self._load(split)
        out_jsonl = self.root / f"{split}.jsonl"
        run_config = self._check_resume(split, out_jsonl)
        done: dict[str, dict] = {}
        if out_jsonl.exists():
            # a torn line (a kill mid-write) is dropped with a warning: that sample is redone
            done.update({r["id"]: r for r in read_jsonl(out_jsonl) if isinstance(r, dict) and "id" in r})
            retry = [k for k, r in done.items() if r.get("error") or r.get("missing_video")]
            for k in retry:  # samples lost to a server, a tool or a missing video are tried again
                del done[k]
            # The file is rewritten with the kept records only (atomically): no torn line or stale
            # failure record stays in it, and each sample has one line.
            tmp = out_jsonl.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json_line(r) for r in done.values()))
            os.replace(tmp, out_jsonl)
            if retry:
                print(f"[eval] {split}: retrying {len(retry)} sample(s) lost in an earlier run", flush=True)
        todo = [(i, s) for i, s in enumerate(samples) if s.id not in done]
        if todo:  # a split whose samples are all finished loads no model and launches no server
            self._start()
        cache = OverviewCache(max_items=64)
        sem = asyncio.Semaphore(cfg.concurrency)
        bar = None
        if cfg.progress:
            from tqdm import tqdm  # noqa: PLC0415
            bar = tqdm(total=len(samples), initial=len(samples) - len(todo), desc=f"{cfg.row}/{split}", dynamic_ncols=True)

        async def job(i, s):
            async with sem:
                rec = await self._one(i, s, cache)
            append_jsonl(out_jsonl, [rec])  # strict JSON, whole line, fsynced
            done[s.id] = rec
            if bar is not None:
                bar.update(1)
        await asyncio.gather(*[job(i, s) for i, s in todo])
        if bar is not None:
            bar.close()
        records = [done[s.id] for s in samples if s.id in done]
        summary = summarize(records)
        summary.update({"split": split, "row": cfg.row, "channel": cfg.channel, "prompt_mode": cfg.prompt_mode,
                        "nframes": cfg.nframes, "config": run_config})
        _atomic_json(self.root / f"{split}.json", summary)
        if summary["lost"]:
            print(f"[eval] {split}: LOST {summary['lost']} of {summary['n']} samples ({summary['missing_video']} without "
                  f"their video, {summary['errors']} engine, server, video or tool failures; rerun to retry them; "
                  f"counted wrong in accuracy/mIoU/score, *_ran exclude them); first: {summary['first_error']}",
                  file=sys.stderr, flush=True)
        return summary

    def run(self, keep_engines: bool = False) -> dict[str, Any]:
        """Every split of the config; the engines this run started stop at the end unless
        ``keep_engines`` (the caller stops them: :meth:`stop_engines`)."""
        results = {}
        for k, split in enumerate(self.cfg.splits):
            try:
                results[split] = asyncio.run(self._split_then_close(split))
            except ResumeMismatch:
                raise
            except (FileNotFoundError, DataError) as exc:  # this split cannot run; the others still do
                log.error("%s", exc)
                results[split] = {"error": " ".join(str(exc).split())}
            finally:
                if self.cfg.server.restart_between_datasets and self.cfg.server.launch != "none":
                    self.stop_engines()
        if not keep_engines:
            self.stop_engines()
        all_path = Path(self.cfg.out) / "summary_all.json"
        merged = json.loads(all_path.read_text()) if all_path.exists() else {}
        merged.setdefault(self.cfg.row, {})[self.cfg.channel] = results
        _atomic_json(all_path, merged)
        (Path(self.cfg.out) / "summary.md").write_text(markdown_table(merged))
        return results


def engine_key(cfg: EvalConfig) -> tuple:
    """What the engines of a run depend on: two runs with equal keys can share them (one launched
    server, or one in-process model, for every cell of a row). ``None`` when they must not (the user
    asked for a fresh server per split)."""
    if cfg.server.restart_between_datasets and cfg.server.launch != "none":
        return (None, id(cfg))
    server = dataclasses.asdict(cfg.server)
    return (cfg.backend, cfg.model, cfg.dtype, cfg.channel, cfg.nframes if cfg.channel == "video_url" else None,
            json.dumps(server, sort_keys=True, default=str))


def main(argv: list[str] | None = None) -> int:
    from paravt.core.secrets import load_secrets  # noqa: PLC0415

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    load_secrets()  # HF_TOKEN (splits by Hub id), the judge's key: as the launch scripts read them
    cfg = parse_cli(EvalConfig, argv, "python -m paravt.eval.driver")
    try:
        cfg.check_inputs()
    except ValueError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    try:
        results = Evaluator(cfg).run()
    except ResumeMismatch as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: {m: v.get(m) for m in ("accuracy", "accuracy_ran", "accuracy_with_judge", "mIoU", "mIoU_ran",
                                              "avg_tool_calls", "tool_usage_rate", "evaluated", "lost",
                                              "missing_video", "errors", "error") if m in v} for k, v in results.items()},
                     indent=2))
    print((Path(cfg.out) / "summary.md").read_text())
    failed = lost_work(results, cfg.max_error_fraction)
    for line in failed:
        print(f"error: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
