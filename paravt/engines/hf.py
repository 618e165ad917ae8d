"""The embedded default engine: a transformers model in-process, with request batching.

Concurrent ``generate`` calls (the n rollouts of a GRPO group, the sub-agents of one turn)
are collected from a queue (while they keep arriving less than ``batch_wait_s`` apart, at
most ``max_batch_wait_s``) and run as ONE left-padded batched
``model.generate`` in a worker thread, so parallel tool calls really run in parallel.

Sampling is done per row by :class:`_RowSampler` with a ``torch.Generator`` per request
(seeded from the request's seed), so a request's tokens do not depend on the global RNG;
with the same batch composition a rollout is bit-for-bit reproducible. (Batched vs. unbatched
forward passes may differ in the last float bits, which can flip a near-tie sample.)
Log-probabilities come from the raw logits (``output_logits=True``), not the processed scores.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import GenerationConfig, LogitsProcessor, StoppingCriteria

from paravt.core.seeding import stable_hash
from paravt.engines.base import EngineError, GenerationOutput, InferenceEngine, SamplingParams
from paravt.engines.kv_cache import ReservedCache
from paravt.models.images import ImageInputs
from paravt.models.packed_attention import left_padded
from paravt.models.tokenize import vision_token_ids

log = logging.getLogger(__name__)


@dataclass
class _Request:
    input_ids: list[int]
    images: ImageInputs | None
    params: SamplingParams
    generator: torch.Generator
    future: asyncio.Future | None = None
    t_submit: float = field(default_factory=time.perf_counter)


class _RowSampler(LogitsProcessor):
    """Chooses each row's next token with its own params and generator; the chosen token
    gets score 0 and the rest -inf, so generate's greedy step keeps it."""

    def __init__(self, reqs: list[_Request], banned: list[int] | None = None, prompt_len: int = 0):
        self.reqs = reqs
        self.banned = list(banned or [])
        self.prompt_len = prompt_len  # left-padded batch: the generated tokens are the columns after it

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        out = torch.full_like(scores, float("-inf"))
        if self.banned:  # vision placeholders are never text the policy may write
            scores = scores.clone()
            scores[:, self.banned] = float("-inf")
        for i, r in enumerate(self.reqs):
            p = r.params
            row = scores[i]
            if (p.frequency_penalty or p.presence_penalty) and input_ids.shape[1] > self.prompt_len:
                counts = torch.bincount(input_ids[i, self.prompt_len:], minlength=row.numel())[: row.numel()]
                row = row - p.frequency_penalty * counts.to(row.dtype) - p.presence_penalty * (counts > 0).to(row.dtype)
            if p.greedy:
                tok = int(torch.argmax(row))
            else:
                logits = row / p.temperature
                if p.top_k > 0:
                    kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = torch.softmax(logits, dim=-1)
                if p.top_p < 1.0:
                    sp, si = torch.sort(probs, descending=True)
                    keep = torch.cumsum(sp, 0) - sp < p.top_p
                    mask = torch.zeros_like(probs, dtype=torch.bool)
                    mask[si[keep]] = True
                    probs = torch.where(mask, probs, torch.zeros_like(probs))
                    probs = probs / probs.sum()
                tok = int(torch.multinomial(probs.float().cpu(), 1, generator=r.generator))
            out[i, tok] = 0.0
        return out


class _RowStop(StoppingCriteria):
    """Per-row stop: its own max_new_tokens, stop token ids (``eos`` too) and stop strings. ``prompt_len``: where
    the generated tokens start in ``input_ids`` (a continued call's ids hold the earlier calls' tokens after it).
    ``shrink_at``: when this many rows or fewer are still running (and at least one), every row stops at once
    and :attr:`shrunk` is set: the engine continues the running rows as a smaller batch."""

    def __init__(self, reqs: list[_Request], prompt_len: int, tokenizer, eos: list[int] = (), shrink_at: int = 0):
        self.reqs, self.prompt_len, self.tok, self.eos = reqs, prompt_len, tokenizer, set(eos)
        self.done_at: list[int | None] = [None] * len(reqs)
        self.shrink_at, self.shrunk = shrink_at, False

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        n = input_ids.shape[1] - self.prompt_len
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        last = input_ids[:, -1].tolist()
        for i, r in enumerate(self.reqs):
            if self.done_at[i] is not None:
                done[i] = True
                continue
            p = r.params
            stop = n >= p.max_new_tokens or last[i] in self.eos or (p.stop_token_ids and last[i] in p.stop_token_ids)
            if not stop and p.stop:
                tail = self.tok.decode(input_ids[i, max(self.prompt_len, input_ids.shape[1] - 16):])
                stop = any(s in tail for s in p.stop)
            if stop:
                self.done_at[i] = n
                done[i] = True
        running = len(self.reqs) - int(done.sum())
        if 0 < running <= self.shrink_at:
            self.shrunk = True
            done[:] = True
        return done


