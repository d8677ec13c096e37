"""What the vllm_server role runs, rendered from real plans and checked exactly:
the Ray backend's command line and environment cannot run on our CPU machines
(vLLM refuses Ray on the CPU platform), so this is where it is pinned down."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import FIXTURES
from vllm_fleet.deploy.serve import (
    compare,
    compare_blocks,
    core_blocks,
    cpu_binding,
    kv_report,
    launches,
    predicted_blocks,
    reported_blocks,
    verify_rows,
    verify_table,
    verify_target,
)
from vllm_fleet.errors import PlanError
from vllm_fleet.model.spec import load_model
from vllm_fleet.planning.cluster import cluster_from_data, load_cluster
from vllm_fleet.planning.strategy import Wishes, choose_executor, plan_cluster


def _plan(model: str, cluster: str, **wishes: Any) -> dict[str, Any]:
    return plan_cluster(load_model(model), load_cluster(FIXTURES / cluster), Wishes(**wishes))


def _cluster_2x8(address: bool = True) -> list[Any]:
    nodes = []
    for i in (1, 2):
        node: dict[str, Any] = {"name": f"node{i}", "gpu": "A800", "gpu_count": 8, "nvlink": True}
        if address:
            node.update({"address": f"10.0.0.{i}", "interface": "eth1"})
        nodes.append(node)
    return cluster_from_data({"nodes": nodes})


def test_ray_backend_head_command_line_and_environment_exactly() -> None:
    plan = plan_cluster(
        load_model("meta-llama/Llama-3.1-405B"), _cluster_2x8(), Wishes(max_model_len=32768, multinode_backend="ray")
    )
    (inst,) = plan["instances"]
    assert (inst["executor"], inst["executor_reason"]) == (
        "ray",
        "vllm_fleet_multinode_backend: ray (vLLM places its ranks on the Ray cluster)",
    )
    opts = {"ray_port": "6379", "model": "/srv/models/Llama-3.1-405B"}
    (head,) = launches(plan["instances"], "node1", opts)
    assert launches(plan["instances"], "node2", opts) == []  # a Ray worker: the head places ranks there
    assert head["argv"] == [
        "vllm", "serve", "/srv/models/Llama-3.1-405B",
        "--host", "10.0.0.1", "--port", "8000",
        "--served-model-name", "Llama-3.1-405B",
        "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2",
        "--max-model-len", "32768", "--max-num-seqs", inst["vllm_args"][inst["vllm_args"].index("--max-num-seqs") + 1],
        "--gpu-memory-utilization", "0.92",  # vLLM 0.32's own default (0.9 before 0.20)
        "--distributed-executor-backend", "ray",
    ]  # fmt: skip
    assert head["env"] == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "GLOO_SOCKET_IFNAME": "eth1",
        "NCCL_SOCKET_IFNAME": "eth1",
        "RAY_ADDRESS": "10.0.0.1:6379",
        "VLLM_HOST_IP": "10.0.0.1",
    }
    assert (head["name"], head["role"], head["serves"], head["port"]) == ("vllm-Llama-3.1-405B-0", "head", True, 8000)
    assert head["predicted_kv_tokens"] == inst["memory"]["kv_cache_tokens"]


def test_ray_backend_exports_a_computed_layer_partition() -> None:
    plan = _plan("deepseek-ai/DeepSeek-R1", "a800_l20.yml", max_model_len=32768, multinode_backend="ray")
    (inst,) = plan["instances"]
    (head,) = launches(plan["instances"], inst["head_node"])
    assert head["env"]["VLLM_PP_LAYER_PARTITION"] == ",".join(map(str, inst["layer_partition"]))
    assert head["argv"][-2:] == ["--distributed-executor-backend", "ray"]


def test_native_backend_runs_every_node_with_its_rank() -> None:
    plan = plan_cluster(load_model("meta-llama/Llama-3.1-405B"), _cluster_2x8(), Wishes(max_model_len=32768))
    assert plan["instances"][0]["executor"] == "native"  # auto, no Ray in the serving environment
    assert "--distributed-executor-backend" not in plan["instances"][0]["vllm_args"]
    opts = {"master_port": "29600"}
    (head,) = launches(plan["instances"], "node1", opts)
    (other,) = launches(plan["instances"], "node2", opts)
    tail = ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29600"]
    assert head["argv"][-8:] == tail and "--distributed-executor-backend" not in head["argv"]
    assert other["argv"][-9:] == [*tail[:3], "1", *tail[4:], "--headless"]
    assert (other["serves"], other["role"], other["node_rank"]) == (False, "headless", 1)
    assert other["env"]["VLLM_HOST_IP"] == "10.0.0.2"


@pytest.mark.parametrize(
    ("backend", "ray_available", "counts", "executor", "why"),
    [
        ("auto", False, {"a": 8, "b": 8}, "native", "no Ray in the serving environment"),
        ("auto", True, {"a": 8, "b": 8}, "ray", "has Ray"),
        ("auto", False, {"a": 8, "b": 4}, "ray", "needs the same GPU count on every node"),
        ("ray", False, {"a": 8, "b": 8}, "ray", "vllm_fleet_multinode_backend: ray"),
        ("native", True, {"a": 8, "b": 8}, "native", "vllm_fleet_multinode_backend: native"),
        ("auto", True, {"a": 8}, "mp", "one node"),
    ],
)
def test_the_plan_chooses_the_executor_and_says_why(
    backend: str, ray_available: bool, counts: dict[str, int], executor: str, why: str
) -> None:
    got, reason = choose_executor("x-0", counts, 1, Wishes(multinode_backend=backend, ray_available=ray_available))
    assert got == executor and why in reason


def test_native_backend_refuses_nodes_of_different_sizes() -> None:
    with pytest.raises(PlanError, match="native needs the same GPU count on every node of x-0"):
        choose_executor("x-0", {"a": 8, "b": 4}, 1, Wishes(multinode_backend="native"))
    with pytest.raises(PlanError, match="vllm_fleet_multinode_backend: must be one of"):
        choose_executor("x-0", {"a": 8, "b": 8}, 1, Wishes(multinode_backend="mpi"))


def test_auto_backend_takes_ray_where_the_image_has_it() -> None:
    plan = plan_cluster(
        load_model("meta-llama/Llama-3.1-405B"), _cluster_2x8(), Wishes(max_model_len=32768, ray_available=True)
    )
    (inst,) = plan["instances"]
    assert inst["executor"] == "ray" and "has Ray" in inst["executor_reason"]
    assert inst["vllm_args"][-2:] == ["--distributed-executor-backend", "ray"]


def test_dp_ep_across_nodes_head_and_headless() -> None:
    plan = _plan("Qwen/Qwen3-235B-A22B", "2x8xa800.yml", max_model_len=8192, strategies=("dp_ep",))
    (inst,) = plan["instances"]
    nodes = inst["nodes"]
    (head,) = launches(plan["instances"], nodes[0])
    (other,) = launches(plan["instances"], nodes[1])
    address = inst["endpoint"].rsplit(":", 1)[0]
    for launch in (head, other):
        argv = launch["argv"]
        assert argv[argv.index("--data-parallel-size") + 1] == "16"
        assert (
            argv.count("--data-parallel-size-local") == 1 and argv[argv.index("--data-parallel-size-local") + 1] == "8"
        )
        assert argv[argv.index("--data-parallel-address") + 1] == address
        assert "--enable-expert-parallel" in argv and "--distributed-executor-backend" not in argv
    assert "--headless" not in head["argv"] and head["serves"]
    assert other["argv"][-3:] == ["--headless", "--data-parallel-start-rank", "8"] and not other["serves"]


def test_replicas_each_get_their_own_gpus_and_port() -> None:
    plan = _plan("meta-llama/Llama-3.1-8B-Instruct", "2x8xa800.yml", max_model_len=8192)
    node = plan["instances"][0]["head_node"]
    mine = launches(plan["instances"], node)
    assert len(mine) == 8
    assert [m["env"]["CUDA_VISIBLE_DEVICES"] for m in mine] == [str(i) for i in range(8)]
    assert len({m["port"] for m in mine}) == 8 and len({m["name"] for m in mine}) == 8
    assert all(m["role"] == "single" and m["serves"] for m in mine)


def test_cpu_instance_binds_cores_per_rank_and_targets_the_cpu() -> None:
    cluster = cluster_from_data({"nodes": [{"name": "h", "gpu": "cpu", "gpu_count": 2, "gpu_memory_gib": 2}]})
    plan = plan_cluster(
        load_model(str(FIXTURES.parent.parent.parent / "inventories/local/files/tiny-llama")),
        cluster,
        Wishes(max_model_len=2048, tensor_parallel_size=2),
    )
    (launch,) = launches(plan["instances"], "h", {"cpu_cores": 4, "model": "/m"})
    assert launch["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0-1|2-3"
    assert launch["env"]["VLLM_TARGET_DEVICE"] == "cpu"
    assert "CUDA_VISIBLE_DEVICES" not in launch["env"]
    assert launch["argv"][:3] == ["vllm", "serve", "/m"]
    assert "--kv-cache-memory-bytes" in launch["argv"] and "--gpu-memory-utilization" not in launch["argv"]


def test_cpu_replicas_on_one_node_each_get_their_own_cores() -> None:
    """Two TP=1 replicas on a 4-core CPU node bind 0-1 and 2-3, not both 0-3."""
    cluster = cluster_from_data({"nodes": [{"name": "h", "gpu": "cpu", "gpu_count": 2, "gpu_memory_gib": 2}]})
    tiny = str(FIXTURES.parent.parent.parent / "inventories/local/files/tiny-llama")
    plan = plan_cluster(load_model(tiny), cluster, Wishes(max_model_len=2048, tensor_parallel_size=1))
    mine = launches(plan["instances"], "h", {"cpu_cores": 4, "model": "/m"})
    assert [m["env"]["VLLM_CPU_OMP_THREADS_BIND"] for m in mine] == ["0-1", "2-3"]
    # Fewer cores than ranks: they share, as one launch's ranks do.
    shared = launches(plan["instances"], "h", {"cpu_cores": 1, "model": "/m"})
    assert [m["env"]["VLLM_CPU_OMP_THREADS_BIND"] for m in shared] == ["0", "0"]


@pytest.mark.parametrize(
    ("ranks", "cores", "expected"),
    [([1, 1], 4, [(0, 2), (2, 2)]), ([2, 1], 3, [(0, 2), (2, 1)]), ([2, 1], 7, [(0, 4), (4, 3)]), ([1], 4, None),
     ([2, 2], 3, None)],
)  # fmt: skip
def test_core_blocks(ranks: list[int], cores: int, expected: list[tuple[int, int]] | None) -> None:
    assert core_blocks(ranks, cores) == expected


@pytest.mark.parametrize(
    ("ranks", "cores", "expected"),
    [(1, 2, "0-1"), (2, 2, "0|1"), (2, 4, "0-1|2-3"), (3, 8, "0-1|2-4|5-7"), (4, 2, "0|1|0|1"), (1, 1, "0")],
)
def test_cpu_binding(ranks: int, cores: int, expected: str) -> None:
    assert cpu_binding(ranks, cores) == expected


def test_serving_options_become_flags() -> None:
    # Prefix caching is a declared option (vllm_fleet/schema.py): the plan renders it.
    plan = _plan("meta-llama/Llama-3.1-8B-Instruct", "2x8xa800.yml", max_model_len=8192, enable_prefix_caching=True)
    opts = {
        "enable_chunked_prefill": False,
        "trust_remote_code": True,
        "tool_call_parser": "llama3_json",
        "reasoning_parser": None,
        "extra_args": ["--seed", "7"],
        "extra_env": {"VLLM_LOGGING_LEVEL": "DEBUG"},
    }
    launch = launches(plan["instances"], plan["instances"][0]["head_node"], opts)[0]
    planned = plan["instances"][0]["vllm_args"]
    assert planned[-1] == "--enable-prefix-caching"
    assert launch["argv"] == ["vllm", *planned,
        "--no-enable-chunked-prefill", "--trust-remote-code",
        "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json", "--seed", "7",
    ]  # fmt: skip
    assert launch["env"]["VLLM_LOGGING_LEVEL"] == "DEBUG"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"extra_args": ["--api-key", "x"]}, "vllm_fleet_extra_args: holds --api-key"),
        ({"extra_args": ["--hf-token=x"]}, "holds --hf-token"),
        ({"colour": "red"}, "unknown option"),
        ({"master_port": "high"}, "vllm_fleet_master_port"),
        ({"extra_env": ["A=1"]}, "vllm_fleet_extra_env: must be a mapping"),
    ],
)
def test_bad_options_name_the_field(options: dict[str, Any], message: str) -> None:
    plan = _plan("meta-llama/Llama-3.1-8B-Instruct", "2x8xa800.yml", max_model_len=8192)
    with pytest.raises(PlanError, match=message):
        launches(plan["instances"], plan["instances"][0]["head_node"], options)


LOG = """\
(EngineCore pid=1) INFO 11-29 15:33:50 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 2,048 tokens per request: 1024.00x
...restart...
(EngineCore pid=9) INFO 11-29 15:40:50 [kv_cache_utils.py:2327] GPU KV cache size: 1,880,960 tokens, Maximum concurrency for 2,048 tokens per request: 918.44x
"""  # noqa: E501


def test_kv_report_takes_the_last_line() -> None:
    assert kv_report(LOG) == {"pool": "GPU", "kv_tokens": 1880960, "max_model_len": 2048, "max_concurrency": 918.44}
    assert kv_report("nothing here") is None


def test_compare_and_table() -> None:
    assert compare(1000, 1030)["verdict"] == "match"
    assert compare(1000, 900) == {"predicted": 1000, "reported": 900, "ratio": 0.9, "verdict": "under"}
    assert compare(1000, None)["verdict"] == "unknown"
    probes = [
        {"endpoint": "127.0.0.1:8080", "via": "gateway", "name": "gateway", "health": True, "models": True,
         "completion": True, "stream": True, "first_token_s": 0.05, "ok": True},
        {"endpoint": "10.0.0.1:8000", "via": "direct", "name": "m-0", "layout": "TP1 PP1 on node1", "health": True,
         "models": True, "completion": True, "stream": False, "first_token_s": None, "ok": False},
    ]  # fmt: skip
    reports = [{"instance": "m-0", "kv": compare(1000, 1010)}]
    rows = verify_rows(probes, reports)
    assert rows[0]["kv"]["reported"] == 1010 and rows[1]["kv"]["ratio"] == 1.01
    table = verify_table(rows).splitlines()
    assert table[0].split()[:3] == ["endpoint", "via", "layout"]
    assert "FAIL" in table[3] and "50 ms" in table[2] and "1,010" in table[3]


def test_compare_blocks_reuses_the_5_percent_rule_and_names_a_missing_figure() -> None:
    assert compare_blocks(1000, 1049) == {"predicted": 1000, "reported": 1049, "ratio": 1.049, "verdict": "match"}
    assert compare_blocks(1000, 1051)["verdict"] == "over" and compare_blocks(1000, 949)["verdict"] == "under"
    assert compare_blocks(1000, None) == {"predicted": 1000, "reported": None, "ratio": None, "verdict": "not reported"}
    assert compare_blocks(0, 5)["verdict"] == "unknown"  # nothing predicted


def test_reported_blocks_takes_the_front_ends_one_figure() -> None:
    # With DP every engine's sample carries the front end's sum: adding them would double it.
    assert reported_blocks({"0": 4096, "1": 4096}) == 4096
    assert reported_blocks({"0": 2048}) == 2048
    assert reported_blocks(None) is None and reported_blocks({}) is None


def test_predicted_blocks_pp_is_the_smallest_stage_and_dp_the_sum_over_engines() -> None:
    pp = _plan("deepseek-ai/DeepSeek-R1", "a800_l20.yml", max_model_len=32768)["instances"][0]
    assert pp["pipeline_parallel_size"] > 1
    assert predicted_blocks(pp) == pp["memory"]["num_gpu_blocks"] > 0
    # every rank gets the smallest stage's count (get_kv_cache_configs), and the plan says so
    assert {r["num_gpu_blocks"] for r in pp["memory"]["ranks"]} == {pp["memory"]["num_gpu_blocks"]}
    nodes = [
        {"name": f"node{i}", "gpu": "cpu", "gpu_count": 1, "gpu_memory_gib": 1, "address": f"10.0.0.{i}"}
        for i in (1, 2)
    ]
    tiny = str(FIXTURES.parent.parent.parent / "inventories/local/files/tiny-llama")
    (dp,) = plan_cluster(
        load_model(tiny), cluster_from_data({"nodes": nodes}), Wishes(max_model_len=1024, data_parallel_size=2)
    )["instances"]
    assert predicted_blocks(dp) == 2 * dp["memory"]["num_gpu_blocks"] > 0
    assert verify_target(dp, "tiny")["predicted_blocks"] == predicted_blocks(dp)


def test_verify_rows_and_table_show_blocks() -> None:
    base = {"health": True, "models": True, "completion": True, "stream": True, "first_token_s": 0.05, "ok": True}
    probes = [
        {**base, "endpoint": "127.0.0.1:8080", "via": "gateway", "name": "gateway"},
        {**base, "endpoint": "10.0.0.1:8000", "via": "direct", "name": "m-0", "predicted_blocks": 2000,
         "gpu_blocks": {"0": 2090, "1": 2090}},
        {**base, "endpoint": "10.0.0.2:8000", "via": "direct", "name": "m-1", "predicted_blocks": 1000,
         "gpu_blocks": {"0": 800}},
    ]  # fmt: skip
    rows = verify_rows(probes, [])
    assert rows[1]["blocks"] == {"predicted": 2000, "reported": 2090, "ratio": 1.045, "verdict": "match"}
    assert rows[2]["blocks"]["verdict"] == "under"
    assert rows[0]["blocks"] == compare(3000, 2890)  # the gateway: the sums over its instances
    table = verify_table(rows).splitlines()
    assert table[0].rstrip().endswith("blocks (vLLM/plan)")
    assert table[3].rstrip().endswith("2,090/2,000 match") and table[4].rstrip().endswith("800/1,000 under")
    # /metrics without the gauge: "not reported" in the row, the gateway's sum and the table; still ok
    probes[2] = {**probes[2], "gpu_blocks": None}
    rows = verify_rows(probes, [])
    assert rows[2]["blocks"]["verdict"] == rows[0]["blocks"]["verdict"] == "not reported"
    assert rows[2]["ok"] and verify_table(rows).splitlines()[4].rstrip().endswith("not reported")
    # no instance's KV report read (a run limited to other hosts): the gateway row has no "kv"
    # either, as the summary's warnings select rows by it (a None there failed the play)
    assert "kv" not in rows[0] and all("kv" not in row for row in rows)
    # a probe of an older plan (no prediction) gets no blocks at all
    assert "blocks" not in verify_rows([{**base, "endpoint": "e:1", "via": "direct", "name": "x"}], [])[0]


def test_dense_dp_across_two_nodes_when_asked() -> None:
    nodes = [
        {"name": f"node{i}", "gpu": "cpu", "gpu_count": 1, "gpu_memory_gib": 1, "address": f"10.0.0.{i}"}
        for i in (1, 2)
    ]
    tiny = str(FIXTURES.parent.parent.parent / "inventories/local/files/tiny-llama")
    plan = plan_cluster(load_model(tiny), cluster_from_data({"nodes": nodes}), Wishes(max_model_len=1024))
    assert all(i["executor"] == "mp" for i in plan["instances"])  # not asked: replicas
    plan = plan_cluster(
        load_model(tiny), cluster_from_data({"nodes": nodes}), Wishes(max_model_len=1024, data_parallel_size=2)
    )
    (inst,) = plan["instances"]
    assert (inst["executor"], inst["data_parallel_size"], inst["nodes"]) == ("dp", 2, ["node1", "node2"])
    assert "--enable-expert-parallel" not in inst["vllm_args"]
    (head,) = launches(plan["instances"], "node1")
    (other,) = launches(plan["instances"], "node2")
    assert head["argv"][-6:] == [
        "--data-parallel-size-local", "1", "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13345"
    ]  # fmt: skip
    assert other["argv"][-3:] == ["--headless", "--data-parallel-start-rank", "1"] and not other["serves"]
    with pytest.raises(
        PlanError, match="vllm_fleet_data_parallel_size: DP=3 cannot run: DP=3 needs 3 CPU nodes, 2 exist"
    ):
        plan_cluster(
            load_model(tiny), cluster_from_data({"nodes": nodes}), Wishes(max_model_len=1024, data_parallel_size=3)
        )
