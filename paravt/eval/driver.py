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
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paravt.agent.episode import EpisodeConfig, EpisodeSample, OverviewCache, run_episode
from paravt.agent.tools import CropConfig, check_tools
from paravt.core.config import check_run_paths, parse_cli
from paravt.core.metrics import append_jsonl, json_line, read_jsonl
from paravt.core.prompts import AGENTIC_MODES
from paravt.core.scoring import episode_well_formed, extract_mcq_letter, recall_at
from paravt.core.scoring import score as score_completion
from paravt.engines.factory import build_engine
from paravt.data.schema import DataError
from paravt.eval.judge import MCQJudge, MCQJudgeConfig
from paravt.eval.splits import HUB_IDS, SPLITS, EvalSample, LoadReport, count_check, load_split, read_srt, splits_table

log = logging.getLogger("paravt.eval")

FORCE_MCQ = "Time is up. Answer now with only the letter of the correct option."
FORCE_TVG = "Time is up. Answer now with the time span only, as 'X.X - Y.Y seconds'."


# qwen-vl-utils' default video frame bounds (VIDEO_MIN_PIXELS = 128*28*28, VIDEO_MAX_PIXELS = 768*28*28),
# which the authors' eval driver leaves in place when it samples the overview.
QWEN_VL_UTILS_VIDEO_PIXELS = (128 * 28 * 28, 768 * 28 * 28)
OVERVIEW_PROTOCOLS = {
    "release": {"style": "release_eval", "think_prefix": False, "min_pixels": QWEN_VL_UTILS_VIDEO_PIXELS[0],
                "max_pixels": QWEN_VL_UTILS_VIDEO_PIXELS[1]},
    "paravt": {"style": "paravt", "think_prefix": True, "min_pixels": 784, "max_pixels": 50176},
}


RESUME_MODES = ("auto", "restart", "force", "never")


class ResumeMismatch(RuntimeError):
    """Existing results of a split were produced with other settings."""


def weights_fingerprint(model: str) -> str:
    """A fast fingerprint of a checkpoint's weight files (name, size, first and last MiB of each;
    16 GB of 8B weights are not hashed in full); a hub id or missing path is fingerprinted by name."""
    import hashlib  # noqa: PLC0415

    p = Path(model)
    files = sorted(list(p.glob("*.safetensors")) + list(p.glob("*.bin"))) if p.is_dir() else []
    if not files:
        return "name:" + model
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
            if size > (2 << 20):
                fh.seek(-(1 << 20), os.SEEK_END)
                h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def _git_commit() -> str | None:
    import subprocess  # noqa: PLC0415

    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                           cwd=Path(__file__).resolve().parent)
        return r.stdout.strip() or None if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


#: EvalConfig fields that do not change a split's answers (where results go, how fast and how
#: loudly the run goes, how lost samples are judged, where the data is found). Every other field,
#: nested ones included, is part of the resume identity: a new setting is in it by default.
IDENTITY_EXCLUDED = frozenset({
    "row", "out", "splits", "data_root", "split_paths", "hub", "concurrency", "limit", "progress", "resume",
    "save_trajectory", "trajectory_thumbnails", "max_error_fraction", "retries", "shard_id", "num_shards",
    "server.urls", "server.base_port", "server.restart_between_datasets", "server.python",
    "mcq_judge.api_key_env", "mcq_judge.timeout_s",
})


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and all(isinstance(x, str) for x in v):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def run_identity(cfg: "EvalConfig", split: str) -> dict[str, Any]:
    """Everything that changes a split's answers; resuming requires it to match. Derived from the
    config: every field except :data:`IDENTITY_EXCLUDED` (and their sub-fields), plus the weights'
    fingerprint and the derived tool switch."""
    from dataclasses import asdict  # noqa: PLC0415

    flat = _flatten(asdict(cfg))
    keep = {k: v for k, v in flat.items()
            if not any(k == x or k.startswith(x + ".") for x in IDENTITY_EXCLUDED)}
    return {"split": split, "weights": weights_fingerprint(str(cfg.model)), "use_tools": cfg.agentic,
            "shard": [cfg.shard_id, cfg.num_shards], **keep}


