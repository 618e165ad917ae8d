"""``rollout.layout``: the syntax and its rules (one line each), every node's share of it, the behaviour
without a layout, and the discovery of every node's servers by trainer rank 0 through the run folder."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from paravt.core.config import load_config
from paravt.engines.base import EngineError
from paravt.rl.config import RLConfig
from paravt.rl.launch import trainer_gpus, world_size
from paravt.rl.layout import check_layout, discover, discovered_servers, plan, publish

EIGHT_B = "configs/rl/paragrpo_8b.yaml"


def _cfg(recipe: str = EIGHT_B, *overrides: str) -> RLConfig:
    return load_config(RLConfig, recipe, list(overrides))


def _env(n: int, nnodes: int = 2, **kw: str) -> dict[str, str]:
    return {"NNODES": str(nnodes), "NODE_RANK": str(n), **kw}


def test_the_two_node_recipe_gives_node_1_to_rollout_and_passes_the_preflight():
    cfg = _cfg("configs/rl/paragrpo_8b_2node.yaml")
    a, b = plan(cfg, 8, _env(0)), plan(cfg, 8, _env(1))
    assert (a.train_gpus, a.nproc, a.servers) == ([str(i) for i in range(7)], 7, [[7]])
    assert (b.train_gpus, b.nproc, b.servers) == ([], 0, [[i] for i in range(8)])  # a node that only serves
    assert a.world == b.world == 7 and a.train_nodes == b.train_nodes == 1 and a.expect == {0: 1, 1: 8}
    cfg.check_world_size(a.world)  # the paper's 7 prompts over its 7 trainer ranks
    assert b.shell().split() == ["-", "0", "7", "1", "8", "layout", "0:1,1:8", "1500", "-", "1"]  # no empty field


def test_without_a_layout_on_several_nodes_node_0s_launcher_starts_the_servers():
    """torch's c10d rendezvous orders nodes by address: rank 0 may be on any node, so it finds node 0's
    servers through the run folder instead of launching them where it happens to run."""
    cfg = _cfg(EIGHT_B)  # rollout.server.gpus=[7], one SGLang server
    a, b = plan(cfg, 8, _env(0)), plan(cfg, 8, _env(1))
    assert (a.train_gpus, a.servers, a.expect, a.rollout_gpus) == ([str(i) for i in range(7)], [[7]], {0: 1}, [])
    assert (b.train_gpus, b.servers, b.expect, b.world, b.train_nodes) == ([str(i) for i in range(8)], [], {0: 1}, 15, 2)
    assert a.shell().split()[5] == "layout"
    two = _cfg(EIGHT_B, "rollout.engine=vllm", "rollout.vllm.gpus=[4,5,6,7]", "rollout.vllm.tp_size=2", "rollout.replicas=2")
    assert plan(two, 8, _env(0)).servers == [[4, 5], [6, 7]]
    one = plan(cfg, 8, {})  # one node: trainer rank 0 launches them itself, as before
    assert (one.servers, one.expect, one.rollout_gpus) == ([], None, [7])
    urls = plan(_cfg(EIGHT_B, "rollout.replicas=0", "rollout.urls=[http://h:1]"), 8, _env(0))
    assert (urls.servers, urls.expect) == ([], None)  # servers by URL only: nothing to place


def test_parts_take_a_nodes_gpus_in_their_order_and_map_through_the_jobs_devices():
    cfg = _cfg(EIGHT_B, "rollout.layout=rollout:2x2+train:4,train:8")
    a = plan(cfg, 8, _env(0, PARAVT_VISIBLE_DEVICES="8,9,10,11,12,13,14,15"))
    assert a.servers == [[0, 1], [2, 3]] and a.train_gpus == ["12", "13", "14", "15"]  # servers: logical ids
    b = plan(cfg, 8, _env(1))
    assert (b.train_gpus, b.nproc, b.servers, b.world, b.train_nodes) == ([str(i) for i in range(8)], 8, [], 12, 2)
    assert b.expect == {0: 2}  # the all-trainer node publishes nothing


def test_a_repeated_entry_and_cpu_counts():
    assert [str(n) for n in check_layout("train:7+rollout:1,train:8*2,rollout:4x2")] == [
        "train:7+rollout:1", "train:8", "train:8", "rollout:4x2"]
    cfg = _cfg("configs/rl/tiny.yaml", "rollout.engine=hf_server", "rollout.layout=train:2+rollout:1,rollout:2")
    a, b = plan(cfg, 0, _env(0)), plan(cfg, 0, _env(1))  # CPU: counts of processes, no GPU ids
    assert (a.train_gpus, a.nproc, a.servers, b.nproc, b.servers, a.world) == ([], 2, [[]], 0, [[], []], 2)


@pytest.mark.parametrize("text, nnodes, ngpu, fragment", [
    ("train:7+rollout:2", 1, 8, "node 0 'train:7+rollout:2' takes 9 GPUs, a node has 8"),
    ("train:8,rollout:8", 3, 8, "2 node entries for NNODES=3"),
    ("rollout:1,train:7", 2, 8, "node 0 runs no trainer rank"),
    ("train:7+serve:1", 1, 8, "'serve:1' in the entry 'train:7+serve:1' is not train:N, rollout:S or rollout:SxT"),
    ("train:8,,rollout:8", 3, 8, "an empty node entry"),
    ("train:4+train:4", 1, 8, "names train twice"),
    ("train:8,rollout:0", 2, 8, "'rollout:0': counts must be >= 1"),
    ("train:8*0", 1, 8, "ENTRY*K with K >= 1"),
    ("train:1,rollout:1x2", 2, 0, "tensor parallel (rollout:SxT, T > 1) needs GPUs"),
])
def test_a_bad_layout_is_one_line_naming_the_rule(text, nnodes, ngpu, fragment):
    with pytest.raises(ValueError) as e:
        check_layout(text, engine="sglang", nnodes=nnodes, ngpu=ngpu)
    msg = str(e.value)
    assert msg.startswith(f"rollout.layout={text!r}: ") and fragment in msg and "\n" not in msg, msg


def test_the_config_checks_the_engine_and_the_launcher_the_nodes():
    with pytest.raises(ValueError, match="rollout parts start servers of rollout.engine.*not 'hf'"):
        _cfg("configs/rl/tiny.yaml", "rollout.layout=train:1+rollout:1")
    with pytest.raises(ValueError, match="no node has a rollout part and rollout.urls is empty"):
        _cfg(EIGHT_B, "rollout.layout=train:8,train:8")
    assert _cfg("configs/rl/tiny.yaml", "rollout.layout=train:1,train:2").rollout.layout  # in-process engine
    with pytest.raises(ValueError, match="NPROC=7, but rollout.layout=.* runs 0 trainer rank"):
        plan(_cfg("configs/rl/paragrpo_8b_2node.yaml"), 8, _env(1, NPROC="7"))
    with pytest.raises(ValueError, match="SERVERS_TIMEOUT=soon must be a number of seconds > 0"):
        plan(_cfg("configs/rl/paragrpo_8b_2node.yaml"), 8, _env(0, SERVERS_TIMEOUT="soon"))


def test_what_needs_cuda_follows_the_layout():
    assert _cfg(EIGHT_B, "rollout.layout=train:8,rollout:8").needs_cuda() == "rollout.engine=sglang runs on GPUs only"
    # servers by URL only: nothing launched here needs a GPU for serving
    assert _cfg("configs/rl/tiny.yaml", "rollout.engine=sglang", "rollout.urls=[http://h:1]",
                "rollout.layout=train:1,train:1").needs_cuda() is None
    # vLLM: the layout gives the servers their GPUs (none on CPU: the CPU build), rollout.vllm.gpus is not read
    assert _cfg("configs/rl/tiny.yaml", "rollout.engine=vllm", "rollout.layout=train:1+rollout:1").needs_cuda() is None


def test_without_a_layout_the_split_is_as_before():
    cfg = _cfg(EIGHT_B)
    for n, nnodes in ((0, 1), (0, 2), (1, 2)):
        p = plan(cfg, 8, _env(n, nnodes))
        assert p.train_gpus == trainer_gpus(8, [7], [], n) and p.world == world_size(8, [7], nnodes, None)
        assert p.train_nodes == nnodes
    assert plan(_cfg("configs/rl/tiny.yaml"), 0, {"NPROC": "2"}).shell().split()[:6] == ["-", "2", "2", "1", "0", "rank0"]
    # every GPU of node 0 set aside for the servers rank 0 launches: one line, not an empty field to shift
    with pytest.raises(ValueError, match=r"takes all 8 GPUs of node 0.*or set rollout.layout"):
        plan(_cfg(EIGHT_B, "rollout.server.gpus=[0,1,2,3,4,5,6,7]"), 8, {})


# ---------------------------------------------------------------------------------------- discovery
class _Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture
def live_url():
    srv = HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


def test_rank_0_waits_for_every_node_and_takes_their_urls_in_node_order(tmp_path, live_url):
    other = live_url.replace("127.0.0.1", "localhost")

    def late():
        time.sleep(1.0)
        publish(tmp_path / "node1.json", {"node": 1, "host": "b", "urls": [other, live_url]})

    publish(tmp_path / "node0.json", {"node": 0, "host": "a", "urls": [live_url]})
    threading.Thread(target=late, daemon=True).start()
    t0 = time.monotonic()
    assert discover(tmp_path, {1: 2, 0: 1}, 20, poll_s=0.1) == [live_url, other, live_url]
    assert 0.9 < time.monotonic() - t0 < 10


def test_with_no_server_answering_the_run_ends_with_one_line_naming_every_node(tmp_path):
    publish(tmp_path / "node2.json", {"node": 2, "host": "c", "urls": ["http://127.0.0.1:9"]})
    t0 = time.monotonic()
    with pytest.raises(EngineError) as e:
        discover(tmp_path, {1: 1, 2: 1}, 1.0, poll_s=0.1)
    msg = str(e.value)
    assert time.monotonic() - t0 < 10 and "\n" not in msg
    assert f"no rollout server answers (node 1 (no {tmp_path / 'node1.json'} of this run); node 2 (c: its servers" in msg
    assert "(SERVERS_TIMEOUT=1)" in msg, msg


def test_rank_0_starts_with_the_live_servers_after_the_grace_naming_the_missing(tmp_path, live_url, caplog):
    publish(tmp_path / "node0.json", {"node": 0, "host": "a", "urls": [live_url]})
    publish(tmp_path / "node2.json", {"node": 2, "host": "c", "urls": ["http://127.0.0.1:9"]})
    t0 = time.monotonic()
    with caplog.at_level("WARNING", logger="paravt.rl.layout"):
        assert discover(tmp_path, {0: 1, 1: 1, 2: 1}, 600, poll_s=0.1, grace_s=1.0) == [live_url]
    assert time.monotonic() - t0 < 10  # the grace, not SERVERS_TIMEOUT
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("rollout.layout: starting with 1 live rollout server(s) after ") and "SERVERS_GRACE=1" in line
    assert f"node 1 (no {tmp_path / 'node1.json'} of this run)" in line and "node 2 (c: its servers" in line, line


def test_a_server_its_node_lists_as_dead_is_not_waited_for(tmp_path, live_url, caplog):
    """A node republishes its record without a server that died (a torchrun restart's discovery too)."""
    publish(tmp_path / "node0.json", {"node": 0, "host": "a", "urls": [live_url]})
    publish(tmp_path / "node1.json", {"node": 1, "host": "b", "urls": [live_url], "dead": ["http://b:2"],
                                      "errors": ["exited (code 137)"]})
    t0 = time.monotonic()
    with caplog.at_level("WARNING", logger="paravt.rl.layout"):
        assert discover(tmp_path, {0: 1, 1: 2}, 600, poll_s=0.1) == [live_url, live_url]
    assert time.monotonic() - t0 < 5
    [line] = [r.getMessage() for r in caplog.records]
    assert line == "rollout.layout: starting with 2 live rollout server(s); missing: node 1 (b): http://b:2 exited (code 137)"


def test_a_node_whose_servers_failed_is_not_waited_for(tmp_path, live_url, caplog):
    publish(tmp_path / "node1.json", {"node": 1, "host": "b", "error": "server 2 of 8: EngineError: exited (code 1)"})
    t0 = time.monotonic()
    with pytest.raises(EngineError, match=r"no rollout server answers \(node 1 \(b\): its rollout servers did not start: "
                                          r"server 2 of 8: "):
        discover(tmp_path, {1: 8}, 60)
    assert time.monotonic() - t0 < 5
    publish(tmp_path / "node0.json", {"node": 0, "host": "a", "urls": [live_url]})
    with caplog.at_level("WARNING", logger="paravt.rl.layout"):
        assert discover(tmp_path, {0: 1, 1: 8}, 60) == [live_url]
    assert "missing: node 1 (b): its rollout servers did not start" in caplog.records[0].getMessage()
    publish(tmp_path / "node1.json", {"node": 1, "host": "b", "urls": ["http://x:1"]})
    with pytest.raises(EngineError, match="published 1 server.*the layout gives it 8: start every node with the same"):
        discover(tmp_path, {1: 8}, 60)


def test_an_earlier_runs_record_is_waited_on_not_read(tmp_path):
    """A rerun into the same output_dir: the serving node's failed record of the last run is still there until
    its launcher starts again; rank 0 waits for this run's record instead of ending on the old error."""
    publish(tmp_path / "node1.json", {"node": 1, "host": "b", "error": "an earlier run's failure"})
    with pytest.raises(EngineError, match=r"no rollout server answers \(node 1 \(no .*node1.json of this run\)"):
        discover(tmp_path, {1: 1}, 0.5, poll_s=0.1, since=time.time() + 1)
    with pytest.raises(EngineError, match="an earlier run's failure"):  # without a start time it is this run's
        discover(tmp_path, {1: 1}, 0.5, poll_s=0.1)


def test_discovery_is_off_without_a_layout_and_empty_when_no_node_serves(tmp_path, monkeypatch):
    monkeypatch.delenv("PARAVT_SERVERS_DIR", raising=False)
    assert discovered_servers() is None  # the engine launches its own servers, as configured
    monkeypatch.setenv("PARAVT_SERVERS_DIR", str(tmp_path))
    monkeypatch.setenv("PARAVT_SERVERS_NODES", "")
    assert discovered_servers() == []  # servers by rollout.urls only; none launched by rank 0 either
    monkeypatch.setenv("PARAVT_SERVERS_NODES", "1:1")
    monkeypatch.setenv("PARAVT_SERVERS_TIMEOUT", "0.5")
    with pytest.raises(EngineError, match="node 1"):
        discovered_servers()


@pytest.mark.parametrize("nnodes", [2, None])  # the launcher's check (NNODES) and the config's (no NNODES)
def test_a_huge_repeat_count_is_refused_at_once_naming_its_entry(nnodes):
    t0 = time.monotonic()
    with pytest.raises(ValueError) as e:
        check_layout("train:1,rollout:1*1000000000", engine="sglang", nnodes=nnodes, ngpu=8)
    msg = str(e.value)
    assert time.monotonic() - t0 < 1.0 and "\n" not in msg
    assert msg.startswith("rollout.layout='train:1,rollout:1*1000000000': 'rollout:1*1000000000' brings the node "
                          "entries to 1000000001, more than "), msg
    assert ("NNODES=2" if nnodes else "MAX_NODES=") in msg
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"'rollout:1\*1000000000' brings"):
        _cfg(EIGHT_B, "rollout.layout=train:1,rollout:1*1000000000")  # the config check expands nothing either
    with pytest.raises(ValueError, match=r"'rollout:1\*1000' brings the node entries to 1001, more than NNODES=2"):
        plan(_cfg(EIGHT_B, "rollout.layout=train:1,rollout:1*1000"), 8, _env(0))
    assert time.monotonic() - t0 < 5.0


def test_each_node_checks_its_own_entry_against_its_own_gpus():
    """Nodes of different sizes: an 8-GPU trainer node and a 4-GPU rollout node. Each launcher knows only its
    own GPUs, so it checks its own entry; the other node's entry is checked on that node."""
    cfg = _cfg(EIGHT_B, "rollout.layout=train:8,rollout:4")
    a, b = plan(cfg, 8, _env(0)), plan(cfg, 4, _env(1))
    assert (a.nproc, a.servers, b.nproc, b.servers) == (8, [], 0, [[0], [1], [2], [3]])
    with pytest.raises(ValueError, match=r"node 0 'train:8' takes 8 GPUs, node 0 has 4$"):
        plan(cfg, 4, _env(0))  # the trainer node given the small node's GPUs
    with pytest.raises(ValueError, match=r"node 1 'rollout:4' takes 4 GPUs, node 1 has 2$"):
        plan(cfg, 2, _env(1))
