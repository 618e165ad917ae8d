"""The in-process engine's KV cache: transformers' ``DynamicCache`` with each layer's keys and values
written into room made ahead, instead of concatenated at every token.

transformers' ``DynamicLayer`` grows by ``torch.cat``: every decoded token copies the whole cache of
every layer (batch x kv heads x length x head dim, keys and values) into a new tensor, so a batch of long
video prompts spends as much time copying its cache as attending to it. :class:`ReservedLayer`
makes room for the prompt and up to :data:`CHUNK` more positions at the prefill (the engine's ``reserve``
is the batch's ``max_new_tokens``) and :data:`CHUNK` more whenever it runs out, writes each step's new
states in place and gives attention a view of the filled part: the same values in the same layout within
each head (only the stride between heads differs), so attention computes the same numbers.
``tests/engines/test_kv_cache.py`` compares the engine's tokens and logprobs with a ``DynamicCache`` run's,
exactly; benchmarks/README.md has the time it saves. ``batch_select_indices`` (the engine keeping a batch's
running rows) cuts the buffer itself down.

transformers itself may replace a layer's tensors (``crop``, beam reordering, offloading); the next
``update`` then sees tensors that are not its last view and copies them into new room, so every ``Cache``
method keeps working, only without the saving.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


#: Positions of room made at a time: the first write (the prefill) makes room for up to this many more, and
#: running out makes this many more (one copy of the cache per CHUNK generated tokens instead of one per token).
#: Room for a whole ``max_new_tokens`` up front would hold every row's worst case (a 2,048-token budget where
#: rows stop after ~200: ~1.5x the cache a grown one ends with); at most CHUNK positions a row past what is used.
CHUNK = 256


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in a buffer with room for more positions than are filled:
    ``min(reserve, chunk)`` more at the first write, ``chunk`` more each time it runs out."""

    def __init__(self, reserve: int = 0, chunk: int = CHUNK):
        super().__init__()
        if reserve < 0 or chunk < 1:
            raise ValueError(f"reserve must be >= 0 and chunk >= 1, got {reserve} and {chunk}")
        self.reserve, self.chunk = reserve, chunk
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
        holding the positions filled so far (then the old ones are let go)."""
        cap = need + (min(self.reserve, self.chunk) if self._kbuf is None and not self._n else self.chunk)
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

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices``: the buffer itself is cut down (room included), so the rows let go are freed
        now and the next write needs no new room."""
        if self._kbuf is None or self.keys is not self._kview or self.values is not self._vview:
            super().batch_select_indices(indices)  # tensors transformers put there: its own way, adopted later
            return
        self._kbuf, self._vbuf = self._kbuf[indices], self._vbuf[indices]
        self.keys = self._kview = self._kbuf[..., : self._n, :]
        self.values = self._vview = self._vbuf[..., : self._n, :]


class ReservedCache(DynamicCache):
    """A ``DynamicCache`` of ``num_layers`` :class:`ReservedLayer` s, each with room for up to ``reserve``
    positions beyond the prompt made at the prefill (generate's ``past_key_values``; one per batch)."""

    def __init__(self, num_layers: int, reserve: int, chunk: int = CHUNK):
        Cache.__init__(self, layers=[ReservedLayer(reserve, chunk) for _ in range(num_layers)])