def bootstrap_stderr(values: list[float], seed: int = 0, n_boot: int = 1000) -> float:
    """Standard error of the mean by a seeded bootstrap (as lmms-eval reports per metric)."""
    import numpy as np  # noqa: PLC0415

    if len(values) < 2:
        return 0.0
    x = np.asarray(values, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(n_boot, len(x)))
    return float(x[idx].mean(axis=1).std(ddof=1))


@dataclass
class ServerConfig:
    # none: use server.urls | sglang: launch SGLang (.venv-sglang) | vllm: launch vLLM (.venv-vllm; the
    # launcher passes --served-model-name, --trust-request-mm-kwargs and --allowed-local-media-path, which
    # the client needs for K on video_url and file:// videos)
    launch: str = "none"
    urls: list[str] = field(default_factory=list)  # existing servers (round-robin)
    # The name sent in chat requests: None = the server's own (read from /v1/models). vLLM answers
    # 404 to any other name; launch vLLM with --served-model-name and, for file:// videos on the
    # video_url channel, --allowed-local-media-path /data (see docs/GUIDE.md "Evaluation").
    model_name: str | None = None
    # --enable-deterministic-inference for launched SGLang servers: sampling seeds honoured (slower);
    # greedy eval (temperature 0) does not need it.
    deterministic: bool = False
    replicas: int = 1  # SGLang servers launched (one per GPU group)
    base_port: int = 30000  # port of the first launched server
    gpus_per_replica: int = 1  # GPUs (tensor parallel) per server
    restart_between_datasets: bool = True  # a fresh server per split (long sessions dropped connections)
    python: str | None = None  # the server's venv interpreter (null: .venv-sglang or .venv-vllm)
    dtype: str | None = None  # serving dtype (null: bfloat16 for SGLang, auto for vLLM; float32 on a CPU vLLM)
    enforce_eager: bool = False  # vLLM --enforce-eager (the CPU build needs it)
    kv_cache_gb: int | None = None  # vLLM CPU build: VLLM_CPU_KVCACHE_SPACE (GiB)
    extra_args: list[str] = field(default_factory=list)  # more server flags

    def __post_init__(self):
        if self.launch not in ("none", "sglang", "vllm"):
            raise ValueError(f"server.launch must be none, sglang or vllm, got {self.launch!r}")
        if self.replicas < 1 or self.gpus_per_replica < 1:
            raise ValueError("server.replicas and server.gpus_per_replica must be >= 1")


@dataclass
class HubConfig:
    """Where a split is looked up when data_root/<dir> does not hold it (python -m paravt.eval.fetch)."""
    source: str = "auto"  # auto: data_root first, then the Hugging Face cache | local: data_root only | hub: the cache only
    download: bool = False  # true: download + extract a split the cache lacks on first use (the release does; GBs)
    cache_dir: str | None = None  # Hub cache; null: HF_HUB_CACHE, else $HF_HOME/hub
    media_root: str | None = None  # extracted videos; null: $HF_HOME/<the split's media dir> (lmms-eval's folders)
    progress: bool = True  # progress bars of downloads and extraction

    def __post_init__(self):
        if self.source not in ("auto", "local", "hub"):
            raise ValueError(f"hub.source must be auto, local or hub, got {self.source!r}")


