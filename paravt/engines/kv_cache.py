"""The in-process engine's KV cache: transformers' ``DynamicCache`` with each layer's keys and values
written into room reserved for the whole generation, instead of concatenated at every token.

transformers' ``DynamicLayer`` grows by ``torch.cat``: every decoded token copies the whole cache of
every layer (batch x kv heads x length x head dim, keys and values) into a new tensor, so a batch of long
video prompts spends as much time copying its cache as attending to it. :class:`ReservedLayer`
allocates prompt + ``reserve`` positions at the prefill (the engine reserves the batch's
``max_new_tokens``), writes each step's new states in place and gives attention a view of the filled
part: the same values in the same layout within each head (only the stride between heads differs), so
attention computes the same numbers. ``tests/engines/test_hf_engine.py`` compares the engine's tokens
and logprobs with a ``DynamicCache`` run's, exactly; benchmarks/README.md has the time it saves.

transformers itself may replace a layer's tensors (``crop``, ``batch_select_indices``, beam reordering,
offloading); the next ``update`` then sees tensors that are not its last view and copies them into new
room, so every ``Cache`` method keeps working, only without the saving.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in a buffer with room for ``reserve`` more positions
    than the first update brings; past the room it doubles (never in the engine's own use)."""

    def __init__(self, reserve: int = 0):
        super().__init__()
        if reserve < 0:
            raise ValueError(f"reserve must be >= 0, got {reserve}")
        self.reserve = reserve
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None
        self._n = 0  # positions filled
        self._kview: torch.Tensor | None = None  # the views last handed out (what self.keys/values are)
        self._vview: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return 0 if self._kbuf is None else self._kbuf.shape[-2]

    def _adopt(self) -> None:
        """Take over ``self.keys``/``self.values`` as they are (empty after a lazy init or a reset, or tensors
        transformers put there): the buffer is made again on the next write."""
        self._kbuf = self._vbuf = None
        k = self.keys
        self._n = 0 if k is None or k.dim() < 2 else k.shape[-2]

    def _make_room(self, keys: torch.Tensor, values: torch.Tensor, need: int) -> None:
        """Buffers of at least ``need`` positions shaped like this update's ``keys``/``values`` but in length,
        holding the positions filled so far."""
        cap = need + self.reserve if self._kbuf is None else max(need, 2 * self.capacity)
        kbuf = keys.new_empty(keys.shape[:-2] + (cap, keys.shape[-1]))
        vbuf = values.new_empty(values.shape[:-2] + (cap, values.shape[-1]))
        if self._n:
            kbuf[..., : self._n, :].copy_(self.keys)
            vbuf[..., : self._n, :].copy_(self.values)
        self._kbuf, self._vbuf = kbuf, vbuf

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._kbuf is None or self.keys is not self._kview or self.values is not self._vview:
            self._adopt()
        n, q = self._n, key_states.shape[-2]
        if self._kbuf is None or n + q > self.capacity or self._kbuf.shape[:-2] != key_states.shape[:-2]:
            self._make_room(key_states, value_states, n + q)
        self._kbuf[..., n: n + q, :].copy_(key_states)
        self._vbuf[..., n: n + q, :].copy_(value_states)
        self._n = n + q
        self.keys = self._kview = self._kbuf[..., : self._n, :]
        self.values = self._vview = self._vbuf[..., : self._n, :]
        return self.keys, self.values


class ReservedCache(DynamicCache):
    """A ``DynamicCache`` of ``num_layers`` :class:`ReservedLayer` s, each reserving ``reserve`` positions
    beyond the prompt (generate's ``past_key_values``; one per ``generate`` call)."""

    def __init__(self, num_layers: int, reserve: int):
        Cache.__init__(self, layers=[ReservedLayer(reserve) for _ in range(num_layers)])
