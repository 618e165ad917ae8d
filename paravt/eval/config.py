"""The eval stage's typed config (:class:`EvalConfig`, composed from a recipe and ``key=value``
overrides by :func:`paravt.core.config.parse_cli`) and what it turns into: the episode settings of a
question (:func:`episode_config`) and the launch settings of a server (:meth:`ServerConfig.launch_config`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from paravt.agent.episode import EpisodeConfig
from paravt.agent.tools import CropConfig, check_tools
from paravt.core.config import check_choices, check_run_paths, choice
from paravt.core.prompts import AGENTIC_MODES, Channel
from paravt.eval.hub import HubConfig
from paravt.eval.judge import MCQJudgeConfig
from paravt.eval.splits import HUB_IDS, SPLITS, splits_table

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


Launch = Literal["none", "sglang", "vllm"]
Backend = Literal["hf", "openai"]
Resume = Literal["auto", "restart", "force", "never"]


@dataclass
class ServerConfig:
    # none: use server.urls | sglang: launch SGLang (.venv-sglang) | vllm: launch vLLM (.venv-vllm; the
    # launcher passes --served-model-name, --trust-request-mm-kwargs and --allowed-local-media-path, which
    # the client needs for K on video_url and file:// videos)
    launch: str = choice(Launch)
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
    # true: a fresh server per split, as the release runs (its single sessions dropped connections
    # silently past ~5 datasets). Here a lost request is a counted, retried sample, never a silent
    # drop, so one server serves every split of a run (and every cell of a reproduce_paper row).
    restart_between_datasets: bool = False
    python: str | None = None  # the server's venv interpreter (null: .venv-sglang or .venv-vllm)
    dtype: str | None = None  # serving dtype (null: bfloat16 for SGLang, auto for vLLM; float32 on a CPU vLLM)
    enforce_eager: bool = False  # vLLM --enforce-eager (the CPU build needs it)
    kv_cache_gb: int | None = None  # vLLM CPU build: VLLM_CPU_KVCACHE_SPACE (GiB)
    extra_args: list[str] = field(default_factory=list)  # more server flags

    def __post_init__(self):
        check_choices(self, "server")
        if self.replicas < 1 or self.gpus_per_replica < 1:
            raise ValueError("server.replicas and server.gpus_per_replica must be >= 1")

    def launch_config(self, i: int, served_name: str, log_dir: Path, video_nframes: int | None = None):
        """The launch settings of replica ``i`` as the engine factory takes them
        (:class:`paravt.engines.vllm.VLLMServerConfig` or :class:`paravt.engines.sglang.SGLangServerConfig`):
        port ``base_port + i``, GPUs ``[i*g, (i+1)*g)`` in tensor parallel, its log in ``log_dir``.
        ``video_nframes``: K for SGLang's server-side video decode (one K per server)."""
        g = self.gpus_per_replica
        common: dict[str, Any] = dict(port=self.base_port + i, gpus=list(range(i * g, (i + 1) * g)), tp_size=g,
                                      served_model_name=self.model_name or served_name, extra_args=list(self.extra_args),
                                      log_file=str(Path(log_dir) / f"{self.launch}_{i}.log"))
        common.update({k: v for k, v in (("python", self.python), ("dtype", self.dtype)) if v})
        if self.launch == "none":
            raise ValueError("server.launch is none: no server to launch")
        import dataclasses  # noqa: PLC0415

        from paravt.engines.registry import get_backend  # noqa: PLC0415

        settings = get_backend(self.launch).server_config  # the engine's own launch settings
        # each engine's knobs (vLLM: enforce_eager, KV cache; SGLang: deterministic, server-side K), by field name
        knobs = {"enforce_eager": self.enforce_eager, "cpu_kvcache_space_gb": self.kv_cache_gb,
                 "deterministic": self.deterministic, "video_nframes": video_nframes}
        own = {f.name for f in dataclasses.fields(settings)}
        return settings(**common, **{k: v for k, v in knobs.items() if k in own})


@dataclass
class EvalConfig:
    model: str = "???"  # checkpoint dir or hub id (hf backend / server launch)
    row: str = "model"  # the Table-1 row name used in the output path
    backend: str = choice(Backend)  # hf | openai
    prompt_mode: str = "agentic_general"  # direct | reasoning | agentic_general | agentic_minimal | any configs/prompts/*.txt
    use_tools: bool | None = None  # None: on for agentic_* modes; set true for a tool-using baseline-native mode
    channel: str = choice(Channel)  # image_url (client-side frames) | video_url (server-side decode)
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
    # Sampled eval: this many episodes per question (ids QID#sK), each seeded from sample_seed, the
    # question and its draw; needs temperature > 0. Summaries then give the distribution, not the
    # greedy mode: P(call), score when calling vs when answering without a call.
    samples_per_question: int = 1
    sample_seed: int = 0  # seeds every sampled request of the run (with the question id, draw, turn)
    frequency_penalty: float = 0.0  # main agent: logit - penalty x count of the token so far in the turn (OpenAI/vLLM/SGLang); 0 = off (paper)
    presence_penalty: float = 0.0  # main agent: logit - penalty if the token occurred in the turn; 0 = off (paper)
    # Overview protocol. release (the authors' eval driver, used for Table 1): K frames as bare
    # images at qwen-vl-utils' default video pixel bounds (100352-602112 px), no timestamps, no
    # "Video/Duration" header, no forced "<think>\n". paravt: 784-50176 px, "<t seconds>" before
    # each frame, the header, "<think>\n" forced (the RL training format; the tiny quickstart).
    overview: str = choice(*OVERVIEW_PROTOCOLS)
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
    resume: str = choice(Resume)

    def __post_init__(self):
        if self.model in ("", "???") and self.backend == "hf":
            raise ValueError("model is required")
        check_choices(self)  # backend, channel, overview, resume
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
        if self.samples_per_question < 1:
            raise ValueError(f"samples_per_question must be >= 1, got {self.samples_per_question}")
        if self.samples_per_question > 1 and self.temperature <= 0:
            raise ValueError(f"samples_per_question={self.samples_per_question} needs temperature > 0 "
                             "(greedy decoding gives the same episode every time)")
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
