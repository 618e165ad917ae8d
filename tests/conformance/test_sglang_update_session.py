"""Our SGLang client's push against the pinned SGLang's own weight-update session.

sglang 0.5.23 refuses ``/update_weights_from_distributed`` unless ``/begin_weight_update`` opened a
session, and refuses a second ``begin`` until ``/end_weight_update`` closed it. The scheduler's
``SchedulerWeightUpdaterManager`` methods that decide this (begin, end, update_weights_from_distributed,
the runner selection, the cache flush) are compiled from the installed wheel's source and served
behind the same routes and status codes as SGLang's ``http_server.py``; the model runner below them
(the NCCL receive and the load) is a recorder. Our client (:class:`paravt.engines.sglang.SGLangEngine`)
is driven exactly as :class:`paravt.engines.weight_push.BroadcastPush` drives it.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import msgspec
import pytest
import torch
import torch.distributed as dist

from paravt.core.weight_sync import TensorMeta, plan_buckets
from paravt.engines.base import EngineError
from paravt.engines.sglang import SGLangEngine
from tests.conformance.server_source import load_method, load_structs

pytestmark = pytest.mark.conformance

UPDATER = "srt/managers/scheduler_components/weight_updater.py"
CLS = "SchedulerWeightUpdaterManager"


class _Runner:
    """The model runner's weight updater: what reaches it, in order."""

    def __init__(self, log: list):
        self.log = log

    def begin_weight_update(self):
        self.log.append("runner.begin")

    def end_weight_update(self, *, run_post_load):
        self.log.append(f"runner.end(post_load={run_post_load})")

    def receive_weights_from_distributed(self, names, dtypes, shapes, group_name, load_format):
        self.log.append(("receive", tuple(names), load_format))
        return list(names)

    def load_weights_from_distributed(self, weights):
        return True, "ok"


def _manager(log: list):
    """A SchedulerWeightUpdaterManager whose session logic is the wheel's own code."""
    io = load_structs("sglang", "srt/managers/io_struct.py", [
        "BeginWeightUpdateReqInput", "BeginWeightUpdateReqOutput", "EndWeightUpdateReqInput",
        "EndWeightUpdateReqOutput", "UpdateWeightsFromDistributedReqInput", "UpdateWeightsFromDistributedReqOutput"])
    session = load_structs("sglang", UPDATER, ["_WeightUpdateSession"])["_WeightUpdateSession"]
    ns = {**io, "_WeightUpdateSession": session, "msgspec": msgspec, "torch": torch, "logger": SimpleNamespace(
        error=lambda *a, **k: None), "List": list, "Tuple": tuple, "Any": object}
    ns["_parse_runner_selector"] = _module_function("_parse_runner_selector", {"Set": set})
    methods = {m: load_method("sglang", UPDATER, CLS, m, ns) for m in (
        "begin_weight_update", "end_weight_update", "update_weights_from_distributed",
        "flush_cache_after_weight_update", "record_weight_version_after_update")}
    methods["_select_runners"] = load_method("sglang", UPDATER, CLS, "_select_runners", ns)
    # a @contextmanager in the source; the decorator is not part of the method's text
    methods["_observe_weight_load"] = contextlib.contextmanager(
        load_method("sglang", UPDATER, CLS, "_observe_weight_load", {"time": __import__("time")}))
    runner = SimpleNamespace(weight_updater=_Runner(log))
    mgr = type("Manager", (), methods)()
    mgr.tp_worker = SimpleNamespace(weight_update_runners=lambda: [("target", runner)], model_runner=runner)
    mgr.draft_worker = None
    mgr.metrics_collector = None
    mgr._session = None
    mgr.tp_cpu_group = None  # the default (one-process gloo) group below stands for the TP group
    mgr.flush_cache = lambda empty_cache=False: log.append("flush") or True
    mgr.scheduler = SimpleNamespace(record_weight_version_change=lambda new_version: log.append(("version", new_version)))
    return mgr, io


def _module_function(name: str, namespace: dict):
    import ast
    import textwrap

    from tests.conformance.server_source import package_dir

    path = package_dir("sglang") / UPDATER
    src = path.read_text()
    node = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == name)
    ns = dict(namespace)
    exec(compile(textwrap.dedent(ast.get_source_segment(src, node)), f"{path}:{name}", "exec"), ns)  # noqa: S102
    return ns[name]