class HFEngine(InferenceEngine):
    """In-process transformers engine with batching of concurrent requests."""

    def __init__(self, model, processor, max_batch_size: int = 32, batch_wait_s: float = 0.03,
                 max_batch_wait_s: float = 0.15, seed: int = 0, shrink: bool = True):
        self.model = model.eval()
        self.shrink = shrink  # continue a batch's running rows alone once half of them have stopped (_generate)
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.max_batch_wait_s = max(max_batch_wait_s, batch_wait_s)
        self.seed = seed
        self.weight_version = 0
        gc = model.generation_config
        eos = gc.eos_token_id if gc is not None else None
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = eos
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        self.image_token_id = model.config.image_token_id
        self.banned_ids = vision_token_ids(self.tokenizer)
        self._lock = threading.Lock()
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None
        self._n_requests = 0
        self.stats = {"batches": 0, "requests": 0, "batch_sizes": [], "generated_tokens": 0, "gen_seconds": 0.0,
                      "continued_rows": 0}

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: str = "float32", attn_implementation: str | None = None,
                        device: str | None = None, **kwargs) -> "HFEngine":
        from paravt.models.loading import load_model, load_processor  # noqa: PLC0415

        if device is None and torch.cuda.is_available():  # this process's GPU (a trainer rank's, set by torchrun)
            device = torch.device("cuda", torch.cuda.current_device())
        model = load_model(path, dtype=dtype, attn_implementation=attn_implementation, device=device)
        return cls(model, load_processor(path), **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ public API
    async def generate(self, input_ids: Sequence[int], images: Any, params: SamplingParams) -> GenerationOutput:
        loop = asyncio.get_running_loop()
        if self._queue is None or self._worker is None or self._worker.done():
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._batch_loop())
        self._n_requests += 1
        seed = params.seed if params.seed is not None else stable_hash(self.seed, "request", self._n_requests)
        req = _Request(list(map(int, input_ids)), ImageInputs.wrap(images), params,
                       torch.Generator().manual_seed(seed % (2**63)))
        req.future = loop.create_future()
        await self._queue.put(req)
        return await req.future

    async def update_weights(self, source: Any, version: int | None = None) -> None:
        """A state dict (in-process trainer) or a saved checkpoint directory."""
        if isinstance(source, (str, Path)):
            from paravt.models.loading import load_model  # noqa: PLC0415

            fresh = load_model(source, dtype=next(self.model.parameters()).dtype, device="cpu")
            source = fresh.state_dict()
        await asyncio.to_thread(self._load_state, source)
        self.weight_version = version if version is not None else self.weight_version + 1

    def _load_state(self, state: dict[str, torch.Tensor]) -> None:
        with self._lock, torch.no_grad():
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            # tied lm_head may be absent from a state dict; anything else is an error
            missing = [k for k in missing if not k.endswith("lm_head.weight")]
            if missing or unexpected:
                raise EngineError(f"update_weights: missing {missing[:3]} unexpected {unexpected[:3]}")

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            self._worker = None

    # ------------------------------------------------------------------ batching
    async def _batch_loop(self) -> None:
        """Collect a batch: keep taking requests while they arrive less than ``batch_wait_s``
        apart (the sub-agents of one turn finish their crop decoding at slightly different
        times), for at most ``max_batch_wait_s`` after the first one."""
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            hard_deadline = loop.time() + self.max_batch_wait_s
            while len(batch) < self.max_batch_size:
                timeout = min(self.batch_wait_s, hard_deadline - loop.time())
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), timeout=timeout) if timeout > 0
                                 else self._queue.get_nowait())
                except (asyncio.TimeoutError, asyncio.QueueEmpty):
                    break
            outs = await asyncio.to_thread(self._run_safely, batch)
            for r, o in zip(batch, outs):
                if not r.future.done():
                    r.future.set_result(o)

    def _run_safely(self, batch: list[_Request]) -> list[GenerationOutput]:
        try:
            return self._run_batch(batch)
        except Exception as exc:  # noqa: BLE001 - isolate the failing request(s)
            if len(batch) == 1:
                log.warning("generation failed: %s", exc)
                return [GenerationOutput([], [], "error", self.weight_version, error=f"{type(exc).__name__}: {exc}")]
            return [self._run_safely([r])[0] for r in batch]

    # ------------------------------------------------------------------ one batch
    def _generate(self, reqs: list[_Request], ids: torch.Tensor, attn: torch.Tensor, vision: dict[str, Any]
                  ) -> tuple[list[int | None], list[list[int]], list[torch.Tensor]]:
        """``generate`` over the left-padded batch: per row, where it stopped (generated tokens, None: it ran to
        the batch's end), its generated tokens and its raw logits (fp32, host).

        A batch runs as long as its longest row, and the rows that stopped are still computed at every step
        (transformers' generate keeps them, padded). Once half of the rows or more have stopped
        (``shrink``), the call ends and the rows still running continue as a smaller batch: the cache keeps
        only their rows and generate picks up from it at their next token, with their own samplers'
        generators (the same random stream) and their stop rules counted from the first generated token. A
        row's numbers then come from a smaller batch's kernels (the last float bits can move, as with any
        other batch); the eval's answers were the same (benchmarks/README.md)."""
        L, B = ids.shape[1], len(reqs)
        row_logits: list[list[torch.Tensor]] = [[] for _ in reqs]
        toks: list[list[int]] = [[] for _ in reqs]
        done_at: list[int | None] = [None] * B
        rows = list(range(B))  # the rows of reqs in this call, in batch order
        mm = (ids == self.image_token_id).long()
        # the prefill attends row by row over each prompt's own tokens, no (B, 1, L, L) mask (packed_attention.py)
        with self._lock, torch.no_grad(), left_padded((L - attn.sum(1)).tolist()):
            # room made CHUNK positions at a time (up to max_new at the prefill): no copy of the cache per token
            # (kv_cache.py)
            max_new = max(r.params.max_new_tokens for r in reqs)
            cache = ReservedCache(self.model.config.get_text_config().num_hidden_layers, reserve=max_new)
            while rows:
                sub = [reqs[i] for i in rows]
                made = ids.shape[1] - L  # tokens generated by earlier calls (every row of this call has them)
                stopper = _RowStop(sub, L, self.tokenizer, self.eos_ids,
                                   shrink_at=len(rows) // 2 if self.shrink and len(rows) > 1 else 0)
                gen_cfg = GenerationConfig(max_new_tokens=max(r.params.max_new_tokens for r in sub) - made,
                                           do_sample=False, eos_token_id=self.eos_ids, pad_token_id=self.pad_id,
                                           output_logits=True, return_dict_in_generate=True)
                out = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=gen_cfg,
                                          logits_processor=[_RowSampler(sub, self.banned_ids, L)],
                                          stopping_criteria=[stopper], past_key_values=cache, mm_token_type_ids=mm,
                                          **vision)
                new = out.sequences[:, ids.shape[1]:].cpu()
                step_logits = torch.stack(out.logits, dim=1).float().cpu() if out.logits else None
                keep = []
                for j, i in enumerate(rows):
                    toks[i].extend(new[j].tolist())
                    if step_logits is not None:
                        row_logits[i].append(step_logits[j])
                    if stopper.done_at[j] is not None:
                        done_at[i] = stopper.done_at[j]
                    elif stopper.shrunk and len(toks[i]) < reqs[i].params.max_new_tokens:
                        keep.append(j)
                if not keep:
                    break
                self.stats["continued_rows"] += len(keep)
                k = torch.tensor(keep, device=ids.device)
                cache.batch_select_indices(k)
                inner = getattr(self.model, "model", None)  # Qwen-VL models keep their batch's M-RoPE offsets
                deltas = getattr(inner, "rope_deltas", None)
                if isinstance(deltas, torch.Tensor):
                    if deltas.shape[0] != len(rows):  # not this batch's: the rows could not be continued right
                        raise EngineError(f"cannot continue {len(keep)} rows: the model's rope_deltas hold "
                                          f"{deltas.shape[0]} rows, not the batch's {len(rows)}")
                    inner.rope_deltas = deltas[k]
                ids = out.sequences[k]
                attn = torch.cat([attn, attn.new_ones(len(rows), ids.shape[1] - attn.shape[1])], dim=1)[k]
                mm = torch.cat([mm, mm.new_zeros(len(rows), ids.shape[1] - mm.shape[1])], dim=1)[k]
                rows, vision = [rows[j] for j in keep], {}
                del out, new, step_logits  # the finished call's logits and sequences (on the device)
        logits = [torch.cat(parts) if parts else torch.zeros(0, 1) for parts in row_logits]
        return done_at, toks, logits

    def _run_batch(self, reqs: list[_Request]) -> list[GenerationOutput]:
        t0 = time.perf_counter()
        merge = int(self.processor.image_processor.merge_size) ** 2
        L = max(len(r.input_ids) for r in reqs)
        B = len(reqs)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        pixel_values, grids = [], []
        for i, r in enumerate(reqs):
            n = len(r.input_ids)
            if n == 0:
                raise EngineError("empty prompt")
            ids[i, L - n:] = torch.tensor(r.input_ids)
            attn[i, L - n:] = 1
            n_pad = sum(1 for t in r.input_ids if t == self.image_token_id)
            if r.images is not None and len(r.images):
                pv, grid = r.images.tensors(self.processor)
                expected = int((grid.prod(-1) // merge).sum())
                if n_pad != expected:
                    raise EngineError(f"prompt has {n_pad} image tokens but its {len(r.images)} images need {expected}")
                pixel_values.append(pv)
                grids.append(grid)
            elif n_pad:
                raise EngineError(f"prompt has {n_pad} image tokens but no images")
        kwargs: dict[str, Any] = {}
        if pixel_values:
            kwargs["pixel_values"] = torch.cat(pixel_values).to(self.device, dtype=next(self.model.parameters()).dtype)
            kwargs["image_grid_thw"] = torch.cat(grids).to(self.device)
        ids, attn = ids.to(self.device), attn.to(self.device)
        done_at, seqs, logits = self._generate(reqs, ids, attn, kwargs)
        dt = time.perf_counter() - t0
        results = []
        for i, r in enumerate(reqs):
            toks, finish = [], "length"
            limit = min(r.params.max_new_tokens, len(seqs[i]))
            if done_at[i] is not None:
                limit = min(limit, done_at[i])
            for t in seqs[i][:limit]:
                toks.append(t)
                if t in self.eos_ids or t in r.params.stop_token_ids:
                    finish = "stop"
                    break
            if finish == "length" and done_at[i] is not None and done_at[i] < r.params.max_new_tokens:
                finish = "stop"  # a stop string
            temp = r.params.temperature if r.params.temperature > 0 else 1.0
            if toks:  # the distribution sampled from: vision placeholders excluded, as the trainer scores it
                lg = logits[i][: len(toks)] / temp
                if self.banned_ids:
                    lg = lg.clone()
                    lg[:, self.banned_ids] = float("-inf")
                lp = torch.log_softmax(lg, dim=-1)
                lps = lp.gather(1, torch.tensor(toks).unsqueeze(1)).squeeze(1).tolist()
            else:
                lps = []
            results.append(GenerationOutput(toks, lps, finish, self.weight_version,
                                            latency_s=time.perf_counter() - r.t_submit))
        self.stats["batches"] += 1
        self.stats["requests"] += B
        self.stats["batch_sizes"].append(B)
        self.stats["generated_tokens"] += sum(len(r.token_ids) for r in results)
        self.stats["gen_seconds"] += dt
        return results
