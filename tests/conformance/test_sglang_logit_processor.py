"""The vision-token ban as SGLang reads and applies it (sglang 0.5.23's own code; ``bash scripts/test.sh
--conformance -k logit_processor``).

sglang-router drops ``sampling_params.logit_bias``, so requests through it carry the ban as a custom logit
processor (:mod:`paravt.engines.sglang_logit_processor`). Checked here with the pinned wheel:

* our string is what SGLang's own ``CustomLogitProcessor.to_str`` writes for the class, and its ``from_str``
  reads it back as an instance of a ``CustomLogitProcessor`` whose class holds the ids;
* the body sglang-router forwarded of RL's request (recorded by tests/engines/test_sglang_router.py in
  ``sglang_router_generate.json``) passes the contract check SGLang's ``/generate`` route runs and decodes
  with SGLang's ``GenerateRequest``: the processor arrives, ``logit_bias`` does not;
* SGLang's sampler code (``apply_custom_logit_processor`` and ``Sampler._preprocess_logits``, compiled from
  the wheel's source) runs that processor on the tiny model's real logits: the vision ids of the rows that
  carry it go to -inf, everything else is untouched, and the log-probabilities after temperature are the
  trainer's re-score with the vision ids banned;
* the launcher's argv turns SGLang's ``--enable-custom-logit-processor`` on, with this repository on the
  server's ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from paravt.engines.sglang import SGLangServerConfig, launch_command
from paravt.engines.sglang_logit_processor import ban_class, processor_string
from tests.conformance.server_source import load_function, load_method

pytestmark = pytest.mark.conformance

from sglang.api.v1 import api_types as sgl_api  # noqa: E402  (the real modules; an ImportError fails the run)
from sglang.srt.entrypoints.api_contract import generate_contract_error  # noqa: E402
from sglang.srt.sampling import custom_logit_processor as sgl_clp  # noqa: E402
from sglang.srt.utils.async_probe import sanitize_nan_logits  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = json.loads((Path(__file__).with_name("sglang_router_generate.json")).read_text())


def test_our_string_is_sglangs_to_str_and_from_str_reads_it_back():
    ids = [151655, 151656, 151652, 151653]  # Qwen3-VL's <|image_pad|>, <|video_pad|>, <|vision_start|>, <|vision_end|>
    cls = ban_class(ids)
    assert issubclass(cls, sgl_clp.CustomLogitProcessor)
    assert cls.to_str() == processor_string(ids)  # SGLang's own serializer (dill) writes exactly our string
    proc = sgl_clp.CustomLogitProcessor.from_str(processor_string(ids))
    assert isinstance(proc, sgl_clp.CustomLogitProcessor) and type(proc).BANNED_TOKEN_IDS == tuple(sorted(ids))
    assert not sgl_clp.supports_sampling_mask(processor_string(ids))  # no sampling-mask replay asked of it


def test_the_routers_body_passes_sglangs_generate_contract_and_keeps_only_the_processor_ban():
    body = FIXTURE["forwarded"]
    assert generate_contract_error(body) is None  # what SGLang's /generate route checks first
    req = sgl_api.GenerateRequest.from_json_value(body)
    assert req.custom_logit_processor == processor_string(FIXTURE["banned_token_ids"])
    assert req.return_logprob is True and req.logprob_start_len == -1 and len(req.image_data) == 1
    assert req.sampling_params.sampling_seed == 12345 and req.sampling_params.stop_token_ids == [9]
    assert "logit_bias" not in body["sampling_params"]  # the router dropped it: the processor is the ban
    assert "logit_bias" in FIXTURE["sent"]["sampling_params"]


def _sglang_preprocess():
    """``Sampler._preprocess_logits`` with ``apply_custom_logit_processor``, from the wheel's own source."""
    apply = load_function("sglang", "srt/layers/sampler.py", "apply_custom_logit_processor",
                          {"torch": torch, "logger": logging.getLogger("sglang.sampler"), "SamplingBatchInfo": object})
    pre = load_method("sglang", "srt/layers/sampler.py", "Sampler", "_preprocess_logits",
                      {"apply_custom_logit_processor": apply, "sanitize_nan_logits": sanitize_nan_logits,
                       "torch": torch, "SamplingBatchInfo": object})
    return lambda logits, info: pre(None, logits, info)


class _BatchInfo(SimpleNamespace):
    """The fields of SGLang's ``SamplingBatchInfo`` the sampler's processor step reads; the processors as
    ``SamplingBatchInfo.from_schedule_batch`` builds them: one entry per distinct string, made by ``from_str``."""

    def __init__(self, processors: list[str | None], device: str = "cpu"):
        rows: dict[str, list[int]] = {}
        for i, p in enumerate(processors):
            if p is not None:
                rows.setdefault(p, []).append(i)
        entries = {hash(p): SimpleNamespace(processor=sgl_clp.CustomLogitProcessor.from_str(p), rows=r,
                                            indices=torch.tensor(r, dtype=torch.long)) for p, r in rows.items()}
        super().__init__(has_custom_logit_processor=bool(entries), custom_logit_processor=entries,
                         custom_params=[None] * len(processors), device=device, n=len(processors))

    def __len__(self) -> int:
        return self.n


def test_sglangs_sampler_bans_the_vision_ids_on_real_logits_with_the_routers_processor(tiny):
    from paravt.models.tokenize import vision_token_ids

    model, proc = tiny
    banned = vision_token_ids(proc.tokenizer)
    assert sorted(banned) == sorted(FIXTURE["banned_token_ids"])  # the fixture's ids are the tiny model's
    ids = proc.tokenizer.encode("The colour of the sky is", add_special_tokens=False)
    with torch.no_grad():
        row = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    # the vision ids are not already out of reach: the ban changes something
    assert torch.isfinite(row[banned]).all()
    logits = torch.stack([row, row + 0.5, row - 0.25])
    original = logits.clone()
    processor = FIXTURE["forwarded"]["custom_logit_processor"]
    out = _sglang_preprocess()(logits, _BatchInfo([processor, None, processor]))
    keep = torch.ones(row.numel(), dtype=torch.bool)
    keep[banned] = False
    for r in (0, 2):  # the rows that carry the processor
        assert torch.isneginf(out[r, banned]).all()
        assert torch.equal(out[r, keep], original[r, keep])
    assert torch.equal(out[1], original[1])  # a request without it is untouched
    # the sampler's standard path then divides by the temperature and normalises: the trainer's re-score
    t = 0.7
    served = torch.log_softmax(out[0] / t, dim=-1)
    trainer = torch.log_softmax((original[0] / t).masked_fill(~keep, float("-inf")), dim=-1)
    assert torch.allclose(served[keep], trainer[keep], atol=1e-6) and torch.isneginf(served[banned]).all()


def test_the_launcher_turns_sglangs_custom_logit_processor_on_with_this_repository_importable():
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv, env = launch_command(SGLangServerConfig(model_path="m", enable_custom_logit_processor=True))
    assert parser.parse_args(argv[3:]).enable_custom_logit_processor
    first = env["PYTHONPATH"].split(os.pathsep)[0]
    assert (Path(first) / "paravt/engines/sglang_logit_processor.py").is_file() and Path(first) == ROOT
    argv, env = launch_command(SGLangServerConfig(model_path="m"))
    assert not parser.parse_args(argv[3:]).enable_custom_logit_processor and "PYTHONPATH" not in env
