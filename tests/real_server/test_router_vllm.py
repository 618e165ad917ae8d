"""Two REAL vLLM rollout servers (CPU build) behind a REAL vllm-router (:mod:`paravt.engines.router`):

* RL's request (an overview prompt with images, banned vision tokens, a seed) through the router gives the
  ids, logprobs and served prompt ids a direct request gives: the router forwards the tokens endpoint;
* every request of an episode, its sub-agents' included, reaches one server; new episodes spread over both
  (the router's own log of where it sent each request, at debug level, and its request counts);
* a server killed with requests in flight: it is evicted with one warning line and removed from the
  router, its requests and its episodes' later turns are served by the other, the next weight push
  reaches the live server only; with the last one killed every request fails at once naming both, and
  so does the push.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import time
from pathlib import Path

import pytest
import requests

from tests.real_server import test_rl_vllm

overview = test_rl_vllm.prompt  # its fixture: a 4-frame overview prompt, (ids, images, processor)

pytestmark = pytest.mark.real_server

ROOT = Path(__file__).resolve().parents[2]
SLL = re.compile(r"SLL: (?:new session|session) '([^']+)' -> (?:existing )?replica '([^']+)'")


@pytest.fixture(scope="module")
def routed(_rollout_holder, spare, sft_checkpoint, tmp_path_factory):
    """(pool, servers, router log): the group's two rollout servers (its rollout server and its spare), then
    the router in front of them."""
    from paravt.engines.router import RoutedPool, RouterConfig
    from paravt.engines.vllm import VLLMEngine
    from paravt.models.loading import load_processor
    from paravt.models.tokenize import image_pad_id, vision_token_ids

    logs = tmp_path_factory.mktemp("router_logs")
    tok = load_processor(sft_checkpoint).tokenizer
    servers, pool = [_rollout_holder.get(), spare.get()], None
    try:
        engines = [VLLMEngine(s.cfg.url, server=s, model="paravt-tiny", max_retries=0, image_token_id=image_pad_id(tok),
                              banned_token_ids=vision_token_ids(tok)) for s in servers]
        log_file = logs / "router.log"
        # debug: the router writes one line per request naming its key and server
        pool = RoutedPool.start(engines, RouterConfig(log_file=str(log_file), extra_args=["--log-level", "debug"]))
        yield pool, servers, log_file
    finally:
        if pool is not None:
            pool.router.stop()


def _where(log_file: Path, since: int) -> list[tuple[str, str]]:
    """(key, server) of every request with a key the router logged after byte ``since``."""
    with open(log_file, errors="replace") as f:
        f.seek(since)
        return SLL.findall(f.read())


def test_a_request_through_the_router_is_the_request_sent_direct(routed, overview):
    from paravt.engines.base import SamplingParams

    pool, _, _ = routed
    ids, images, _ = overview
    p = SamplingParams(temperature=1.0, max_new_tokens=12, seed=5)

    async def go():
        try:
            view = pool.for_episode("same")
            first = await view.generate(ids, images, p)
            server = next(i for i, n in enumerate(pool.take_served()) if n)
            direct = await pool.engines[server].generate(ids, images, p)
            return first, direct
        finally:
            await pool.close()
    routed_out, direct = asyncio.run(go())
    assert routed_out.error is None and direct.error is None, (routed_out.error, direct.error)
    assert routed_out.token_ids == direct.token_ids and routed_out.token_ids
    assert max(abs(a - b) for a, b in zip(routed_out.logprobs, direct.logprobs)) < 1e-6
    assert routed_out.prompt_token_ids == direct.prompt_token_ids == list(ids)  # images expanded as locally


def test_every_request_of_an_episode_and_its_sub_agents_reaches_one_server(routed, overview, sft_world, sft_checkpoint):
    """Six scripted episodes (3 turns, the second with 3 sub-agent calls at once, on the episode's view as the
    episode gives them), then real episodes of the tiny SFT model: the router sent each key to one server."""
    from paravt.agent.episode import EpisodeConfig, EpisodeSample, run_episode
    from paravt.engines.base import SamplingParams
    from paravt.eval.splits import load_split

    pool, _, log_file = routed
    ids, images, proc = overview
    p = SamplingParams(temperature=1.0, max_new_tokens=4, seed=1)
    since = log_file.stat().st_size
    pool.take_served()

    async def episode(key: str) -> int:
        view = pool.for_episode(key)
        for turn in range(3):
            n = 3 if turn == 1 else 1
            outs = await asyncio.gather(*(view.generate(ids, images, p) for _ in range(n)))
            assert all(o.error is None for o in outs), [o.error for o in outs]
        return 5

    samples = load_split("synthetic", "", str(sft_world / "local"))[:4]
    cfg = EpisodeConfig(max_new_tokens=64, max_turns=2)

    async def go():
        try:
            scripted = await asyncio.gather(*(episode(f"s{i}") for i in range(6)))
            real = await asyncio.gather(*(run_episode(EpisodeSample(s.id, s.question, s.video, s.duration), pool, proc,
                                                      cfg, k=4, seed=i) for i, s in enumerate(samples)))
            return scripted, real
        finally:
            await pool.close()
    scripted, real = asyncio.run(go())
    time.sleep(0.5)  # the router's log is written by its own threads
    sent = _where(log_file, since)
    servers: dict[str, set[str]] = {}
    count: dict[str, int] = {}
    for key, url in sent:
        servers.setdefault(key, set()).add(url)
        count[key] = count.get(key, 0) + 1
    assert all(len(s) == 1 for s in servers.values()), servers
    assert [count[f"s{i}"] for i in range(6)] == scripted  # every request of the view, sub-agents' included, keyed
    for i, (s, t) in enumerate(zip(samples, real)):
        assert t.error is None, t.error
        assert count[f"{s.id}/{i}"] == len(t.turns) + len(t.subagents)
    per_server = [sum(1 for k in servers if k.startswith("s") and servers[k] == {u}) for u in pool.names]
    # a new episode goes to the server with fewer keys: six new ones after one older key split 3/3 or 2/4
    assert min(per_server) >= 2, per_server
    assert sum(pool.take_served()) == len(sent)  # no request without its key
    assert "stateless request" not in log_file.read_text(errors="replace")[since:]


def test_a_killed_server_is_evicted_and_its_requests_and_episodes_go_to_the_other(routed, overview, tmp_path, caplog):
    """Runs last in this file: it kills both servers."""
    from paravt.engines.base import EngineError, SamplingParams
    from paravt.engines.factory import EngineHandle
    from paravt.models.tiny import build_tiny

    pool, servers, _ = routed
    ids, images, _ = overview
    caplog.set_level(logging.WARNING, logger="paravt.engines.pool")
    short = SamplingParams(temperature=1.0, max_new_tokens=3, seed=4)
    long = SamplingParams(temperature=1.0, max_new_tokens=48, seed=3)
    build_tiny(tmp_path / "v2", seed=9)
    handle = EngineHandle("vllm", pool, pool.names[0], urls=list(pool.names), model_name="paravt-tiny")

    async def go():
        try:
            a = pool.for_episode("victim")
            pool.take_served()
            await a.generate(ids, images, short)
            victim = pool.take_served().index(1)  # the server the router chose for the episode
            other = 1 - victim
            pid = servers[victim].proc.pid
            os.killpg(pid, signal.SIGSTOP)  # frozen: the requests below are surely in flight when it dies
            inflight = [asyncio.ensure_future(a.generate(ids, images, long)) for _ in range(3)]
            await asyncio.sleep(1.0)
            os.killpg(pid, signal.SIGKILL)
            outs = await asyncio.gather(*inflight)
            assert all(o.error is None and o.token_ids for o in outs), [o.error for o in outs]
            later = await a.generate(ids, images, short)  # the episode's next turn
            assert later.error is None
            assert list(pool.evicted) == [victim] and pool.live_urls() == [pool.names[other]]
            lines = [r.getMessage() for r in caplog.records if "evicted" in r.getMessage()]
            assert len(lines) == 1 and pool.names[victim] in lines[0], lines
            listed = requests.get(pool.router.cfg.url + "/list_workers", timeout=5).json()["urls"]
            assert listed == [pool.names[other]]

            # the next push goes to the live server alone, which then serves the new version
            await asyncio.to_thread(handle.push_weights, str(tmp_path / "v2"), 2)
            out = await pool.for_episode("after").generate(ids, images, SamplingParams(temperature=0, max_new_tokens=4))
            assert out.error is None and out.weight_version == 2

            # the last one dies: each request fails at once, naming both; so does the push
            os.killpg(servers[other].proc.pid, signal.SIGKILL)
            first = await pool.for_episode("end").generate(ids, images, short)
            assert first.finish_reason == "error" and "no rollout server left" in first.error
            assert all(n in first.error for n in pool.names)
            t0 = time.monotonic()
            again = await pool.generate(ids, images, short)
            assert again.finish_reason == "error" and time.monotonic() - t0 < 1.0
        finally:
            await pool.close()

    asyncio.run(go())
    with pytest.raises(EngineError, match="no rollout server left"):
        handle.push_weights(str(tmp_path / "v2"), 3)
