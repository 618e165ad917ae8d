"""Several servers as one engine (:mod:`paravt.engines.pool`): an episode and its sub-agents on one
server, a dead server evicted and its requests retried on another, the weight push to the live
servers only, and one error once no server is left. The servers are real ``hf_server`` processes on
localhost; the episode-level routing runs the real episode over scripted engines (tool calls on cue)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import signal
import subprocess
import sys
import time

import pytest
import requests

from paravt.agent.episode import EpisodeConfig, EpisodeSample, run_episode
from paravt.data.schema import load_rl_rows
from paravt.engines.base import EngineError, SamplingParams
from paravt.engines.factory import EngineHandle
from paravt.engines.pool import EnginePool
from paravt.engines.sglang import SGLangEngine
from paravt.models.parallel import free_port
from tests.helpers import ScriptedEngine, call

EPISODE = contextvars.ContextVar("episode", default=None)


class Recording(ScriptedEngine):
    """A scripted engine that records which episode (the test's context variable) sent each request. With a
    ``gate`` (an asyncio.Event), every request waits for it before it is answered."""

    def __init__(self, *a, gate=None, **kw):
        super().__init__(*a, **kw)
        self.episodes: list[tuple[str, bool]] = []
        self.gate = gate

    async def generate(self, input_ids, images, params):
        if self.gate is not None:
            await self.gate.wait()
        out = await super().generate(input_ids, images, params)
        self.episodes.append((EPISODE.get(), self.calls[-1]["sub"]))
        return out


def test_every_turn_and_sub_agent_of_an_episode_stays_on_one_server(tiny, world):
    _, proc = tiny
    rows, _ = load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])
    turns = ["Two windows.\n</think>\n" + call(0, 10) + "\n" + call(10, 20),
             "One more.\n</think>\n" + call(20, 30), "Done.\n</think>\n<answer>B</answer>"]
    def script(_turn: int, prompt: str) -> str:  # per request: by the tool responses the prompt holds so far
        return turns[{0: 0, 2: 1}.get(prompt.count("</tool_response>"), 2)]

    # No request is answered until all nine episodes have sent their first one: each episode's server is then
    # chosen with the earlier episodes' first requests still outstanding, however slowly this machine prepares an
    # episode (otherwise an episode whose first request was already answered no longer counts as load).
    gate = asyncio.Event()  # bound to the loop that first waits on it (asyncio.run's below)
    engines = [Recording(proc.tokenizer, script, delay_s=0.02, gate=gate) for _ in range(3)]
    pool = EnginePool(engines)

    async def one(i: int):
        EPISODE.set(f"ep{i}")
        return await run_episode(EpisodeSample.from_row(rows[i % len(rows)]), pool, proc,
                                 EpisodeConfig(max_new_tokens=256, max_turns=3), k=4, seed=i)

    async def go():
        tasks = [asyncio.create_task(one(i)) for i in range(9)]
        while sum(pool.outstanding) < 9 and not any(t.done() for t in tasks):
            await asyncio.sleep(0.005)
        gate.set()
        return await asyncio.gather(*tasks)
    trajs = asyncio.run(go())
    assert all(t.end_reason == "answer" and len(t.subagents) == 3 for t in trajs), [t.end_reason for t in trajs]
    where: dict[str, set[int]] = {}
    for n, e in enumerate(engines):
        for ep, _sub in e.episodes:
            where.setdefault(ep, set()).add(n)
    assert sorted(where) == [f"ep{i}" for i in range(9)]
    assert all(len(s) == 1 for s in where.values()), where  # 3 main turns + 3 sub-agents, one server each
    per_server = [sum(1 for s in where.values() if s == {n}) for n in range(3)]
    assert per_server == [3, 3, 3]  # new episodes go to the least loaded server
    assert all(sum(sub for _, sub in e.episodes) == 9 for e in engines)


class Dying(Recording):
    """A server that dies (refuses every request, fails its health probe) when the first sub-agent
    request reaches it."""

    dead = False

    async def generate(self, input_ids, images, params):
        if "Describe concisely" in self.tok.decode(input_ids)[-600:]:
            self.dead = True
        if self.dead:
            await asyncio.sleep(0.01)
            raise ConnectionResetError("connection reset by peer")
        return await super().generate(input_ids, images, params)

    async def health(self) -> bool:
        return not self.dead


def test_an_episode_whose_server_dies_under_its_sub_agents_moves_to_one_server(tiny, world, caplog):
    """Both sub-agents of turn 0 fail on the episode's dying server; they, and every later turn and
    sub-agent of the episode, go to ONE of the two live servers (the other, as idle, gets nothing)."""
    _, proc = tiny
    caplog.set_level(logging.WARNING, logger="paravt.engines.pool")
    rows, _ = load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])
    turns = ["Two windows.\n</think>\n" + call(0, 10) + "\n" + call(10, 20),
             "One more.\n</think>\n" + call(20, 30), "Done.\n</think>\n<answer>B</answer>"]

    def script(_turn: int, prompt: str) -> str:
        return turns[{0: 0, 2: 1}.get(prompt.count("</tool_response>"), 2)]

    engines = [Dying(proc.tokenizer, script, delay_s=0.02)] + [Recording(proc.tokenizer, script, delay_s=0.02)
                                                               for _ in range(2)]
    pool = EnginePool(engines)

    async def go():
        EPISODE.set("ep")
        return await run_episode(EpisodeSample.from_row(rows[0]), pool, proc, EpisodeConfig(max_new_tokens=256,
                                                                                              max_turns=3), k=4, seed=0)
    traj = asyncio.run(go())
    assert traj.end_reason == "answer" and len(traj.subagents) == 3, (traj.end_reason, traj.error)
    assert [sub for _, sub in engines[0].episodes] == [False]  # turn 0, before it died
    assert [sub for _, sub in engines[1].episodes] == [True, True, False, True, False] and engines[2].episodes == []
    assert list(pool.evicted) == [0]
    lines = [r.getMessage() for r in caplog.records if "evicted" in r.getMessage()]
    assert len(lines) == 1 and "engine 0" in lines[0], lines


def _start(tiny_dir, n: int):
    """``n`` hf_server processes (SGLang's native API) serving the tiny model, once healthy."""
    procs, urls = [], []
    for _ in range(n):
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "paravt.engines.hf_server", "--model", str(tiny_dir),
                                       "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        for _ in range(240):
            try:
                if requests.get(url + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.5)
        else:
            for q in procs:
                q.kill()
            pytest.fail(f"hf_server at {url} did not start")
    return urls, procs


@pytest.fixture(scope="module")
def servers(tiny_dir):
    urls, procs = _start(tiny_dir, 2)
    yield urls, procs
    for p in procs:
        p.kill()
        p.wait(timeout=30)


def _pool(urls, **kw) -> EnginePool:
    return EnginePool([SGLangEngine(u, max_retries=0) for u in urls], **kw)


def test_episodes_stick_to_their_server_and_spread_over_the_servers(servers):
    urls, _ = servers
    p = SamplingParams(temperature=1.0, max_new_tokens=3, seed=1)

    async def go():
        pool = _pool(urls)
        try:
            views = [pool.for_episode(f"e{i}") for i in range(4)]
            for _ in range(3):  # three turns each, the four episodes at once
                outs = await asyncio.gather(*(v.generate([1, 2, 3], None, p) for v in views))
                assert all(o.error is None for o in outs), [o.error for o in outs]
            return [v.server_name for v in views], pool.take_served()
        finally:
            await pool.close()
    where, served = asyncio.run(go())
    assert sorted(where) == sorted(urls * 2)  # two episodes on each server, each for all its turns
    assert served == [6, 6]


def test_a_bad_request_on_a_live_server_is_the_requests_error_not_an_eviction(servers, tiny):
    urls, _ = servers
    _, proc = tiny
    pad = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")

    async def go():
        pool = _pool(urls)
        try:
            # pre-expanded image pads: the server answers 400 (SGLang's contract), its /health stays 200
            out = await pool.for_episode("x").generate([1, pad, pad, 2], None, SamplingParams(max_new_tokens=2))
            return out, dict(pool.evicted)
        finally:
            await pool.close()
    out, evicted = asyncio.run(go())
    assert out.finish_reason == "error" and "HTTP 400" in out.error
    assert evicted == {}


def test_a_dead_server_is_evicted_its_requests_retried_and_pushes_skip_it(servers, tiny_dir, tmp_path, caplog):
    """Runs last in this file: it kills both servers."""
    urls, procs = servers
    caplog.set_level(logging.WARNING, logger="paravt.engines.pool")
    long = SamplingParams(temperature=1.0, max_new_tokens=50, seed=3)
    short = SamplingParams(temperature=1.0, max_new_tokens=3, seed=4)
    pool = _pool(urls)
    handle = EngineHandle("sglang", pool, urls[0], urls=list(urls))

    from paravt.models.tiny import build_tiny

    build_tiny(tmp_path / "v2", seed=9)

    async def go():
        a, b = pool.for_episode("a"), pool.for_episode("b")
        await asyncio.gather(a.generate([1, 2], None, short), b.generate([1, 2], None, short))
        on_first = a if a.server == 0 else b
        procs[0].send_signal(signal.SIGSTOP)  # frozen: the three requests below are surely in flight when it dies
        inflight = [asyncio.ensure_future(on_first.generate([1, 2, 3], None, long)) for _ in range(3)]
        for _ in range(200):
            if pool.outstanding[0] == 3:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # sent: the server's socket holds them
        assert pool.outstanding[0] == 3
        procs[0].kill()
        procs[0].wait(timeout=30)
        outs = await asyncio.gather(*inflight)
        assert all(o.error is None and o.token_ids for o in outs), [o.error for o in outs]
        later = await on_first.generate([1, 2, 3], None, short)  # the episode's next turn
        fresh = await pool.for_episode("c").generate([1, 2], None, short)
        assert later.error is None and fresh.error is None and on_first.server == 1
        assert list(pool.evicted) == [0] and pool.live_urls() == [urls[1]]
        lines = [r.getMessage() for r in caplog.records if "evicted" in r.getMessage()]
        assert len(lines) == 1 and urls[0] in lines[0], lines  # one line, naming it, for three failed requests

        # the next push goes to the live server only (the trainer's push, from its own thread), which
        # then serves the new version
        await asyncio.to_thread(handle.push_weights, str(tmp_path / "v2"), 2)
        out = await pool.for_episode("d").generate([1, 2, 3], None, SamplingParams(temperature=0, max_new_tokens=4))
        assert out.error is None and out.weight_version == 2

        # the last server dies: every request fails with one error naming both, and so does the push
        procs[1].kill()
        procs[1].wait(timeout=30)
        first = await pool.for_episode("e").generate([1, 2], None, short)
        assert first.finish_reason == "error" and "no rollout server left" in first.error
        assert urls[0] in first.error and urls[1] in first.error
        t0 = time.monotonic()
        again = await pool.generate([1, 2], None, short)
        assert again.finish_reason == "error" and time.monotonic() - t0 < 1.0  # nothing is tried once none is left
        with pytest.raises(EngineError, match="no rollout server left"):
            await pool.update_weights(str(tmp_path / "v2"), 3)
        await pool.close()

    asyncio.run(go())
    with pytest.raises(EngineError, match="no rollout server left"):
        handle.push_weights(str(tmp_path / "v2"), 3)


def test_after_an_eviction_the_live_servers_form_a_new_weight_group_and_get_the_push(tmp_path):
    """BroadcastPush over gloo to receivers in other processes (each a member as a server's worker is):
    version 1 to two; one is evicted; version 2 goes to the live one alone, in a group formed anew."""
    import torch

    from paravt.core.weight_sync import TensorMeta, WeightBuckets, plan_buckets
    from paravt.engines.weight_push import BroadcastPush
    from tests.rl.push_fault_script import LocalReceiver

    class Receiver(LocalReceiver):  # one receiving process per group it joins
        def __init__(self, tmp, k):
            super().__init__(tmp, k)
            self.k, self.joins = k, 0

        async def init_weight_group(self, *a, **kw):
            self.joins += 1
            self.plan_file, self.out = tmp_path / f"plan{self.k}_{self.joins}.json", tmp_path / f"got{self.k}_{self.joins}.pt"
            await super().init_weight_group(*a, **kw)

    def version(v: float):
        w = {"a": torch.full((4, 4), v, dtype=torch.bfloat16), "b": torch.arange(6, dtype=torch.bfloat16) * v}
        plan = plan_buckets([TensorMeta(k, "bfloat16", tuple(t.shape)) for k, t in w.items()], 40)
        return WeightBuckets(plan, lambda i: [w[m.name] for m in plan[i]]), w

    a, b = Receiver(tmp_path, 0), Receiver(tmp_path, 1)
    push = BroadcastPush("gloo", "127.0.0.1", 60, join_timeout_s=60)
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]

    async def go():
        buckets, w1 = version(1.0)
        await push.push([a, b], urls, buckets, 1)
        first = push.group_name
        buckets, w2 = version(2.0)
        await push.push([a], urls[:1], buckets, 2)  # b evicted: the pool's live servers only
        return first, w1, w2
    first, w1, w2 = asyncio.run(go())
    assert push.group_name != first and push.members == urls[:1] and (a.joins, b.joins) == (2, 1)
    for path, want in ((tmp_path / "got0_1.pt", w1), (tmp_path / "got1_1.pt", w1), (tmp_path / "got0_2.pt", w2)):
        got = torch.load(path)
        assert all(torch.equal(got[k], want[k]) for k in want), path
    push.close()


def test_a_disk_push_evicts_a_server_that_died_unseen_and_reaches_the_live_one(tiny_dir, tmp_path, caplog):
    """No request saw it die: the push fails on it, the dead one is evicted and the push sent again."""
    from paravt.models.tiny import build_tiny

    caplog.set_level(logging.WARNING, logger="paravt.engines.pool")
    build_tiny(tmp_path / "v2", seed=9)
    urls, procs = _start(tiny_dir, 2)
    try:
        pool = _pool(urls)
        handle = EngineHandle("sglang", pool, urls[0], urls=list(urls))
        procs[1].kill()
        procs[1].wait(timeout=30)
        handle.push_weights(str(tmp_path / "v2"), 5)
        assert pool.live_urls() == [urls[0]] and "weight push failed" in pool.evicted[1]
        assert [r.getMessage() for r in caplog.records if urls[1] in r.getMessage()]

        async def go():
            try:
                return await pool.for_episode("x").generate([1, 2], None, SamplingParams(temperature=0, max_new_tokens=2))
            finally:
                await pool.close()
        out = asyncio.run(go())
        assert out.error is None and out.weight_version == 5
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)
