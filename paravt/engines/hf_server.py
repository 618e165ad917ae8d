"""Serve an in-process :class:`~paravt.engines.hf.HFEngine` over HTTP, on CPU or GPU.

    python -m paravt.engines.hf_server --model DIR [--host 127.0.0.1] [--port 30000]

It speaks the subset of SGLang's native API that ParaVT's rollout client uses
(``/health``, ``/generate`` with ``input_ids`` + ``image_data`` + ``return_logprob``,
``/update_weights_from_disk``) and the OpenAI ``/v1/chat/completions`` (+ ``/v1/models``)
that the eval client uses. So the remote-engine code paths (RL with a rollout server in its
own process, eval against a server) run for real on a machine where SGLang cannot.

Where the clients depend on it, it behaves like the real servers (checked against their code
in ``tests/conformance``): ``/generate`` takes ONE ``<|image_pad|>`` per image and expands it
to the image's patch tokens itself, rejecting pre-expanded ids as SGLang's processor does, and
reports ``meta_info.prompt_tokens`` of the expanded prompt; chat completions return token ids
only when asked (``return_token_ids``, as vLLM: output ids on the choice, ``prompt_token_ids`` on the
response), answer 404 to a model name it does not serve, and 400 to per-request ``media_io_kwargs`` /
``mm_processor_kwargs`` unless started with ``--trust-request-mm-kwargs`` (vLLM's rule). It does not
decode video: a ``video_url`` item is a 400 naming the servers that do (the real-server tests run them).

A ``/generate`` body's ``custom_logit_processor`` (what crosses sglang-router in place of ``logit_bias``) is
refused as SGLang refuses it unless the server was started with ``--enable-custom-logit-processor``. With
it, the string is read back as SGLang's ``CustomLogitProcessor.from_str`` reads it, with the standard
unpickler (:func:`paravt.engines.sglang_logit_processor.load_processor`; ours are pickled by reference,
which it reads as dill does), and run once on a row of logits. The engine here always bans the vision
placeholders itself and applies no other processor, so it serves only a processor that bans exactly those
ids (a 400 otherwise), instead of ignoring a processor it cannot apply.
"""

from __future__ import annotations

import argparse
import base64
import io
import logging
import sys
import time
from typing import Any

from PIL import Image

from paravt.core.startup import ready
from paravt.engines.base import SamplingParams
from paravt.engines.hf import HFEngine
from paravt.models.images import ImageInputs

log = logging.getLogger(__name__)


def decode_image(url: str) -> Image.Image:
    if url.startswith("data:"):
        return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
    path = url[len("file://"):] if url.startswith("file://") else url
    return Image.open(path).convert("RGB")


def _params_from_sglang(sp: dict[str, Any]) -> SamplingParams:
    # logit_bias is accepted and ignored: the HF engine always bans the vision placeholder tokens
    return SamplingParams(temperature=float(sp.get("temperature", 1.0)), top_p=float(sp.get("top_p", 1.0)),
                          top_k=int(sp.get("top_k", -1)), max_new_tokens=int(sp.get("max_new_tokens", 128)),
                          stop=list(sp.get("stop") or []), stop_token_ids=list(sp.get("stop_token_ids") or []),
                          seed=sp.get("sampling_seed"), frequency_penalty=float(sp.get("frequency_penalty", 0.0)),
                          presence_penalty=float(sp.get("presence_penalty", 0.0)))


