"""The vision-placeholder ban as an SGLang custom logit processor, for requests that reach SGLang
through ``sglang-router``.

The router rebuilds each ``/generate`` body from its own typed request, whose ``SamplingParams`` has no
``logit_bias`` and no ``custom_params``; it keeps the top-level ``custom_logit_processor`` string as
sent. So the ban travels as a processor class whose banned ids are written into the class (as SGLang's
own ``Qwen3ThinkingBudgetLogitProcessor`` carries its token ids): ``VisionTokenBan_3_4_5_6`` bans ids
3, 4, 5 and 6. SGLang (started with ``--enable-custom-logit-processor``) deserializes the string with
its ``CustomLogitProcessor.from_str`` (``dill.loads`` of ``{"callable": <hex>}``, then an instance),
and its sampler calls the instance on the logits of every request that carries it, before temperature
and sampling, so the returned logprobs are those of the distribution sampled from (the vision ids at
-inf, as in the trainer's re-score and the in-process engine).

* :func:`processor_string` writes the string without SGLang or dill: a class importable by its module
  and name pickles to a reference (module, name), which dill writes exactly as :mod:`pickle` does
  (SGLang's own ``to_str`` of the class gives the same string; the conformance group checks it).
* Reading it back imports this module on the server: SGLang servers started by
  :class:`~paravt.engines.sglang.SGLangServer` for rollouts have this repository on their
  ``PYTHONPATH``; a server started by hand needs it there too.
* The classes are made on first use from their name (:func:`__getattr__`, PEP 562), so any set of ids
  has one importable class. Inside an SGLang process each subclasses SGLang's ``CustomLogitProcessor``
  (its ``to_str`` / ``from_str`` then apply); elsewhere (the trainer, ``hf_server``) SGLang is never
  imported -- importing it patches transformers -- and the classes stand alone.

Nothing here imports anything but the standard library.
"""

from __future__ import annotations

import json
import pickle
import re
import sys
from typing import Any, Iterable

PREFIX = "VisionTokenBan"
_NAME = re.compile(rf"^{PREFIX}((?:_\d+)+)$")
_SGLANG_BASE = "sglang.srt.sampling.custom_logit_processor"
_CLASSES: dict[str, type] = {}


class _Ban:
    """Sets the logits of ``BANNED_TOKEN_IDS`` to -inf in every row (SGLang's processor signature:
    ``(logits [rows, vocab], custom_param_list) -> logits`` of the same shape; the params are unused)."""

    BANNED_TOKEN_IDS: tuple[int, ...] = ()

    def __call__(self, logits: Any, custom_param_list: Any = None) -> Any:
        if self.BANNED_TOKEN_IDS:
            logits[..., list(self.BANNED_TOKEN_IDS)] = float("-inf")
        return logits


def _sglang_base() -> type | None:
    """SGLang's ``CustomLogitProcessor`` when this process runs SGLang (its module is loaded), else None."""
    mod = sys.modules.get(_SGLANG_BASE)
    return getattr(mod, "CustomLogitProcessor", None)


def class_name(token_ids: Iterable[int]) -> str:
    ids = sorted({int(t) for t in token_ids})
    if not ids or any(t < 0 for t in ids):
        raise ValueError(f"a vision-token ban needs one or more token ids >= 0, got {list(token_ids)}")
    return PREFIX + "".join(f"_{t}" for t in ids)


def ban_class(token_ids: Iterable[int]) -> type:
    """The processor class banning ``token_ids`` (made once per process and id set; remade with SGLang's base
    class once SGLang is loaded, so a class made before keeps its pickled name and gains SGLang's methods)."""
    name = class_name(token_ids)
    base = _sglang_base()
    cls = _CLASSES.get(name)
    if cls is None or (base is not None and not issubclass(cls, base)):
        ids = tuple(int(x) for x in name[len(PREFIX) + 1:].split("_"))
        bases = (_Ban, base) if base is not None else (_Ban,)
        cls = type(name, bases, {"BANNED_TOKEN_IDS": ids, "__module__": __name__, "__qualname__": name,
                                 "__doc__": f"Bans token ids {list(ids)} (the vision placeholders)."})
        _CLASSES[name] = cls
    return cls


def __getattr__(name: str) -> type:
    """``VisionTokenBan_<id>_<id>…`` as a module attribute: how the unpickler (and dill's ``to_str``) finds it."""
    if _NAME.match(name):
        return ban_class(int(x) for x in name[len(PREFIX) + 1:].split("_"))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def processor_string(token_ids: Iterable[int]) -> str:
    """The ``custom_logit_processor`` of a request: SGLang's ``CustomLogitProcessor.to_str`` format,
    ``{"callable": <hex of the pickled class>}`` (the class by reference, in pickle's default protocol:
    dill's too)."""
    return json.dumps({"callable": pickle.dumps(ban_class(token_ids), protocol=pickle.DEFAULT_PROTOCOL).hex()})


def load_processor(text: str) -> Any:
    """A ``custom_logit_processor`` string read back as SGLang's ``from_str`` does (unpickle the class, make
    an instance), with the standard unpickler: it reads every class pickled by reference, as ours are; a
    class dill pickled by value needs dill (SGLang's servers have it). Raises ValueError on anything else."""
    try:
        obj = pickle.loads(bytes.fromhex(json.loads(text)["callable"]))  # noqa: S301 - the server opted in
        return obj()
    except Exception as exc:  # noqa: BLE001 - any failure is a bad request
        raise ValueError(f"custom_logit_processor could not be read ({type(exc).__name__}: {exc})") from None
