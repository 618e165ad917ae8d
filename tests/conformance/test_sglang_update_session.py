"""Our SGLang client's push against the pinned SGLang's own weight-update session.

sglang 0.5.23 refuses ``/update_weights_from_distributed`` unless ``/begin_weight_update`` opened a
session, and refuses a second ``begin`` until ``/end_weight_update`` closed it. The scheduler's
``SchedulerWeightUpdaterManager`` methods that decide this (begin, end, update_weights_from_distributed,
the runner selection, the cache flush) are compiled from the installed wheel's source and served
behind the same routes and status codes as SGLang's ``http_server.py``; the model runner below them
(the NCCL receive and the load) is a recorder. Our client (:class:`paravt.engines.sglang.SGLangEngine`)
is driven exactly as :class:`paravt.engines.weight_push.BroadcastPush` drives it.

A server's first push also runs SGLang's own ``WeightChecker`` (``/weights_checker``): every tensor
reset to noise and checksummed before the buckets, checksummed again after them; the tests below load
it and the scheduler's ``check_weights`` from the wheel's source.
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


def _module_function(name: str, namespace: dict, rel: str = UPDATER):
    import ast
    import textwrap

    from tests.conformance.server_source import package_dir

    path = package_dir("sglang") / rel
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


async def _serve(mgr, io, log, extra=None):
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
    for path, handler in (extra or {}).items():
        app.router.add_post(path, handler)
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


# --------------------------------------------------------------------------------------------
# Every tensor accounted for: the first push of a server runs SGLang's own WeightChecker
# (reset_tensors, checksum) around the buckets. The checker, the scheduler's check_weights and the
# model runner's delegation are the wheel's code; the "load" below writes each received tensor into
# a torch module by name and skips names the module lacks, as SGLang's load_weights does.
# --------------------------------------------------------------------------------------------

CHECKER = "srt/utils/weight_checker.py"


def _wheel_module(rel: str, namespace: dict) -> dict:
    """A module of the wheel executed from its source, its ``sglang`` imports replaced by ``namespace``
    (they pull CUDA-only packages; what they provide here is named below)."""
    import ast

    from tests.conformance.server_source import package_dir

    path = package_dir("sglang") / rel
    tree = ast.parse(path.read_text())
    tree.body = [n for n in tree.body if not (isinstance(n, ast.ImportFrom) and (n.module or "").startswith("sglang"))]
    import sys
    import types

    mod = types.ModuleType(f"_conformance_{path.stem}")  # pydantic resolves annotations in a real module
    sys.modules[mod.__name__] = mod
    mod.__dict__.update(namespace)
    exec(compile(tree, str(path), "exec"), mod.__dict__)  # noqa: S102 - the pinned release's own code
    return mod.__dict__


def _weight_checker(model):
    flatten = _module_function("flatten_nested_list", {}, "srt/utils/common.py")
    tensor_hash = _module_function("tensor_hash", {
        "torch": torch, "hashlib": __import__("hashlib"), "flatten_nested_list": flatten, "gpu_tensor_hash": None},
        "srt/managers/mm_utils.py")
    quant = {n: type(n, (), {}) for n in ("Fp8LinearMethod", "Fp8MoEMethod", "ModelOptFp4LinearMethod",
                                          "ModelOptNvFp4FusedMoEMethod")}  # no module here is quantized
    comparator = _wheel_module("srt/utils/weight_checker_comparator.py", {
        **quant, "unshuffle_fp8_weight": None, "block_quant_dequant": None, "inverse_transform_scale_ue8m0": None})
    placement = SimpleNamespace(tp_rank=0, tp_size=1, dp_rank=0, attn_dp_size=1, pp_rank=0, pp_size=1)
    checker = _wheel_module(CHECKER, {
        "tensor_hash": tensor_hash, "alloc_mmap": None, "get_parallel": lambda: placement,
        "current_platform": SimpleNamespace(synchronize=lambda: None),  # the GPU stream sync
        **{k: comparator[k] for k in ("CHUNK_NUMEL", "ComparableWeight", "RawComparable", "compare_weights",
                                      "select_comparable_weight")}})
    return checker, checker["WeightChecker"](get_model=lambda: model)


SHAPES = {m.name: tuple(m.shape) for bucket in PLAN for m in bucket}


class _Served(torch.nn.Module):
    """The served model: parameters by name (zeros) plus a rotary buffer the checker skips."""

    def __init__(self, names):
        super().__init__()
        for n in names:
            mod, attr = n.split(".")
            setattr(self, mod, torch.nn.Module())
            getattr(self, mod).register_parameter(attr, torch.nn.Parameter(  # an inference model: no grad
                torch.zeros(SHAPES.get(n, (4,)), dtype=torch.bfloat16), requires_grad=False))
        self.rotary = torch.nn.Module()
        self.rotary.register_buffer("inv_freq", torch.arange(4.0), persistent=False)


class _LoadingRunner(_Runner):
    """Receives a bucket (what the trainer sent: 0.5 everywhere) and loads it by name."""

    def __init__(self, log, model):
        super().__init__(log)
        self.model = model

    def receive_weights_from_distributed(self, names, dtypes, shapes, group_name, load_format):
        super().receive_weights_from_distributed(names, dtypes, shapes, group_name, load_format)
        return [(n, torch.full(tuple(s), 0.5, dtype=torch.bfloat16)) for n, s in zip(names, shapes)]

    def load_weights_from_distributed(self, weights):
        params = dict(self.model.named_parameters())
        for n, t in weights:
            if n in params:  # SGLang's load_weights skips names the model does not have
                params[n].data.copy_(t)
        return True, "ok"


class _Transport:
    """BroadcastPush's calls on the server (the bytes travel over NCCL/gloo, not drawn here)."""

    async def push(self, clients, urls, buckets, version):  # noqa: ARG002
        await _push(clients[0], version)