def _chat_messages(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in msgs:
        c = m.get("content")
        if isinstance(c, list):
            items = []
            for it in c:
                if it.get("type") == "image_url":
                    url = it["image_url"]["url"] if isinstance(it["image_url"], dict) else it["image_url"]
                    items.append({"type": "image", "image": decode_image(url)})
                elif it.get("type") == "text":
                    items.append({"type": "text", "text": it.get("text", "")})
                elif it.get("type") == "video_url":
                    raise ValueError("video_url is not served by hf_server (it does not decode video): "
                                     "use a vLLM or SGLang server for the video_url channel")
                else:
                    raise ValueError(f"unsupported content item type {it.get('type')!r}")
            c = items
        out.append({"role": m["role"], "content": c if c is not None else ""})
    return out


def expand_image_pads(ids: list[int], images: ImageInputs, processor, pad: int) -> list[int]:
    """SGLang's contract for ``input_ids`` with ``image_data``: one ``pad`` per image, each replaced
    here by the image's patch tokens (grid t·h·w / merge²)."""
    n_pads = ids.count(pad)
    if n_pads != len(images):
        raise ValueError(f"{n_pads} <|image_pad|> tokens for {len(images)} images: send one per image "
                         "(the server expands them)")
    if not len(images):
        return ids
    grid = images.tensors(processor)[1]
    merge = processor.image_processor.merge_size
    out, i = [], 0
    for t in ids:
        if t == pad:
            out.extend([pad] * (int(grid[i].prod()) // (merge * merge)))
            i += 1
        else:
            out.append(t)
    return out


# SGLang's answer to a processor sent to a server started without the flag (managers/tokenizer_manager.py)
PROCESSOR_OFF = ("The server is not configured to enable custom logit processor. Please set "
                 "`--enable-custom-logit-processor` to enable this feature.")


_CHECKED: dict[tuple[str, tuple[int, ...]], str | None] = {}  # each distinct processor is read once


def check_processor(text: str, banned: list[int]) -> str | None:
    """Why ``text`` (a ``custom_logit_processor``) cannot be served by an engine that bans ``banned`` and applies
    nothing else, or None when it bans exactly those ids: it is read back and run on a row of zero logits."""
    key = (text, tuple(banned))
    if key in _CHECKED:
        return _CHECKED[key]
    import torch  # noqa: PLC0415

    from paravt.engines.sglang_logit_processor import load_processor  # noqa: PLC0415

    why = None
    try:
        proc = load_processor(text)
        row = torch.zeros(1, max(banned, default=0) + 2)
        out = proc(row.clone(), [None])
        hit = sorted(int(i) for i in torch.nonzero(torch.isneginf(out[0])).flatten())
        if tuple(out.shape) != tuple(row.shape) or hit != sorted(set(banned)):
            why = (f"custom_logit_processor {type(proc).__name__} sets ids {hit} to -inf; this server bans the "
                   f"vision placeholders {sorted(set(banned))} and applies no other processor")
    except Exception as exc:  # noqa: BLE001 - a bad processor is a bad request
        why = f"custom_logit_processor: {exc}"
    _CHECKED[key] = why
    return why


def build_app(engine: HFEngine, model_name: str = "paravt", trust_request_mm_kwargs: bool = False,
              enable_custom_logit_processor: bool = False):
    from aiohttp import web  # noqa: PLC0415

    from paravt.models.tokenize import encode_text  # noqa: PLC0415

    tok = engine.tokenizer
    routes = web.RouteTableDef()

    @routes.get("/health")
    async def health(_):
        return web.Response(text="ok")

    @routes.get("/v1/models")
    async def models(_):
        return web.json_response({"object": "list", "data": [{"id": model_name, "object": "model"}]})

    pad = tok.convert_tokens_to_ids("<|image_pad|>")

    @routes.post("/generate")
    async def generate(req):
        body = await req.json()
        processor = body.get("custom_logit_processor")
        if processor is not None:
            why = PROCESSOR_OFF if not enable_custom_logit_processor else check_processor(processor, engine.banned_ids)
            if why is not None:
                return web.json_response({"error": {"message": why}}, status=400)
        try:
            params = _params_from_sglang(body.get("sampling_params") or {})
            imgs = ImageInputs([decode_image(u) for u in body.get("image_data") or []])
            ids = expand_image_pads(list(body["input_ids"]), imgs, engine.processor, pad)
        except (KeyError, ValueError, TypeError) as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        out = await engine.generate(ids, imgs if len(imgs) else None, params)
        if out.error:
            return web.json_response({"error": {"message": out.error}}, status=500)
        return web.json_response({
            "text": tok.decode(out.token_ids, skip_special_tokens=False),
            "output_ids": out.token_ids,
            "meta_info": {"output_token_logprobs": [[lp, t, None] for lp, t in zip(out.logprobs, out.token_ids)],
                          "finish_reason": {"type": out.finish_reason}, "prompt_tokens": len(ids),
                          "completion_tokens": len(out.token_ids), "weight_version": str(out.weight_version)},
        })

    @routes.post("/update_weights_from_disk")
    async def update(req):
        body = await req.json()
        try:
            await engine.update_weights(body["model_path"], int(body.get("weight_version", engine.weight_version + 1)))
        except Exception as exc:  # noqa: BLE001
            return web.json_response({"success": False, "message": str(exc)})
        return web.json_response({"success": True, "message": f"loaded {body['model_path']}"})

    @routes.post("/v1/chat/completions")
    async def chat(req):
        body = await req.json()
        if (body.get("media_io_kwargs") or body.get("mm_processor_kwargs")) and not trust_request_mm_kwargs:
            return web.json_response({"error": {"message": "per-request media_io_kwargs / mm_processor_kwargs need "
                                                "--trust-request-mm-kwargs (as vLLM)", "code": 400}}, status=400)
        if body.get("model") not in (None, model_name):
            return web.json_response({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                "type": "NotFoundError", "code": 404}}, status=404)
        try:
            msgs = _chat_messages(body["messages"])
            cont = bool(body.get("continue_final_message")) and msgs and msgs[-1]["role"] == "assistant"
            prefix = msgs.pop()["content"] if cont else ""
            text = engine.processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) + prefix
            images = [i["image"] for m in msgs if isinstance(m["content"], list) for i in m["content"]
                      if i.get("type") == "image"]
            ids, imgs = encode_text(engine.processor, text, images)
            params = SamplingParams(temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                                    max_new_tokens=int(body.get("max_tokens") or 512),
                                    stop=list(body.get("stop") or []), seed=body.get("seed"),
                                    frequency_penalty=float(body.get("frequency_penalty") or 0.0),
                                    presence_penalty=float(body.get("presence_penalty") or 0.0))
        except (KeyError, ValueError, TypeError) as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        out = await engine.generate(ids, imgs, params)
        if out.error:
            return web.json_response({"error": {"message": out.error}}, status=500)
        eos = tok.convert_tokens_to_ids("<|im_end|>")
        ids_out = out.token_ids[:-1] if out.token_ids and out.token_ids[-1] == eos else out.token_ids
        choice = {"index": 0, "message": {"role": "assistant", "content": tok.decode(ids_out)},
                  "finish_reason": out.finish_reason}
        extra = {}
        if body.get("return_token_ids"):  # vLLM: output ids on the choice, prompt ids on the response
            choice["token_ids"] = out.token_ids
            extra["prompt_token_ids"] = list(ids)
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": tok.decode([t]), "logprob": lp}
                                              for t, lp in zip(out.token_ids, out.logprobs)]}
        return web.json_response({"id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion",
                                  "model": body.get("model", model_name), "choices": [choice],
                                  "usage": {"prompt_tokens": len(ids), "completion_tokens": len(out.token_ids)},
                                  **extra})

    app = web.Application(client_max_size=512 * 1024 * 1024)
    app.add_routes(routes)
    return app


def main(argv: list[str] | None = None) -> int:
    from aiohttp import web  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="python -m paravt.engines.hf_server", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--trust-request-mm-kwargs", action="store_true", help="accept per-request media_io_kwargs (as vLLM)")
    p.add_argument("--enable-custom-logit-processor", action="store_true",
                   help="accept /generate's custom_logit_processor (as SGLang): the vision-token ban only")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    engine = HFEngine.from_pretrained(a.model, dtype=a.dtype, max_batch_size=a.max_batch_size)
    app = build_app(engine, trust_request_mm_kwargs=a.trust_request_mm_kwargs,
                    enable_custom_logit_processor=a.enable_custom_logit_processor)
    ready()  # loaded: the collector runs again while it serves (paravt.core.startup)
    web.run_app(app, host=a.host, port=a.port, print=lambda *x: log.info(*x))
    return 0


if __name__ == "__main__":
    sys.exit(main())
