"""A stand-in SGLang server that records what reaches it: ``python -m tests.engines.sglang_recorder --port P
--log FILE [--delay S]``. Every request is one JSON line in FILE (method, path, headers, body); ``/health``
answers 200 and ``/generate`` a canned SGLang answer (two output tokens with their logprobs, after ``--delay``
seconds, so requests sent together are in flight together); anything else 404, as a server without that
route. What a router forwards is then read from FILE, byte for byte."""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web

ANSWER = {"text": "ab", "output_ids": [11, 12],
          "meta_info": {"id": "rec", "finish_reason": {"type": "length", "length": 2}, "completion_tokens": 2,
                        "output_token_logprobs": [[-0.5, 11, None], [-0.25, 12, None]], "weight_version": "0",
                        "cached_tokens": 0, "e2e_latency": 0.0}}


def build_app(log_file: str, delay_s: float = 0.0) -> web.Application:
    async def any_request(req: web.Request) -> web.StreamResponse:
        body = await req.read()
        with open(log_file, "a") as f:
            f.write(json.dumps({"method": req.method, "path": req.path_qs, "headers": dict(req.headers),
                                "body": body.decode(errors="replace")}) + "\n")
        if req.path == "/health":
            return web.Response(text="ok")
        if req.path == "/generate" and req.method == "POST":
            await asyncio.sleep(delay_s)
            return web.json_response(ANSWER)
        return web.json_response({"error": {"message": f"no route {req.path}"}}, status=404)

    app = web.Application(client_max_size=512 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", any_request)
    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--delay", type=float, default=0.0)
    a = p.parse_args()
    web.run_app(build_app(a.log, a.delay), host="127.0.0.1", port=a.port, print=None)


if __name__ == "__main__":
    main()