@dataclass
class EvalConfig:
    model: str = "???"  # checkpoint dir or hub id (hf backend / server launch)
    row: str = "model"  # the Table-1 row name used in the output path
    backend: str = "hf"  # hf | openai
    prompt_mode: str = "agentic_general"  # direct | reasoning | agentic_general | agentic_minimal | any configs/prompts/*.txt
    use_tools: bool | None = None  # None: on for agentic_* modes; set true for a tool-using baseline-native mode
    channel: str = "image_url"  # image_url (client-side frames) | video_url (server-side decode)
    # splits to run (names or Hub ids; the table at the end): videomme, videomme_sub (Video-MME test, without/with
    # subtitles), longvideobench (validation), lvbench (test), mlvu (dev), mmvu (validation), charades_sta (test), synthetic (the tiny world)
    splits: list[str] = field(default_factory=lambda: ["synthetic"])
    data_root: str = "data/benchmarks"  # benchmarks live under data_root/<split dir>, else in the Hub cache (hub.*)
    hub: HubConfig = field(default_factory=HubConfig)
    split_paths: dict[str, str] = field(default_factory=dict)  # per-split folder overrides, e.g. {synthetic: DIR}
    out: str = "runs/eval"  # results: <out>/<row>/<channel>/<split>.jsonl + summaries
    nframes: int = 64  # overview frames K
    max_turns: int = 3  # tool rounds (0: no tools)
    max_parallel: int = 5  # tool calls executed per turn (extra ones dropped)
    max_new_tokens: int = 2048  # tokens per turn
    temperature: float = 0.0  # 0 = greedy
    frequency_penalty: float = 0.0  # main agent: logit - penalty x count of the token so far in the turn (OpenAI/vLLM/SGLang); 0 = off (paper)
    presence_penalty: float = 0.0  # main agent: logit - penalty if the token occurred in the turn; 0 = off (paper)
    # Overview protocol. release (the authors' eval driver, used for Table 1): K frames as bare
    # images at qwen-vl-utils' default video pixel bounds (100352-602112 px), no timestamps, no
    # "Video/Duration" header, no forced "<think>\n". paravt: 784-50176 px, "<t seconds>" before
    # each frame, the header, "<think>\n" forced (the RL training format; the tiny quickstart).
    overview: str = "release"
    think_prefix: bool | None = None  # None: the protocol's (release: off, paravt: on)
    overview_min_pixels: int | None = None  # None: the protocol's
    overview_max_pixels: int | None = None  # None: the protocol's
    subtitle_max_chars: int | None = None  # None: the whole SRT (as released); a cap saves context
    final_answer_tokens_mcq: int = 64  # token budget of the forced last answer (MCQ)
    final_answer_tokens_tvg: int = 128  # token budget of the forced last answer (grounding)
    crop: CropConfig = field(default_factory=lambda: CropConfig(mode="frames"))  # crop_video's settings
    # the main agent's tools in the agentic modes: key (a registered name or package.module:Class) -> that
    # tool's options (paravt.agent.tools); part of the resume identity like every other setting
    tools: dict[str, Any] = field(default_factory=lambda: {"crop_video": {}})
    concurrency: int = 8  # samples in flight
    shard_id: int = 0  # this process's shard
    num_shards: int = 1  # shards a split is divided into
    limit: int | None = None  # first N samples of each split (null: all)
    save_trajectory: bool = False  # keep every turn in the JSONL (frames replaced by a note)
    trajectory_thumbnails: int = 0  # with save_trajectory: keep the overview frames as JPEG thumbnails of this size (px)
    # Lost samples (a missing video; an engine, server, video or tool failure; not the model's own bad
    # answers or calls) allowed per split before the run exits non-zero: 0.0 = any lost sample fails the
    # run. Lost samples are retried on resume and count as wrong in the headline accuracy.
    max_error_fraction: float = 0.0
    # Optional LLM-judge fallback for MCQ replies with no extractable letter: reported as
    # accuracy_with_judge beside the strict accuracy, never in place of it (paravt.eval.judge).
    mcq_judge: MCQJudgeConfig = field(default_factory=MCQJudgeConfig)
    retries: int = 3  # retries of one server request after its first attempt (backoff 1, 2, 4 s); episodes are not retried
    dtype: str = "float32"  # in-process engine dtype
    server: ServerConfig = field(default_factory=ServerConfig)
    progress: bool = True  # tqdm progress bar
    # Resuming a split reuses its finished samples only when its run_config.json (model + weights
    # fingerprint, K, prompt/overview/crop modes, token limits, ...) matches this run.
    # auto: refuse on a mismatch; restart: move the old results aside and start over on a mismatch;
    # force: reuse them anyway; never: always start over.
    resume: str = "auto"

    def __post_init__(self):
        if self.model in ("", "???") and self.backend == "hf":
            raise ValueError("model is required")
        if self.backend not in ("hf", "openai"):
            raise ValueError(f"backend must be hf or openai, got {self.backend!r}")
        if self.resume not in RESUME_MODES:
            raise ValueError(f"resume must be one of {RESUME_MODES}, got {self.resume!r}")
        if self.overview not in OVERVIEW_PROTOCOLS:
            raise ValueError(f"overview must be one of {sorted(OVERVIEW_PROTOCOLS)}, got {self.overview!r}")
        if self.channel not in ("image_url", "video_url"):
            raise ValueError(f"channel must be image_url or video_url, got {self.channel!r}")
        if self.channel == "video_url" and self.backend == "hf":
            raise ValueError("channel=video_url needs a server that decodes video (backend=openai)")
        if not 0 <= self.shard_id < self.num_shards:
            raise ValueError(f"shard_id {self.shard_id} not in [0, num_shards={self.num_shards})")
        bad = [f"{k}={getattr(self, k)}" for k, ok in (
            ("nframes", self.nframes >= 1), ("max_turns", self.max_turns >= 0), ("max_parallel", self.max_parallel >= 1),
            ("max_new_tokens", self.max_new_tokens >= 1), ("temperature", self.temperature >= 0),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2), ("presence_penalty", -2 <= self.presence_penalty <= 2),
            ("concurrency", self.concurrency >= 1), ("retries", self.retries >= 0),
            ("limit", self.limit is None or self.limit >= 1)) if not ok]
        if bad:
            raise ValueError(f"{', '.join(bad)}: need nframes, max_parallel, max_new_tokens, concurrency >= 1, "
                             "max_turns, temperature, retries >= 0, limit >= 1 or null, penalties in [-2, 2]")
        if not 0.0 <= self.max_error_fraction <= 1.0:
            raise ValueError(f"max_error_fraction must be in [0, 1], got {self.max_error_fraction}")
        if not self.splits:
            raise ValueError("splits is empty: name at least one split")
        check_tools(self.tools)
        unknown = [s for s in self.splits if s not in SPLITS and s not in HUB_IDS]
        if unknown:
            raise ValueError(f"unknown splits {unknown}; known: {sorted(SPLITS)} or the Hub ids {sorted(HUB_IDS)}")
        self.splits = list(dict.fromkeys(HUB_IDS.get(s, s) for s in self.splits))  # a Hub id names its split

    def check_inputs(self) -> None:
        """The model directory this run reads exists (checked at start, not in ``__post_init__``, so a
        config can be built on a machine without the model)."""
        if self.backend == "hf" or self.server.launch != "none":  # the model is read from disk here
            check_run_paths(self.model, model_key="model")

    @classmethod
    def help_epilogue(cls) -> str:
        return splits_table()

    @property
    def agentic(self) -> bool:
        if self.use_tools is not None:
            return self.use_tools
        return self.prompt_mode in AGENTIC_MODES or self.prompt_mode.startswith("agentic")


