"""Engines as registered backends: an engine defined in a test directory runs an episode and takes a
weight push through the same calls as the built-in ones; every choice is checked with one line."""

from __future__ import annotations

import asyncio

import pytest

from paravt.agent.episode import EpisodeConfig, EpisodeSample, run_episode
from paravt.core.weight_sync import WeightBuckets
from paravt.data.schema import load_rl_rows
from paravt.engines.base import EngineError
from paravt.engines.factory import EngineHandle, build_engine
from paravt.engines import registry
from paravt.engines.registry import BUILTIN, EngineBackend, backend_names, get_backend, register_backend
from paravt.engines.weight_update import WeightUpdate
from tests.engines import stub_engine

STUB = "tests.engines.stub_engine:BACKEND"


@pytest.fixture(autouse=True)
def clean_registry():
    """Each test starts from the built-in backends only (what a test registers does not leak)."""
    saved = dict(registry._REGISTERED)
    registry._REGISTERED.clear()
    yield
    registry._REGISTERED.clear()
    registry._REGISTERED.update(saved)


def test_a_registered_engine_runs_an_episode_and_takes_weights(tiny, tiny_dir, world, tmp_path):
    _, proc = tiny
    register_backend(stub_engine.BACKEND)
    assert "stub" in backend_names() and "stub" in backend_names(rollout_only=True)
    handle = build_engine("stub", str(tiny_dir), proc, weight_version=4)
    rows, _ = load_rl_rows([world / "local" / "paravt_rl_synth.parquet"])
    traj = asyncio.run(run_episode(EpisodeSample.from_row(rows[0]), handle.engine.for_episode("k"), proc,
                                   EpisodeConfig(max_new_tokens=256), k=4, seed=1))
    assert traj.end_reason == "answer" and len(traj.turns) == 2
    assert [c["sub"] for c in handle.engine.calls].count(True) == 2  # both crop calls ran a sub-agent
    assert [t.weight_version for t in traj.turns] == [4, 4]  # the version the engine says produced each turn

    stub_engine.PUSHES.clear()
    handle.push_weights(str(tmp_path / "v5"), 5)  # the backend's only transport: disk, through its control client
    assert stub_engine.PUSHES == [("stub://0", str(tmp_path / "v5"), 5)] and handle.engine.weight_version == 5
    with pytest.raises(TypeError, match="^a disk weight update carries a checkpoint directory, got WeightBuckets$"):
        handle.push_weights(WeightBuckets([], gather=None), 6)
    with pytest.raises(ValueError, match="^engine 'stub' takes weights by disk, not by broadcast$"):
        build_engine("stub", str(tiny_dir), proc, weight_update=WeightUpdate.broadcast("gloo"))


def test_an_engine_is_named_by_where_its_backend_is(tiny, tiny_dir, tmp_path):
    _, proc = tiny
    assert "stub" not in backend_names()  # never registered in code: the recipe's name is all there is
    handle = build_engine(STUB, str(tiny_dir), proc)
    assert handle.kind == STUB and handle.weight_update == WeightUpdate.from_disk()
    assert get_backend(STUB) is stub_engine.BACKEND is get_backend("stub")  # then known by its name too
    stub_engine.PUSHES.clear()
    handle.push_weights(str(tmp_path / "v1"), 1)
    assert stub_engine.PUSHES == [("stub://0", str(tmp_path / "v1"), 1)]
    with pytest.raises(ValueError, match=r"^engine 'tests.engines.stub_engine:NOPE': cannot load"):
        get_backend("tests.engines.stub_engine:NOPE")
    with pytest.raises(ValueError, match=r"is a function, not an EngineBackend$"):
        get_backend("tests.engines.stub_engine:build")


def test_the_rl_recipe_takes_a_registered_engine_and_refuses_unknown_ones(tiny_dir):
    from paravt.rl.config import RolloutConfig

    assert RolloutConfig(engine=STUB).backend() is stub_engine.BACKEND
    with pytest.raises(ValueError) as e:
        RolloutConfig(engine="tgi")
    assert str(e.value).startswith("rollout.engine must be one of hf | hf_server | sglang | vllm")
    assert str(e.value).endswith(", got 'tgi'")
    with pytest.raises(ValueError, match="^rollout.engine=tests.engines.stub_engine:CHAT does not serve rollouts"):
        RolloutConfig(engine="tests.engines.stub_engine:CHAT")
    with pytest.raises(ValueError, match=r"^rollout.weight_sync=broadcast: rollout.engine=hf_server takes weights by "
                                         r"disk \(use auto or one of those\)$"):
        RolloutConfig(engine="hf_server", weight_sync="broadcast")
    with pytest.raises(ValueError, match=r"^rollout.weight_sync=broadcast: rollout.engine=hf takes weights by state_dict"):
        RolloutConfig(engine="hf", weight_sync="broadcast")
    assert RolloutConfig(engine="hf", weight_sync="disk").weight_sync == "disk"  # in memory all the same
    with pytest.raises(ValueError, match=r"^rollout.engine: engine 'tests.engines.stub_engine:NOPE': cannot load"):
        RolloutConfig(engine="tests.engines.stub_engine:NOPE")
    with pytest.raises(ValueError, match="^rollout.sync_backend must be one of auto | nccl | gloo, got 'mpi'$"):
        RolloutConfig(sync_backend="mpi")


def test_every_builtin_backend_loads_and_declares_what_it_takes():
    for name in BUILTIN:
        b = get_backend(name)
        assert b.name == name and (b.control is not None) == (name not in ("hf", "openai"))
    assert get_backend("hf").transports == ("state_dict",) and get_backend("openai").transports == ()
    assert get_backend("vllm").routed and get_backend("vllm").confirms_version and get_backend("sglang").routed
    assert not get_backend("hf_server").routed and not get_backend("remote").routed
    with pytest.raises(ValueError, match="transports must be some of state_dict | disk | broadcast"):
        EngineBackend("bad", lambda spec: None, transports=("nccl",))
    with pytest.raises(EngineError, match="^engine 'openai' takes no weights$"):
        EngineHandle("openai", None, "http://x").push_weights({}, 1)


def test_the_run_derives_one_weight_update_from_the_recipe():
    from paravt.core.config import load_config
    from paravt.rl.config import RLConfig
    from paravt.rl.engine_sync import run_weight_update

    def update(*over, cuda=False):
        cfg = load_config(RLConfig, None, ["model_path=m", "train_data=[x.parquet]", *over])
        return run_weight_update(cfg, cuda)

    assert update() == WeightUpdate.in_memory()
    assert update("rollout.engine=hf_server") == WeightUpdate.from_disk()
    b = update("rollout.engine=vllm", "rollout.bucket_mb=8", cuda=True)
    assert (b.transport, b.bucket_bytes, b.backend) == ("broadcast", 8 << 20, "nccl")  # the recipe's vllm.gpus=[7]
    assert update("rollout.engine=vllm", "rollout.vllm.gpus=[]", cuda=True).backend == "gloo"  # the CPU build
    assert update("rollout.engine=sglang", "rollout.weight_sync=disk").transport == "disk"
