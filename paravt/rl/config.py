"""The typed RL recipe. Every knob of the paper's RL setup (and of the release's recipe) has a
field; the 8B recipes set the paper's values, the tiny ones the embedded default's."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from paravt.agent.tools import CropConfig, check_tools
from paravt.core.config import check_choice, check_choices, check_dtype, check_run_paths, choice, require
from paravt.core.metrics import WandbMode
from paravt.core.prompts import PromptSource
from paravt.engines.registry import EngineBackend, backend_names, get_backend
from paravt.engines.sglang import SGLangServerConfig
from paravt.engines.vllm import VLLMServerConfig
from paravt.models.lora import LoraConfig
from paravt.rl.dynamic_sampling import check_dynamic_sampling
from paravt.rl.gating import DEFAULT_CHOICES, check_gating_choices
from paravt.rl.gtr_config import GTRConfig
from paravt.rl.loss_agg import LossAgg, check_loss_agg_norm
from paravt.rl.rewards.judge import JudgeConfig
from paravt.rl.rewards.terms import RewardKnobs


RewardMode = Literal["f1", "exact", "llm"]
RewardRules = Literal["release", "paravt"]
KLMode = Literal["reward_k1", "loss_k3"]
AdvNormLevel = Literal["token", "sequence"]
Correction = Literal["token", "sequence"]
WeightSync = Literal["auto", "broadcast", "disk"]
SyncBackend = Literal["auto", "nccl", "gloo"]
TrainStrategy = Literal["fsdp2", "none"]


@dataclass
class ConstrainedConfig:
    think_prefix: bool = True  # append "<think>\n" to every generation prompt
    answer_suffix: bool = True  # format reward weighs the answer tags more


@dataclass
class GatingConfig:
    nframes_gating: bool = True  # K ~ Uniform(choices) per prompt; off -> hierarchical_agent.nframes
    choices: list[int] = field(default_factory=lambda: list(DEFAULT_CHOICES))  # the K values drawn per prompt

    def __post_init__(self):
        check_gating_choices(self.choices)


@dataclass
class AnchoringConfig:
    weight: float = 0.5  # lambda_anchor


@dataclass
class RewardConfig:
    mode: str = choice(RewardMode)  # f1 | exact | llm
    format_weight: float = 1.0  # weight of R_fmt in R = R_acc + w R_fmt + w_tool R_tool
    credit_executed_tools: bool = False  # see paravt.rl.rewards.terms (R_tool decision)
    rules: str = choice(RewardRules)  # release (the authors' reward) | paravt (eval's scorer; see rewards.terms)
    # weight of R_tool: 1.0 as released; 0 pays calls only through accuracy (rewards.terms explains)
    tool_weight: float = 1.0

    def __post_init__(self):
        if self.tool_weight < 0:
            raise ValueError(f"paravt.reward.tool_weight must be >= 0, got {self.tool_weight}")
        check_choices(self, "paravt.reward")


@dataclass
class ParaVTConfig:
    constrained: ConstrainedConfig = field(default_factory=ConstrainedConfig)
    gating: GatingConfig = field(default_factory=GatingConfig)
    anchoring: AnchoringConfig = field(default_factory=AnchoringConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)

    def knobs(self) -> RewardKnobs:
        return RewardKnobs(answer_suffix=self.constrained.answer_suffix, anchor_weight=self.anchoring.weight,
                           mode=self.reward.mode, format_weight=self.reward.format_weight,
                           credit_executed_tools=self.reward.credit_executed_tools, rules=self.reward.rules,
                           tool_weight=self.reward.tool_weight)


@dataclass
class HierarchicalAgentConfig:
    nframes: int = 64  # overview frames when gating is off
    # row: the parquet's own system prompt and user text, frames at the <video> mark (the release);
    # mode: configs/prompts/<prompt_mode>.txt + a "Video / Duration" header (ours; the tiny world's SFT format)
    prompt_source: str = choice(PromptSource, default="row")
    prompt_mode: str = "agentic_general"  # system prompt file for prompt_source=mode (configs/prompts/<mode>.txt)
    max_turns: int = 3  # tool rounds per episode
    max_parallel: int | None = None  # calls executed per turn (None: all, as the release trains; eval uses 5)
    max_new_tokens: int = 2048  # tokens per main-agent turn
    max_context_tokens: int = 32768  # an episode stops when its context reaches this
    include_subagent_in_loss: bool = False  # train on sub-agent turns too (with the episode's advantage)
    crop: CropConfig = field(default_factory=CropConfig)  # crop_video's settings
    # the main agent's tools: key (a registered name or package.module:Class) -> that tool's options
    # (paravt.agent.tools; crop_video takes crop.* and any CropConfig field as an override)
    tools: dict[str, Any] = field(default_factory=lambda: {"crop_video": {}})

    def __post_init__(self):
        check_choices(self, "hierarchical_agent")
        check_tools(self.tools)
        if self.nframes < 1 or self.max_turns < 0 or self.max_new_tokens < 1 or self.max_context_tokens < 1:
            raise ValueError("hierarchical_agent: nframes >= 1, max_turns >= 0, max_new_tokens >= 1 and "
                             f"max_context_tokens >= 1 required (got {self.nframes}, {self.max_turns}, "
                             f"{self.max_new_tokens}, {self.max_context_tokens})")
        if self.max_parallel is not None and self.max_parallel < 1:
            raise ValueError(f"hierarchical_agent.max_parallel must be >= 1 or null, got {self.max_parallel}")


@dataclass
class GRPOConfig:
    n_samples: int = 8  # rollouts per prompt (the group)
    prompts_per_step: int = 7  # prompts per step (any count: the step's samples split over the trainer ranks by tokens)
    temperature: float = 0.7  # rollout sampling temperature
    top_p: float = 1.0  # rollout nucleus sampling
    reward_bias: float = -0.2  # shaped reward = (r + bias) * scale
    reward_scale: float = 10.0  # shaped reward = (r + bias) * scale
    reward_clip: float | None = 20.0  # |shaped reward| cap before normalisation (AReaL's default)
    group_norm: bool = True  # divide by the group std (else centre only)
    batch_adv_norm: bool = True  # normalise advantages over the batch
    clip_eps: float = 0.2  # PPO ratio clip
    kl_coef: float = 0.01  # KL coefficient to the frozen reference (0: no reference model)
    kl_mode: str = choice(KLMode)  # reward_k1 (the release: per-token k1 penalty in the reward) | loss_k3
    adv_norm_level: str = choice(AdvNormLevel)  # token (the release: over policy tokens) | sequence
    behav_imp_weight_cap: float | None = 5.0  # decoupled loss: drop tokens whose behaviour importance weight exceeds this (null: off)
    # Rollout correction of the behaviour weight w = exp(prox - behav), opt-in (off in the release):
    rollout_is: str | None = choice(None, Correction)  # truncated importance sampling: token (min(w_t, C)) | sequence (min(prod w_t, C)) | null
    rollout_rs: str | None = choice(None, Correction)  # rejection: token (mask w_t outside [1/C, C]) | sequence (geometric mean outside) | null
    rollout_corr_cap: float = 2.0  # C of both
    ppo_minibatches: int = 1  # optimizer steps per RL step
    max_staleness: int = 2  # rollouts may be this many policy versions old (0 = synchronous)
    loss_agg: str = choice(LossAgg)  # token-mean (the release's AReaL loss) | seq-mean-token-mean | seq-mean-token-sum
    loss_agg_norm: float | None = None  # seq-mean-token-sum's constant divisor (null: hierarchical_agent.max_new_tokens)
    dynamic_sampling: bool = False  # drop zero-spread groups, draw more prompts (off as released)
    dynamic_sampling_max_prompts: int | None = None  # prompts drawn per step at most (null: 3 x prompts_per_step)

    def __post_init__(self):
        if self.n_samples < 2:
            raise ValueError("grpo.n_samples must be >= 2 (group normalisation needs a group)")
        if self.prompts_per_step < 1:
            raise ValueError(f"grpo.prompts_per_step must be >= 1, got {self.prompts_per_step}")
        if not (self.temperature >= 0 and 0 < self.top_p <= 1):
            raise ValueError(f"grpo.temperature must be >= 0 and grpo.top_p in (0, 1], got {self.temperature}, {self.top_p}")
        if self.ppo_minibatches < 1 or self.max_staleness < 0:
            raise ValueError("grpo.ppo_minibatches >= 1 and grpo.max_staleness >= 0 required")
        check_choices(self, "grpo")
        check_loss_agg_norm(self.loss_agg_norm)
        check_dynamic_sampling(self)
        if self.rollout_corr_cap <= 1:
            raise ValueError(f"grpo.rollout_corr_cap must be > 1, got {self.rollout_corr_cap}")
        if (self.rollout_is or self.rollout_rs) and self.behav_imp_weight_cap is None:
            raise ValueError("grpo.rollout_is / rollout_rs correct the behaviour weight, which "
                             "grpo.behav_imp_weight_cap=null turns off")


@dataclass
class OptimConfig:
    lr: float = 2e-6  # learning rate (Adam, constant)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # Adam betas
    eps: float = 1e-8  # Adam epsilon
    weight_decay: float = 0.01  # weight decay
    grad_clip: float = 1.0  # global grad-norm clip


@dataclass
class RolloutConfig:
    # Weights reach the engine through its update_weights after every step. The in-process engine takes
    # the state dict. Servers (sglang | vllm), rollout.weight_sync:
    #   broadcast  bf16 (trainer.dtype) buckets streamed from the FSDP2 shards over a process group of
    #              trainer rank 0 and every server worker (NCCL on GPUs, gloo on CPU); nothing whole in
    #              host memory, nothing on disk (paravt.core.weight_sync)
    #   disk       an HF export of each version (output_dir/weights/vNNNNNN, pruned) that each server
    #              reloads; needs a filesystem the servers share with the trainer
    #   auto       broadcast for sglang / vllm, disk for hf_server
    engine: str = "hf"  # hf (in-process, embedded default) | hf_server (HTTP, CPU) | sglang | vllm (rollout servers)
    server: SGLangServerConfig = field(default_factory=SGLangServerConfig)  # sglang: launch settings
    # vllm: launch settings (a CPU build here, CUDA on GPU nodes; rollout flags are added by the launcher)
    vllm: VLLMServerConfig = field(default_factory=lambda: VLLMServerConfig(gpus=[7], dtype="bfloat16"))
    # Servers launched (sglang | vllm): this many copies of the launch settings, on ports port, port+1, ...
    # and the GPUs of server.gpus / vllm.gpus split in order (tp_size each). 0: launch none (urls only).
    replicas: int = 1
    # Rollout servers already running (sglang | vllm), e.g. on other nodes: http://host:port. Used beside the
    # launched ones; the run pushes its start weights to them first. Weights reach them as a directory
    # path: it must be the same path on their machines (a shared filesystem for output_dir).
    urls: list[str] = field(default_factory=list)
    # Where trainer ranks and rollout servers go over the nodes (paravt.rl.layout): one entry per node in
    # NODE_RANK order, comma-separated, each its parts joined by + in GPU order: train:N, rollout:S or
    # rollout:SxT (S servers of T GPUs), ENTRY*K for K alike nodes; e.g. train:7+rollout:1,rollout:8. Each
    # node's launcher starts its own servers and trainer rank 0 finds them through output_dir; replicas,
    # the server's gpus / tp_size and NPROC are then not read. Empty: servers on node 0, launched by rank 0.
    layout: str = ""
    # sglang | vllm with two or more servers: requests through sglang-router | vllm-router (paravt.engines.router;
    # sticky by episode, a dead server evicted and its requests sent again; weight pushes still to each server).
    # false: the pool sends each request to its server itself (GUIDE "Routers").
    router: bool = True
    weight_sync: str = choice(WeightSync)  # auto | broadcast | disk (see above)
    bucket_mb: int = 1024  # broadcast: MiB per bucket (rank 0's extra memory during a push: one bucket + one parameter)
    sync_backend: str = choice(SyncBackend)  # broadcast: auto (nccl when the trainer and the servers have GPUs, else gloo) | nccl | gloo
    sync_address: str | None = None  # broadcast: the address servers reach trainer rank 0 at (null: paravt.engines.weight_addr)
    # A push that has not finished after this long (a stalled group, a server that stopped receiving)
    # ends the run: one line, exit 3, a checkpoint. Also bounds a disk reload.
    sync_timeout_s: float = 300.0
    control_timeout_s: float = 30.0  # pause / version / cache / resume requests of a push
    # While a request or a push waits on a rollout server its /health is probed every health_interval_s
    # (each probe bounded at 5 s); health_misses probes in a row without an answer evict it like a dead one
    # (one line) and its requests and the push go to the live servers: a server frozen while holding its
    # port is found within health_misses x (health_interval_s + 5) s, not at the request's timeout.
    health_interval_s: float = 5.0
    health_misses: int = 3  # probes in a row without an answer that evict a server (see above)
    # SGLang, broadcast: each server's first push accounts for every tensor with SGLang's own
    # /weights_checker (reset every tensor to noise, checksum, push, checksum: one still equal was not
    # written; the run stops naming it). vLLM checks every push in its worker (vllm_worker.py).
    verify_first_push: bool = True
    batch_wait_s: float = 0.03  # in-process engine: requests arriving this close are batched
    dtype: str = "float32"  # in-process / hf_server engine dtype
    # Lost work: a prompt whose episodes failed (video does not decode, engine/server/tool failure) is
    # skipped whole. A step that skips more than this fraction of its prompts is a bad step; a bad step
    # never steps the optimizer when it has no samples left.
    max_skipped_fraction: float = 0.5
    # After this many bad steps in a row the run stops: a checkpoint of the last good weights, one line
    # naming the first error, exit 3 (resume=auto continues once the cause is fixed). 0: never stop.
    max_bad_steps: int = 3

    def __post_init__(self):
        check_choices(self, "rollout")
        if ":" not in self.engine:  # module:attribute names an engine outside the package
            check_choice("rollout.engine", self.engine, backend_names(rollout_only=True))
        try:
            b = self.backend()
        except ValueError as exc:
            raise ValueError(f"rollout.engine: {exc}") from None
        if not b.rollout or not b.transports:
            raise ValueError(f"rollout.engine={self.engine} does not serve rollouts (token ids and logprobs, and "
                             f"weights after every step)")
        if self.layout:
            from paravt.rl.layout import check_layout  # noqa: PLC0415

            check_layout(self.layout, engine=self.engine, urls=self.urls)
        if self.replicas < 0 or (not self.layout and b.server_config is not None and self.replicas == 0
                                 and not self.urls):
            raise ValueError(f"rollout.replicas={self.replicas}: launch at least one server or give rollout.urls")
        # an in-process engine takes its weights in memory whatever a recipe says, except broadcast, which needs servers
        lenient = "state_dict" in b.transports and self.weight_sync == "disk"
        if self.weight_sync != "auto" and self.weight_sync not in b.transports and not lenient:
            raise ValueError(f"rollout.weight_sync={self.weight_sync}: rollout.engine={self.engine} takes weights by "
                             f"{' | '.join(b.transports)} (use auto or one of those)")
        if self.bucket_mb < 1 or self.sync_timeout_s <= 0 or self.control_timeout_s <= 0:
            raise ValueError("rollout.bucket_mb >= 1, rollout.sync_timeout_s > 0 and rollout.control_timeout_s > 0 required")
        if self.health_interval_s <= 0 or self.health_misses < 1:
            raise ValueError(f"rollout.health_interval_s must be > 0 and rollout.health_misses >= 1, got "
                             f"{self.health_interval_s}, {self.health_misses}")
        if not 0.0 <= self.max_skipped_fraction <= 1.0 or self.max_bad_steps < 0:
            raise ValueError(f"rollout.max_skipped_fraction must be in [0, 1] and rollout.max_bad_steps >= 0, got "
                             f"{self.max_skipped_fraction}, {self.max_bad_steps}")

    def backend(self) -> EngineBackend:
        return get_backend(self.engine)

    def launch_settings(self) -> tuple[str | None, Any]:
        """(field name, value) of the launch settings of ``engine``: the field holding the backend's
        ``server_config`` (``server`` for SGLang, ``vllm`` for vLLM); (None, None) for an engine that takes
        none (in-process, hf_server)."""
        takes = self.backend().server_config
        for f in fields(self):
            if takes is not None and isinstance(getattr(self, f.name), takes):
                return f.name, getattr(self, f.name)
        return None, None


@dataclass
class TrainerConfig:
    strategy: str = choice(TrainStrategy)  # fsdp2 | none
    dtype: str = "bfloat16"  # compute dtype (master weights fp32)
    attn_implementation: str | None = None  # sdpa_varlen | torch_varlen | sdpa | flash_attention_2 | eager (null: flash-attn where installed, else sdpa_varlen)
    gradient_checkpointing: bool = True  # recompute activations in backward
    # RL forwards pack consecutive samples (a prompt group's rollouts) into rows of at most this many tokens,
    # each distinct image encoded once per pack; 0: one forward per sample. The default is the 8B recipes'
    # context limit, so a pack is never longer than the longest single sample a run allows.
    pack_tokens: int = 32768
    # fsdp2: build on the meta device, rank 0 reads the checkpoint, each rank receives only its shards
    # (one host copy, a rank's peak = its shards + one parameter). false: every rank loads the whole model.
    sharded_init: bool = True

    def __post_init__(self):
        check_dtype(self.dtype)
        if self.pack_tokens < 0:
            raise ValueError(f"trainer.pack_tokens must be >= 0, got {self.pack_tokens}")
        check_choices(self, "trainer")


@dataclass
class LogConfig:
    wandb_project: str | None = "paravt-rl"  # wandb project (null: no wandb; metrics.jsonl always)
    wandb_mode: str = choice(WandbMode)  # offline | online | disabled
    progress: bool = True  # tqdm progress bar
    save_trajectories: int = 2  # episodes per step (a seeded random sample) written to trajectories.jsonl
    trajectory_thumbnails: int = 48  # overview frames kept as JPEG thumbnails of this size (px) for the viewer; 0: none

    def __post_init__(self):
        check_choices(self, "logging")


@dataclass
class RLConfig:
    model_path: str = "???"  # the cold-start SFT checkpoint (required)
    ref_model_path: str | None = None  # default: model_path
    output_dir: str = "runs/rl"  # checkpoints/, final/, weights/, metrics.jsonl, curves.png, trajectories.jsonl
    train_data: list[str] = field(default_factory=list)  # RL parquets (prompt, videos, extra_info)
    data_root: str = ""  # relative train_data paths are under this folder
    max_steps: int = 54  # RL steps (the released ParaVT-8B: 54)
    save_every: int = 5  # checkpoint every N steps
    keep_last: int = 2  # complete checkpoints kept on disk
    seed: int = 0  # seeds K draws, prompt order and sampling
    resume: str = "auto"  # auto | never | <checkpoint dir>
    paravt: ParaVTConfig = field(default_factory=ParaVTConfig)
    hierarchical_agent: HierarchicalAgentConfig = field(default_factory=HierarchicalAgentConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    gtr: GTRConfig = field(default_factory=GTRConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA adapters on the frozen base, which is the KL reference
    logging: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self):
        require(self, model_path="model_path is required (the SFT checkpoint directory)",
                train_data="train_data: give at least one RL parquet")
        if self.data_root:
            self.train_data = [p if Path(p).is_absolute() else str(Path(self.data_root) / p) for p in self.train_data]
        if self.max_steps < 1 or self.save_every < 1:
            raise ValueError("max_steps and save_every must be >= 1")
        if self.paravt.reward.mode == "llm" and not (self.judge.base_url and self.judge.model):
            raise ValueError("paravt.reward.mode=llm needs judge.base_url and judge.model (an OpenAI-compatible judge)")

    def check_inputs(self) -> None:
        """The files a run reads exist (called by the trainer before any model loads; not in
        ``__post_init__``, so a recipe can be read on a machine without its data)."""
        missing = [p for p in self.train_data if not Path(p).is_file()]
        if missing:
            raise ValueError(f"train_data: no such file {missing[0]}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else "")
                             + (f"; data_root={self.data_root}" if self.data_root else ""))
        if not Path(self.model_path).exists():
            raise ValueError(f"model_path: no such checkpoint {self.model_path}")
        check_run_paths(self.model_path, self.output_dir, self.resume)

    def needs_cuda(self) -> str | None:
        """Why this recipe cannot run without CUDA (None: it can)."""
        r = self.rollout
        b = r.backend()
        if r.layout:  # the layout's rollout parts launch servers; the vLLM CPU build takes them on CPU
            from paravt.rl.layout import check_layout  # noqa: PLC0415

            launches = any(n.count("rollout") for n in check_layout(r.layout))
        else:
            launches = r.replicas > 0
        if b.launch_needs_cuda and launches:  # servers reached by rollout.urls need no GPU here
            return f"rollout.engine={r.engine} runs on GPUs only"
        key, settings = r.launch_settings()
        if b.gpus_need_cuda and settings is not None and settings.gpus and not r.layout:
            return f"rollout.{key}.gpus={settings.gpus} (the CPU build takes gpus=[])"
        if self.trainer.attn_implementation == "flash_attention_2":
            return "trainer.attn_implementation=flash_attention_2 is a CUDA kernel"
        return None

    def check_world_size(self, trainer_world_size: int) -> None:
        """Any number of trainer ranks up to the step's main-agent samples (prompts_per_step × n_samples).
        A step's samples are split over the ranks by tokens, uneven counts allowed, and a rank short of
        forwards runs zero-mask padding, so no divisibility is needed. More ranks than samples would leave
        some ranks with nothing but padding on every step (work that never reaches the gradient): refused."""
        g = self.grpo
        n = g.prompts_per_step * g.n_samples
        if trainer_world_size < 1:
            raise ValueError(f"the trainer world size must be >= 1, got {trainer_world_size}")
        if trainer_world_size > n:
            raise ValueError(
                f"grpo.prompts_per_step={g.prompts_per_step} x grpo.n_samples={g.n_samples} = {n} samples a step "
                f"cannot keep {trainer_world_size} trainer ranks busy (each sample trains on one rank): use at most "
                f"{n} trainer ranks, or raise grpo.prompts_per_step to {-(-trainer_world_size // g.n_samples)}")
