"""``sglang-router`` in front of SGLang rollout servers (:mod:`paravt.engines.router` has the pool, the
process handling and vllm-router; docs/GUIDE.md, "Routers").

* :class:`SGLangRouter` runs ``python -m sglang_router.launch_router --policy manual --assignment-mode
  min_load``: a key stays on the server it first got until that server leaves the router; a new key goes to
  the server with the fewest requests in flight. Its servers are listed with ``GET /workers`` and removed with
  ``DELETE /workers/<id>``; its per-server request counts are ``smg_worker_cb_outcomes_total``.
* :class:`SGLangRouterClient` sends native ``/generate`` with the episode's key as ``X-SMG-Routing-Key``. The
  router rebuilds each body from its own typed request, whose ``SamplingParams`` has no ``logit_bias``: the
  ban on generating vision placeholders goes as a custom logit processor
  (:mod:`paravt.engines.sglang_logit_processor`), which the servers read with ``--enable-custom-logit-processor``.
"""

from __future__ import annotations

import re
import time
from typing import Any, Sequence

from paravt.engines.router import KeyedClient, RouterConfig, RouterProcess
from paravt.engines.sglang import SGLangEngine

SGLANG_KEY_HEADER = "X-SMG-Routing-Key"  # sglang-router's manual policy (src/policies/manual.rs)
# each request's outcome per server (recorded with the circuit breaker off too)
_SERVED = re.compile(r'^smg_worker_cb_outcomes_total\{([^}]*)\}\s+(\S+)', re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def sglang_router_command(cfg: RouterConfig, worker_urls: Sequence[str]) -> list[str]:
    """argv of sglang-router in front of ``worker_urls``: the manual policy (a key on one server until that
    server leaves; a new key on the server with the fewest requests in flight), keys unused for
    ``session_ttl_s`` forgotten, retries and circuit breaker off (as vllm-router's), its log at ``warn`` (at
    ``info`` it writes two lines per request)."""
    if not worker_urls:
        raise ValueError("a router needs at least one rollout server URL")
    if not cfg.port or not cfg.metrics_port:
        raise ValueError("sglang_router_command needs the router's port and metrics port "
                         "(SGLangRouter picks free ones)")
    return [cfg.python, "-m", "sglang_router.launch_router", "--host", cfg.host, "--port", str(cfg.port),
            "--worker-urls", *worker_urls, "--policy", "manual", "--assignment-mode", "min_load",
            "--max-idle-secs", str(int(cfg.session_ttl_s)),
            "--disable-retries", "--disable-circuit-breaker",
            "--worker-startup-timeout-secs", str(int(cfg.startup_timeout_s)), "--worker-startup-check-interval", "1",
            "--prometheus-host", cfg.host, "--prometheus-port", str(cfg.metrics_port), "--log-level", "warn",
            *cfg.extra_args]


class SGLangRouter(RouterProcess):
    """``sglang-router`` (``--policy manual --assignment-mode min_load``) in front of SGLang servers started
    with ``--enable-custom-logit-processor``."""

    name = "sglang-router"

    def command(self) -> tuple[list[str], dict[str, str]]:
        return sglang_router_command(self.cfg, self.worker_urls), {}

    def _listed(self) -> list[dict[str, Any]]:
        import requests  # noqa: PLC0415

        r = requests.get(self.cfg.url + "/workers", timeout=5)
        r.raise_for_status()
        return list(r.json()["workers"])

    def workers(self) -> list[str]:
        """The servers the router routes to (``GET /workers``)."""
        return [w["url"].rstrip("/") for w in self._listed()]

    def _remove(self, url: str) -> str | None:
        """``DELETE /workers/<id>``: the router queues the removal, so its list is read until ``url`` left it."""
        import requests  # noqa: PLC0415

        ids = [w["id"] for w in self._listed() if w["url"].rstrip("/") == url]
        for wid in ids:
            r = requests.delete(f"{self.cfg.url}/workers/{wid}", timeout=5)
            if r.status_code not in (200, 202):
                return f"HTTP {r.status_code}: {r.text[:200]}"
        deadline = time.monotonic() + 10
        while url in self.workers() and time.monotonic() < deadline:
            time.sleep(0.1)
        return None

    def served(self) -> dict[str, int]:
        import requests  # noqa: PLC0415

        text = requests.get(self.cfg.metrics_url, timeout=5).text
        out: dict[str, int] = {}
        for labels, n in _SERVED.findall(text):
            worker = dict(_LABEL.findall(labels)).get("worker")
            if worker:
                out[worker.rstrip("/")] = out.get(worker.rstrip("/"), 0) + int(float(n))
        return out

    def client(self, engines: Sequence[SGLangEngine], max_concurrency: int) -> "SGLangRouterClient":
        e = engines[0]
        return SGLangRouterClient(self.cfg.url, server=self, request_timeout_s=e.request_timeout_s,
                                  max_retries=e.max_retries, max_concurrency=max_concurrency,
                                  banned_token_ids=e.banned_token_ids, image_token_id=e.image_token_id,
                                  ban_by_processor=True)


class SGLangRouterClient(KeyedClient, SGLangEngine):
    """:class:`~paravt.engines.sglang.SGLangEngine` at sglang-router's URL: native ``/generate`` with the ban
    as a custom logit processor (the router drops ``logit_bias``), the key as ``X-SMG-Routing-Key``."""

    server_kind = "SGLang router"
    key_header = SGLANG_KEY_HEADER