def episode_config(cfg: EvalConfig, qtype: str) -> EpisodeConfig:
    agentic = cfg.agentic
    force = FORCE_TVG if qtype == "tvg" else FORCE_MCQ if qtype == "mcq" else None
    proto = OVERVIEW_PROTOCOLS[cfg.overview]
    think = proto["think_prefix"] if cfg.think_prefix is None else cfg.think_prefix
    return EpisodeConfig(
        prompt_mode=cfg.prompt_mode, tools=cfg.tools if agentic else {}, max_turns=cfg.max_turns if agentic else 0,
        max_parallel=cfg.max_parallel, overview_channel=cfg.channel, think_prefix=think and cfg.prompt_mode != "direct",
        overview_style=proto["style"],
        overview_min_pixels=cfg.overview_min_pixels or proto["min_pixels"],
        overview_max_pixels=cfg.overview_max_pixels or proto["max_pixels"],
        temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, crop=cfg.crop,
        frequency_penalty=cfg.frequency_penalty, presence_penalty=cfg.presence_penalty,
        final_turn_prompt=force if agentic else None,
        final_turn_max_tokens=(cfg.final_answer_tokens_tvg if qtype == "tvg" else cfg.final_answer_tokens_mcq)
        if agentic and force else None)


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


def answer_readable(rec: dict[str, Any], qtype: str) -> bool:
    """The scored record holds an answer of the question's kind (mcq: a letter; tvg: a span; oe: text)."""
    if qtype == "mcq":
        return extract_mcq_letter(rec.get("pred") or "") is not None
    if qtype == "tvg":
        return rec.get("pred_span") is not None
    return bool(str(rec.get("pred") or "").strip())


def score(sample: EvalSample, completion: str) -> dict[str, Any]:
    """The record fields of :func:`paravt.core.scoring.score` (``score``: correct for mcq/oe, IoU for tvg)."""
    sc = score_completion(completion, sample.answer, sample.question_type, "f1")
    if sample.question_type == "tvg":
        return {"pred": sc.pred, "pred_span": sc.span, "iou": sc.value, "score": sc.value}
    return {"pred": sc.pred, "correct": sc.value, "score": sc.value}