def _run_checked(model, pushes):
    """Push each version through ``EngineHandle.push_weights`` with verify_first_push as the RL trainer
    sets it; returns the server's log and the errors."""
    from typing import List, Optional

    from aiohttp import web

    from paravt.core.weight_sync import WeightBuckets
    from paravt.engines.factory import EngineHandle
    from paravt.engines.weight_update import WeightUpdate

    async def main():
        log: list = []
        mgr, io = _manager(log)
        runner = mgr.tp_worker.model_runner
        runner.weight_updater = _LoadingRunner(log, model)
        checker_ns, runner._weight_checker = _weight_checker(model)
        delegate = load_method("sglang", "srt/model_executor/model_runner.py", "ModelRunner", "check_weights",
                               {"Optional": Optional, "List": List})
        runner.check_weights = lambda **kw: delegate(runner, **kw)
        structs = load_structs("sglang", "srt/managers/io_struct.py", [
            "ParallelismInfo", "ChecksumInfo", "CheckWeightsReqInput", "CheckWeightsReqOutput"])
        merge = _module_function("_merge_checksum_payloads", {
            "Dict": dict, "List": list, "Tuple": tuple, "overall_checksum": checker_ns["overall_checksum"]})
        check = load_method("sglang", UPDATER, CLS, "check_weights", {
            **structs, "_merge_checksum_payloads": merge, "torch": torch, "msgspec": msgspec,
            "traceback": __import__("traceback"), "logger": SimpleNamespace(warning=lambda *a, **k: None)})

        async def weights_checker(request):  # http_server.check_weights + the tokenizer manager's body
            body = await request.json()
            out = check(mgr, msgspec.convert(body, structs["CheckWeightsReqInput"]))
            log.append(("weights_checker", body["action"]))
            resp = {"success": out.success, "message": out.message}
            if out.payload is not None:
                resp["ranks"] = [msgspec.to_builtins(p) for p in out.payload]
            return web.json_response(resp, status=200 if out.success else 400)

        srv, url = await _serve(mgr, io, log, {"/weights_checker": weights_checker})
        handle = EngineHandle("sglang", None, url, broadcaster=_Transport(), verify_first_push=True,
                              weight_update=WeightUpdate.broadcast("gloo"))
        errors = []
        try:
            for v in pushes:  # push_weights runs its own event loop: a thread, as the trainer calls it
                try:
                    await asyncio.to_thread(handle.push_weights, WeightBuckets(PLAN, gather=None), v)
                except EngineError as exc:
                    errors.append(str(exc))
        finally:
            await srv.cleanup()
        return log, errors
    return asyncio.run(main())


def test_a_first_push_that_writes_every_tensor_passes_the_check_and_resumes():
    model = _Served(["a.weight", "b.weight", "c.weight"])
    log, errors = _run_checked(model, [1, 2])
    assert not errors, errors
    checks = [x for x in log if isinstance(x, tuple) and x[0] == "weights_checker"]
    assert [c[1] for c in checks] == ["reset_tensors", "checksum", "checksum"]  # the first push only
    assert log.count("continue_generation") == 2
    assert all(float(p.float().min()) == 0.5 == float(p.float().max()) for p in model.parameters())
    assert torch.equal(model.rotary.inv_freq, torch.arange(4.0))  # the checker skips rotary buffers


@pytest.mark.parametrize("served, missing", [
    (["a.weight", "b.weight", "c.weight", "d.weight"], "d.weight"),  # the trainer lacks one tensor
    (["a.weight", "b.weight", "c2.weight"], "c2.weight"),  # one name the server's loader does not know
])
def test_a_first_push_that_leaves_a_tensor_unwritten_fails_naming_it_and_stays_paused(served, missing):
    log, errors = _run_checked(_Served(served), [1])
    assert len(errors) == 1 and missing in errors[0] and "unwritten" in errors[0], errors
    assert "continue_generation" not in log  # the noise in the unwritten tensor is never served
    assert "end_weight_update" in log  # the session is closed all the same