@pytest.fixture(scope="module", autouse=True)
def _tp_group():
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


async def _serve(mgr, io, log):
    """SGLang's routes for a push, with http_server.py's status codes (200, else 400)."""
    from aiohttp import web

    def route(method, struct):
        async def handler(request):
            body = await request.json()
            out = getattr(mgr, method)(msgspec.convert(body, io[struct]))
            log.append(method if out.success else f"{method} refused")
            return web.json_response({"success": out.success, "message": out.message},
                                     status=200 if out.success else 400)
        return handler

    async def plain(request):
        log.append(request.path.strip("/"))
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/begin_weight_update", route("begin_weight_update", "BeginWeightUpdateReqInput"))
    app.router.add_post("/end_weight_update", route("end_weight_update", "EndWeightUpdateReqInput"))
    app.router.add_post("/update_weights_from_distributed",
                        route("update_weights_from_distributed", "UpdateWeightsFromDistributedReqInput"))
    app.router.add_post("/pause_generation", plain)
    app.router.add_post("/continue_generation", plain)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


PLAN = plan_buckets([TensorMeta("a.weight", "bfloat16", (4, 4)), TensorMeta("b.weight", "bfloat16", (8,)),
                     TensorMeta("c.weight", "bfloat16", (16,))], bucket_bytes=40)


async def _push(engine: SGLangEngine, version: int, fail_at: int | None = None) -> None:
    """BroadcastPush's calls on one server (the bytes themselves travel by NCCL, not HTTP)."""
    await engine.begin_broadcast(PLAN, version, "g")
    ok = False
    try:
        for i in range(len(PLAN)):
            if i == fail_at:
                raise EngineError("the broadcast of this bucket failed")
            await engine.bucket_request(i)
        ok = True
    finally:
        await engine.end_broadcast(version, ok)


def _run(coro_fn):
    async def main():
        log: list = []
        mgr, io = _manager(log)
        runner, url = await _serve(mgr, io, log)
        engine = SGLangEngine(url)
        try:
            return await coro_fn(engine, mgr, log)
        finally:
            await engine.close()
            await runner.cleanup()
    return asyncio.run(main())


def test_a_push_runs_inside_one_session_and_tags_its_version():
    async def go(engine, mgr, log):
        await _push(engine, 7)
        return log, mgr
    log, mgr = _run(go)
    assert log[0] == "pause_generation" and log[-1] == "continue_generation"
    assert "update_weights_from_distributed refused" not in log
    i_begin, i_end = log.index("begin_weight_update"), log.index("end_weight_update")
    receives = [i for i, x in enumerate(log) if isinstance(x, tuple) and x[0] == "receive"]
    assert len(receives) == len(PLAN) and i_begin < min(receives) and max(receives) < i_end
    assert ("version", "7") in log and mgr._session is None
    assert "runner.end(post_load=False)" in log  # weights were loaded in the session


def test_two_pushes_in_a_row_each_open_and_close_their_session():
    async def go(engine, mgr, log):
        await _push(engine, 1)
        await _push(engine, 2)
        return log
    log = _run(go)
    assert log.count("begin_weight_update") == 2 and log.count("end_weight_update") == 2
    assert not any(isinstance(x, str) and x.endswith("refused") for x in log), log


def test_a_failed_push_closes_its_session_so_the_next_one_can_open():
    async def go(engine, mgr, log):
        with pytest.raises(EngineError):
            await _push(engine, 1, fail_at=1)
        assert mgr._session is None
        await _push(engine, 2)
        return log
    log = _run(go)
    assert "begin_weight_update refused" not in log and ("version", "2") in log


def test_a_session_left_open_by_a_dead_trainer_is_closed_before_the_next_push():
    async def go(engine, mgr, log):
        await engine.begin_broadcast(PLAN, 1, "g")  # the trainer dies here: nobody closes it
        await _push(engine, 2)
        return log
    log = _run(go)
    assert "begin_weight_update refused" in log  # SGLang's own answer to a second begin ...
    assert ("version", "2") in log and "update_weights_from_distributed refused" not in log  # ... and recovered