def summarize(records: list[dict[str, Any]], metric: str = "accuracy") -> dict[str, Any]:
    """A split's summary. Samples that did not run (video missing, engine/server/tool failure) are
    **lost**: the headline numbers (``accuracy``, ``mIoU``, ``score``) count them as wrong, over every
    sample, as the paper's tables do; ``*_ran`` are the same numbers over the samples that ran."""
    done = [r for r in records if not r.get("missing_video") and not r.get("error")]
    n = len(done)
    out: dict[str, Any] = {"n": len(records), "evaluated": n,
                           "missing_video": sum(bool(r.get("missing_video")) for r in records),
                           "errors": sum(bool(r.get("error")) for r in records)}
    out["lost"] = len(records) - n
    lost = [r for r in records if r.get("missing_video") or r.get("error")]
    if lost:
        r0 = lost[0]
        out["first_error"] = (str(r0["error"]) if r0.get("error") else f"video not found: {r0['missing_video']}")[:500]
    cls = [r for r in done if r["question_type"] != "tvg"]
    tvg = [r for r in done if r["question_type"] == "tvg"]
    n_cls_all = sum(r["question_type"] != "tvg" for r in records)
    n_tvg_all = sum(r["question_type"] == "tvg" for r in records)
    if cls:
        out["accuracy_ran"] = sum(r["correct"] for r in cls) / len(cls)
        out["accuracy"] = sum(r["correct"] for r in cls) / n_cls_all
        judged = [r for r in cls if "judge_correct" in r or "judge_error" in r]
        if judged:  # the judge fallback, beside the strict score (paravt.eval.judge)
            out["judge"] = {"consulted": len(judged), "chose_letter": sum(bool(r.get("judge_pred")) for r in judged),
                            "chose_none": sum(r.get("judge_pred") == "" for r in judged),
                            "errors": sum("judge_error" in r for r in judged)}
            out["accuracy_with_judge"] = sum(r["correct"] or r.get("judge_correct", 0.0) for r in cls) / n_cls_all
    elif n_cls_all:
        out["accuracy"] = 0.0
    if tvg:
        ious = [r["iou"] for r in tvg]
        out["mIoU_ran"] = sum(ious) / len(ious)
        out["mIoU"] = sum(ious) / n_tvg_all
        out.update(recall_at(ious + [0.0] * (n_tvg_all - len(ious))))
    elif n_tvg_all:
        out["mIoU"] = 0.0
    out["score_ran"] = sum(r["score"] for r in done) / n if n else 0.0
    out["score"] = sum(r["score"] for r in done) / len(records) if records else 0.0
    out["avg_tool_calls"] = sum(r["tool_calls"] for r in done) / n if n else 0.0
    out["tool_usage_rate"] = sum(r["tool_calls"] > 0 for r in done) / n if n else 0.0
    out["format_compliance"] = sum(r.get("well_formed", False) for r in done) / n if n else 0.0
    per_sample = {"score": [r["score"] for r in done], "accuracy": [float(r["correct"]) for r in cls],
                  "mIoU": [r["iou"] for r in tvg], "tool_usage_rate": [float(r["tool_calls"] > 0) for r in done],
                  "format_compliance": [float(r.get("well_formed", False)) for r in done]}
    out["stderr"] = {k: bootstrap_stderr(v) for k, v in per_sample.items() if k in out and v}
    for key in ("question_type", "duration_bucket", "task"):
        groups = defaultdict(list)
        for r in done:
            if r.get(key):
                groups[r[key]].append(r)
        if len(groups) > 1 or (groups and key != "question_type"):
            out[f"by_{key}"] = {g: {"n": len(v), "score": sum(x["score"] for x in v) / len(v)}
                                for g, v in sorted(groups.items())}
    return out


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
        self.judge: MCQJudge | None = None  # the MCQ judge fallback's client, per split (its own event loop)

    # ------------------------------------------------------------------ engines
    def _start(self) -> None:
        """Engines through :func:`paravt.engines.factory.build_engine`: in-process, or one chat
        client per server URL / launched SGLang replica."""
        cfg = self.cfg
        if self.handles:  # built for an earlier split (clients reopen their sessions on the new loop)
            return
        if cfg.backend == "hf":
            h = build_engine("hf", cfg.model, dtype=cfg.dtype)
            self.handles, self.engine, self.processor = [h], h.engine, h.engine.processor
            return
        handles = [build_engine("openai", cfg.model, url=u, model_name=cfg.server.model_name,
                                max_retries=cfg.retries) for u in cfg.server.urls]
        if cfg.server.launch != "none":
            for i in range(cfg.server.replicas):
                handles.append(build_engine("openai", cfg.model, server=self._server_config(i),
                                            model_name=cfg.server.model_name, max_retries=cfg.retries))
        if not handles:
            raise ValueError("backend=openai needs server.urls or server.launch=sglang|vllm")
        self.handles = handles
        self.engine = [h.engine for h in handles]
        if self.processor is None and cfg.model not in ("", "???") and Path(cfg.model).exists():
            from paravt.models.loading import load_processor  # noqa: PLC0415
            self.processor = load_processor(cfg.model)

    def _server_config(self, i: int):
        """Launch settings of replica ``i`` (``server.launch`` = sglang | vllm)."""
        cfg, sv = self.cfg, self.cfg.server
        g = sv.gpus_per_replica
        common = dict(port=sv.base_port + i, gpus=list(range(i * g, (i + 1) * g)), tp_size=g,
                      served_model_name=sv.model_name or cfg.row, extra_args=list(sv.extra_args),
                      log_file=str(self.root / f"{sv.launch}_{i}.log"))
        if sv.python:
            common["python"] = sv.python
        if sv.dtype:
            common["dtype"] = sv.dtype
        if sv.launch == "vllm":
            from paravt.engines.vllm import VLLMServerConfig  # noqa: PLC0415
            return VLLMServerConfig(enforce_eager=sv.enforce_eager, cpu_kvcache_space_gb=sv.kv_cache_gb, **common)
        from paravt.engines.sglang import SGLangServerConfig  # noqa: PLC0415
        # SGLang's Qwen-VL video path reads K only from the server's launch config (one K per server).
        return SGLangServerConfig(deterministic=sv.deterministic, **common,
                                  video_nframes=cfg.nframes if cfg.channel == "video_url" else None)

    def _stop_servers(self) -> None:
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
    def _load(self, split: str) -> list[EvalSample]:
        reports: list[LoadReport] = []
        samples = load_split(split, self.cfg.data_root, self.cfg.split_paths.get(split), self.cfg.hub, reports)
        warn = count_check(split, len(samples))
        print(f"[eval] {reports[0].line(len(samples))}" + (f" -- WARNING {warn}" if warn else ""), flush=True)
        if warn:
            log.warning(warn)
        samples = samples[self.cfg.shard_id::self.cfg.num_shards]
        return samples[: self.cfg.limit] if self.cfg.limit else samples

    async def _one(self, i: int, s: EvalSample, cache: OverviewCache) -> dict[str, Any]:
        cfg = self.cfg
        rec: dict[str, Any] = {"id": s.id, "split": s.split, "question_type": s.question_type, "answer": s.answer,
                               "duration_bucket": s.duration_bucket, "task": s.task, "tool_calls": 0}
        if not s.video_exists:
            rec.update({"missing_video": s.video})
            return rec
        question = s.question
        if s.subtitle:
            subs = read_srt(s.subtitle, cfg.subtitle_max_chars)
            if subs:
                question = f"This video's subtitles are listed below:\n{subs}\n\n{question}"
        sample = EpisodeSample(s.id, question, s.video, s.duration, s.answer, s.question_type)
        ecfg = episode_config(cfg, s.question_type)
        t0 = time.perf_counter()
        try:  # the engine already retried each request (paravt.engines.http.retry): no second loop here
            traj = await run_episode(sample, self._engine_for(i), self.processor, ecfg, cfg.nframes, seed=0, cache=cache)
        except Exception as exc:  # noqa: BLE001 - one bad sample must not stop the run
            rec["error"] = f"{type(exc).__name__}: {exc}"
            return rec
        faults = traj.faults
        if cfg.channel == "video_url" and traj.served_prompt_ids is not None and self.processor is not None:
            rec["video_frames"], problem = served_video_frames(traj.served_prompt_ids, self.processor, cfg.nframes,
                                                               s.video)
            if problem:
                faults = [problem] + faults
        if faults:  # lost to the engine, server, video or a tool bug: an error, never a silent 0
            rec["error"] = faults[0] + (f" (+{len(faults) - 1} more)" if len(faults) > 1 else "")
            if traj.end_reason == "error":
                return rec
        rec.update(score(s, traj.completion_text))
        if self.judge is not None and s.question_type == "mcq" and extract_mcq_letter(rec["pred"] or "") is None:
            try:  # no letter for the strict scorer: the judge's reading goes beside it, never over it
                letter = await self.judge(s.question, traj.completion_text, len(s.options) or 4)
                rec["judge_pred"], rec["judge_correct"] = letter or "", float(letter is not None and letter == s.answer)
            except Exception as exc:  # noqa: BLE001 - a failed judge leaves the strict score as it is
                rec["judge_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rec.update({"tool_calls": traj.stats["tool_calls"], "turns": len(traj.turns), "end_reason": traj.end_reason,
                    # direct prompts have no tool structure to follow: compliant = an answer of the
                    # question's kind was read (a letter, a span, a non-empty text)
                    "well_formed": episode_well_formed([t.text for t in traj.turns])
                    if cfg.prompt_mode != "direct" else answer_readable(rec, s.question_type), "seconds": round(time.perf_counter() - t0, 3)})
        if cfg.save_trajectory:
            rec["trajectory"] = traj.redacted(thumbnails=cfg.trajectory_thumbnails)
            rec["trajectory"].update({"question": s.question, "question_type": s.question_type, "answer": s.answer,
                                      "span": s.span or (s.answer if s.question_type == "tvg" else None),
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
        record = {"identity": ident, "git_commit": _git_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
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

    def run(self) -> dict[str, Any]:
        results = {}
        for k, split in enumerate(self.cfg.splits):
            self._start()
            try:
                results[split] = asyncio.run(self._split_then_close(split))
            except ResumeMismatch:
                raise
            except (FileNotFoundError, DataError) as exc:  # this split cannot run; the others still do
                log.error("%s", exc)
                results[split] = {"error": " ".join(str(exc).split())}
            finally:
                if self.cfg.server.restart_between_datasets and self.cfg.server.launch != "none":
                    self._stop_servers()
        self._stop_servers()
        all_path = Path(self.cfg.out) / "summary_all.json"
        merged = json.loads(all_path.read_text()) if all_path.exists() else {}
        merged.setdefault(self.cfg.row, {})[self.cfg.channel] = results
        _atomic_json(all_path, merged)
        (Path(self.cfg.out) / "summary.md").write_text(markdown_table(merged))
        return results


def headline(summary: dict[str, Any]) -> float | None:
    if "accuracy" in summary and "mIoU" in summary:  # mixed split (synthetic): mean score
        return summary["score"]
    for k in ("accuracy", "mIoU"):
        if k in summary:
            return summary[k]
    return None


def markdown_table(merged: dict[str, Any]) -> str:
    splits = sorted({s for row in merged.values() for ch in row.values() for s in ch})
    lines = ["| row | channel | " + " | ".join(splits) + " |", "|---|---|" + "---|" * len(splits)]
    for row, chans in merged.items():
        for ch, res in chans.items():
            cells = []
            for s in splits:
                v = headline(res.get(s, {})) if s in res else None
                extra = res.get(s, {})
                tools = extra.get("avg_tool_calls")
                cells.append("" if v is None else f"{100 * v:.1f}" + (f" ({tools:.1f} calls)" if tools else ""))
            lines.append(f"| {row} | {ch} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
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


def lost_work(results: dict[str, dict[str, Any]], max_error_fraction: float = 0.0) -> list[str]:
    """One line per split that lost work: it did not run, it had no samples, or more of its samples
    were lost (video missing; engine, server, video or tool failure) than ``max_error_fraction`` allows."""
    out = []
    for split, r in results.items():
        if "n" not in r:
            out.append(f"{split}: did not run: {r.get('error', 'unknown error')}")
        elif r["n"] == 0:
            out.append(f"{split}: no samples to evaluate")
        elif r.get("lost", r.get("errors", 0)) > max_error_fraction * r["n"]:
            out.append(f"{split}: {r.get('lost', r.get('errors', 0))} of {r['n']} samples lost "
                       f"({r.get('missing_video', 0)} without their video, {r.get('errors', 0)} failed; "
                       f"max_error_fraction={max_error_fraction:g}); first: {r.get('first_error')}")
    return out


if __name__ == "__main__":
    sys.exit(main())
