"""The typed SFT recipe (``configs/sft/*.yaml``; every field overridable as ``key=value``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from paravt.core.config import check_choices, check_dtype, check_run_paths, choice, require
from paravt.core.metrics import WandbMode
from paravt.core.video_reader import Decoder
from paravt.models.lora import LoraConfig

Scheduler = Literal["cosine", "constant"]
Strategy = Literal["fsdp2", "deepspeed", "ddp", "none"]


@dataclass
class VideoSamplingConfig:
    fps: float = 1.0  # frames per second sampled from a video window
    max_frames: int = 64  # cap on frames per video
    min_frames: int = 1  # floor on frames per video
    min_pixels: int = 784  # per-frame lower pixel bound (smart resize)
    max_pixels: int = 50176  # per-frame upper pixel bound (smart resize)
    factor: int = 32  # frame sides rounded to multiples of this (patch x merge)
    decoder: str = choice(Decoder)  # pyav (keyframe seeks, frame-exact) | decord (the design's); same frames either way
    # Videos kept open, each with the frames already decoded and resized from it (least recently used closed
    # first). A data set with more videos than this reopens, re-probes and re-decodes a video for nearly every
    # row; one with fewer decodes each frame once per run. Memory: up to FRAME_CACHE_ITEMS resized frames per
    # open video (paravt.core.video), e.g. ~1 MB per video in the tiny world, up to ~45 MB at 50,176 px.
    open_videos: int = 16

    def __post_init__(self):
        check_choices(self, "video")
        if self.open_videos < 1:
            raise ValueError(f"video.open_videos must be >= 1, got {self.open_videos}")


@dataclass
class Shard:
    path: str = ""
    name: str = ""
    max_rows: int | None = None
    optional: bool = False  # a missing optional shard is logged and skipped; a missing required one is an error


@dataclass
class OptimConfig:
    lr: float = 2e-5  # peak learning rate (AdamW)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    eps: float = 1e-8  # AdamW epsilon
    weight_decay: float = 0.01  # AdamW weight decay (not on norms/biases)
    scheduler: str = choice(Scheduler)  # cosine | constant
    warmup_ratio: float = 0.05  # linear warm-up as a fraction of the planned schedule
    # Steps the warm-up + cosine is planned over (None: max_steps). The authors plan 1500 steps
    # (1 epoch) and release step 500, where the cosine is unfinished (lr ~0.8x peak).
    schedule_steps: int | None = None
    min_lr_ratio: float = 0.0  # cosine floor as a fraction of lr
    grad_clip: float = 1.0  # global grad-norm clip
    vision_lr_scale: float = 1.0  # lr multiplier for the vision tower (0 freezes it)
    # Keep the lm_head (output embeddings) at its initial values; needs an untied model. The random-init
    # tiny model's rarely-predicted tokens (shapes, option letters) otherwise drift to one shared
    # "not me" direction (cosine 0.99 after SFT, measured), and what no output row tells apart no copy can say.
    freeze_lm_head: bool = False

    def __post_init__(self):
        check_choices(self, "optim")
        if not (self.lr > 0 and 0 <= self.warmup_ratio < 1):
            raise ValueError("optim.lr must be > 0 and optim.warmup_ratio in [0, 1)")
        if self.schedule_steps is not None and self.schedule_steps < 1:
            raise ValueError(f"optim.schedule_steps must be >= 1 or null, got {self.schedule_steps}")


@dataclass
class DistConfig:
    strategy: str = choice(Strategy)  # fsdp2 | deepspeed | ddp | none
    zero_stage: int = 3  # DeepSpeed ZeRO stage (strategy=deepspeed)
    reshard_after_forward: bool = True  # FSDP2: free gathered params after forward (memory for comms)

    def __post_init__(self):
        check_choices(self, "dist")


@dataclass
class LogConfig:
    log_every: int = 1  # metrics every N steps
    wandb_project: str | None = "paravt-sft"  # wandb project (null: no wandb; metrics.jsonl always)
    wandb_mode: str = choice(WandbMode)  # offline | online | disabled
    progress: bool = True  # tqdm progress bar

    def __post_init__(self):
        check_choices(self, "logging")


@dataclass
class CopyAuxConfig:
    """The tiny model's copy lessons kept alive during SFT (the embedded default only; 0 = off).

    Each optimizer step adds ``weight`` x the mean cross entropy of one batch of the copy task of
    ``python -m paravt.models.tiny --copy-warmup-steps`` (``prefix + x + x`` over random ordinary
    tokens, loss on the second ``x``; :func:`paravt.models.tiny.copy_batch`) to the SFT loss. Drawn
    from a generator seeded by (seed, rank, step): a resumed run draws the same batches. Text
    only: the vision tower gets no gradient from it. Qwen3-VL-8B has its induction heads from
    pretraining and needs none of this (``weight: 0`` in every 8B recipe)."""

    weight: float = 0.0  # 0: off
    batch: int = 16  # copy sequences per step
    min_len: int = 8  # shortest x (drawn per step)
    max_len: int = 32  # longest x
    max_prefix: int = 32  # random tokens before the first x (0..max_prefix, drawn per step)
    # Steps whose x comes from a 12-token alphabet (copying then needs context). 0 by default: mixed in at
    # 0.5 the standalone warm-up reached no induction phase change in 2000 steps (loss 6.52 -> 5.84; RESULTS.md).
    small_alphabet_frac: float = 0.0

    def __post_init__(self):
        if self.weight < 0:
            raise ValueError(f"copy_aux.weight must be >= 0, got {self.weight}")
        if self.batch < 1 or not (1 <= self.min_len <= self.max_len) or self.max_prefix < 0 \
                or not (0.0 <= self.small_alphabet_frac <= 1.0):
            raise ValueError(f"copy_aux: batch >= 1, 1 <= min_len <= max_len, max_prefix >= 0, "
                             f"small_alphabet_frac in [0, 1]; got {self}")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class StepSplit:
    """An optimizer step's ``global_size`` bins (rows) over ``world_size`` ranks (:meth:`SFTConfig.step_split`).

    Step ``s`` (0-based) holds the run's slots ``s*G .. s*G+G-1``; slot ``k`` is the next bin (row) of
    rank ``k mod world_size``, so a step trains exactly ``G`` whatever the world size, and when ``G`` is
    not a multiple of it the ranks short of a slot rotate from step to step (every rank's share of the
    data is read at the same pace). Every rank runs ``passes`` forward/backward passes a step (FSDP and
    DDP gather and reduce in each): a rank's rows are spread over them, and a rank with fewer bins
    (rows) than passes fills up with zero-weight passes."""

    global_size: int
    world_size: int
    micro: int  # at most this many bins (1) or rows in one forward/backward
    unit: str = "bins"

    def count(self, rank: int, step: int) -> int:
        """The bins (rows) rank ``rank`` trains in step ``step``."""
        def upto(n: int) -> int:  # slots k < n with k % world_size == rank
            return max(0, _ceil(n - rank, self.world_size))
        return upto((step + 1) * self.global_size) - upto(step * self.global_size)

    @property
    def passes(self) -> int:
        """Forward/backward passes per rank per step (the accumulation steps), the same on every rank."""
        return _ceil(_ceil(self.global_size, self.world_size), self.micro)

    def micro_sizes(self, rank: int, step: int) -> list[int]:
        """The bins (rows) of each of this rank's real passes in step ``step``: as even as ``passes`` allows."""
        c = self.count(rank, step)
        n = min(c, self.passes)
        return [c // n + (i < c % n) for i in range(n)] if n else []

    @property
    def fillers(self) -> int:
        """Zero-weight passes a step, summed over the ranks (the same every step)."""
        q, rem = divmod(self.global_size, self.world_size)
        return (self.world_size - rem) * max(0, self.passes - q) if rem else 0

    def describe(self) -> str:
        text = (f"global_batch_size={self.global_size} {self.unit} a step over {self.world_size} rank(s): "
                f"{self.passes} forward/backward pass(es) per rank of <= {self.micro} {self.unit}")
        if self.fillers:
            text += (f"; {self.fillers} of the step's {self.passes * self.world_size} passes are zero-weight fillers "
                     f"(compute idle; a multiple of {self.world_size} {self.unit} wastes none)")
        return text


@dataclass
class SFTConfig:
    model_path: str = "???"  # base model: a save_pretrained dir or hub id (required)
    output_dir: str = "runs/sft"  # checkpoints/, final/, metrics.jsonl, loss_curve.png
    data: list[Shard] = field(default_factory=list)  # manifest: list of {path, name, max_rows, optional} parquet shards
    data_root: str = ""  # shard paths that are not absolute are relative to this folder
    max_length: int = 8192  # longest tokenised row (or packed bin); longer rows are skipped and counted
    packing: bool = True  # pack rows into max_length bins (per-sequence M-RoPE positions)
    # Prepare the next step's batches (video frames, image tensors, packs) on a background thread while a step
    # trains. null: on with CUDA; off on CPU, where the thread shares the GIL with training (measured: no gain).
    prefetch: bool | None = None
    # Keep built examples (frames, image tensors, ids) in memory up to this many MB per rank, so later epochs
    # reuse them instead of building them again (the same examples: building is deterministic). 0: off, as a
    # real data set is read once or twice; the tiny recipes, whose small data sets repeat for many epochs, use it.
    example_cache_mb: int = 0
    # Packed bins (packing) or rows (no packing) of one optimizer step over all ranks, whatever the world size
    # (the release's 4 packs per GPU on 8 GPUs: 32); the loss is the mean over the step's supervised tokens.
    # Slot k of the run is rank (k mod world size)'s next bin. Not a multiple of the world size: ranks short
    # of a slot run zero-weight passes that step (FSDP/DDP need every rank in each pass), compute idle.
    global_batch_size: int = 4
    # At most this many rows in one padded forward/backward (packing=false; null: a rank's whole share of the
    # step at once); the passes a step = ceil(ceil(global_batch_size / world size) / this). With packing every
    # bin is its own forward/backward: null or 1.
    per_device_batch_size: int | None = None
    max_steps: int = 500  # optimizer steps to train (the schedule may be planned longer: optim.schedule_steps)
    save_every: int = 100  # checkpoint every N steps
    keep_last: int = 2  # complete checkpoints kept on disk
    seed: int = 0  # seeds data order, init and dropout
    dtype: str = "bfloat16"  # compute dtype; master weights stay fp32
    attn_implementation: str | None = None  # None: flash_attention_2 on CUDA if installed, else sdpa
    gradient_checkpointing: bool = True  # recompute activations in backward (memory for time)
    resume: str = "auto"  # auto | never | <checkpoint dir>
    video: VideoSamplingConfig = field(default_factory=VideoSamplingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    logging: LogConfig = field(default_factory=LogConfig)
    copy_aux: CopyAuxConfig = field(default_factory=CopyAuxConfig)  # tiny model only: keep/grow copying
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA adapters on a frozen base (off: every parameter trains)

    def __post_init__(self):
        require(self, model_path="model_path is required (a save_pretrained directory or hub id)",
                data="data: give at least one shard ({path: ..., name: ...})")
        self.data = [Shard(**d) if isinstance(d, dict) else d for d in self.data]
        if self.data_root:
            for sh in self.data:
                if not Path(sh.path).is_absolute():
                    sh.path = str(Path(self.data_root) / sh.path)
        for name in ("max_length", "global_batch_size", "max_steps", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.example_cache_mb < 0:
            raise ValueError(f"example_cache_mb must be >= 0 (0: off), got {self.example_cache_mb}")
        if self.per_device_batch_size is not None and self.per_device_batch_size < 1:
            raise ValueError(f"per_device_batch_size must be >= 1 or null, got {self.per_device_batch_size}")
        if self.packing and self.per_device_batch_size not in (None, 1):
            raise ValueError(f"per_device_batch_size={self.per_device_batch_size} is the rows of one padded micro-batch "
                             f"(packing=false); with packing every bin is its own forward/backward: set "
                             f"global_batch_size, the bins of an optimizer step over all ranks")
        check_dtype(self.dtype)
        if self.lora.enabled and self.dist.strategy == "deepspeed":
            raise ValueError("lora.enabled trains under dist.strategy=fsdp2, ddp or none, not deepspeed")
        if self.copy_aux.weight and self.dist.strategy == "deepspeed":
            raise ValueError("copy_aux (the tiny model's copy lessons) runs under fsdp2, ddp or none, not deepspeed")

    def step_split(self, world_size: int) -> StepSplit:
        """How a step's ``global_batch_size`` falls on ``world_size`` ranks; a combination this trainer cannot
        run is a ValueError naming the settings (checked before any model loads, and by ``run_sft.sh``)."""
        unit = "bins" if self.packing else "rows"
        most = _ceil(self.global_batch_size, world_size)  # the largest share of a step on one rank
        micro = 1 if self.packing else min(self.per_device_batch_size or most, most)
        split = StepSplit(self.global_batch_size, world_size, micro, unit)
        if self.dist.strategy == "deepspeed" and split.passes > 1:
            raise ValueError(f"dist.strategy=deepspeed trains one micro-batch per rank per optimizer step here; "
                             f"global_batch_size={self.global_batch_size} {unit} over {world_size} rank(s) gives "
                             f"{split.passes}: set global_batch_size={world_size * micro} or less"
                             + ("" if self.packing else " (or per_device_batch_size=null)")
                             + ", or use dist.strategy=fsdp2")
        return split

    def needs_cuda(self) -> str | None:
        """Why this recipe cannot run without CUDA (None: it can)."""
        if self.attn_implementation == "flash_attention_2":
            return "attn_implementation=flash_attention_2 is a CUDA kernel"
        return None

    def check_inputs(self) -> None:
        """The files a run reads exist (called before any model loads, and by ``run_sft.sh``'s preflight
        before torchrun; not in ``__post_init__``, so a recipe can be read on a machine without its data)."""
        check_run_paths(self.model_path, self.output_dir, self.resume)
        required = [sh for sh in self.data if not sh.optional and not Path(sh.path).is_file()]
        if required:
            raise ValueError(f"data: {len(required)} required shard(s) match no file: "
                             + ", ".join(f"{sh.path} ({sh.name or '-'})" for sh in required[:3])
                             + (" ..." if len(required) > 3 else "") + "; fix the path or mark it optional: true")
