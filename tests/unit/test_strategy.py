from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from vllm_fleet.errors import NothingFitsError, PlanError
from vllm_fleet.model.spec import load_model
from vllm_fleet.planning.cluster import cluster_from_data, load_cluster
from vllm_fleet.planning.strategy import Wishes, plan_cluster


def _plan(model: str, cluster: str, **wishes: object) -> dict[str, object]:
    return plan_cluster(load_model(model), load_cluster(FIXTURES / cluster), Wishes(**wishes))  # type: ignore[arg-type]


def test_seed_case_mixed_gpus_get_a_balanced_layer_partition() -> None:
    plan = _plan("deepseek-ai/DeepSeek-R1", "a800_l20.yml", max_model_len=32768)
    (inst,) = plan["instances"]  # type: ignore[misc]
    assert plan["strategy"] == "pp_mixed"
    assert inst["tensor_parallel_size"] == 8 and inst["pipeline_parallel_size"] == 2
    partition = inst["layer_partition"]
    assert sum(partition) == 61 and partition[0] > partition[1]  # the 80 GB stage takes more layers
    assert inst["env"]["VLLM_PP_LAYER_PARTITION"] == ",".join(map(str, partition))
    assert [s["node"] for s in inst["stages"]] == ["a800-node", "l20-node"]
    assert inst["placement"] == {"bundles": [{"GPU": 8}, {"GPU": 8}], "strategy": "STRICT_SPREAD"}
    # Both nodes hold 8 GPUs and the serving environment has no Ray: native multi-node.
    assert inst["executor"] == "native" and "--distributed-executor-backend" not in inst["vllm_args"]
    assert inst["memory"]["fits"]


def test_model_that_fits_a_node_gets_replicas_behind_the_gateway() -> None:
    plan = _plan("meta-llama/Llama-3.1-8B-Instruct", "2x8xa800.yml", max_model_len=8192)
    instances = plan["instances"]
    assert plan["strategy"] == "replicas" and len(instances) == 16  # type: ignore[arg-type]
    assert all(i["tensor_parallel_size"] == 1 for i in instances)  # type: ignore[union-attr]
    gateway = plan["gateway"]
    assert gateway["enabled"] and len(gateway["upstreams"]) == 16  # type: ignore[index]
    ports = {(i["head_node"], i["port"]) for i in instances}  # type: ignore[union-attr]
    gpu_ids = {(i["head_node"], tuple(i["stages"][0]["gpu_ids"])) for i in instances}  # type: ignore[union-attr]
    assert len(ports) == 16 and len(gpu_ids) == 16


def test_model_too_big_for_one_node_uses_pp_across_nodes() -> None:
    plan = _plan("meta-llama/Llama-3.1-405B", "2x8xa800.yml", max_model_len=32768)
    (inst,) = plan["instances"]  # type: ignore[misc]
    assert (inst["tensor_parallel_size"], inst["pipeline_parallel_size"]) == (8, 2)
    assert inst["layer_partition"] is None  # vLLM's default split, no variable needed
    assert "VLLM_PP_LAYER_PARTITION" not in inst["env"]


def test_rejected_layouts_keep_their_reason() -> None:
    plan = _plan("Qwen/Qwen2.5-72B-Instruct", "2x8xa800.yml", max_model_len=8192)
    reasons = [r["reason"] for r in plan["rejected"]]  # type: ignore[union-attr]
    assert "TP=3 rejected: 64 attention heads not divisible by 3" in reasons
    assert any(r.startswith("fits, but") for r in reasons)


def test_cross_node_tp_only_when_allowed() -> None:
    spec = load_model("meta-llama/Llama-3.1-405B")
    cluster = load_cluster(FIXTURES / "2x8xa800.yml")
    plan = plan_cluster(spec, cluster, Wishes(tensor_parallel_size=16, max_model_len=8192, allow_cross_node_tp=True))
    assert plan["instances"][0]["tensor_parallel_size"] == 16
    assert any("across nodes all-reduces" in w for w in plan["warnings"])
    with pytest.raises(NothingFitsError, match="pass --allow-cross-node-tp"):
        plan_cluster(spec, cluster, Wishes(tensor_parallel_size=16, max_model_len=8192))


def test_moe_can_use_data_and_expert_parallelism() -> None:
    plan = _plan("Qwen/Qwen3-235B-A22B", "2x8xa800.yml", max_model_len=8192, strategies=("dp_ep",))
    (inst,) = plan["instances"]  # type: ignore[misc]
    # DP=8 inside one node leaves no room for 8K tokens (each rank's MoE layers gather the
    # 8 x 2,048 profile tokens of the DP group), so DP spans both nodes.
    assert inst["enable_expert_parallel"] and inst["data_parallel_size"] == 16
    args = inst["vllm_args"]
    assert "--enable-expert-parallel" in args
    assert args[args.index("--data-parallel-size-local") + 1] == "8"
    assert any(
        "DP=8 EP" in r["layout"] and ("KV cache holds" in r["reason"] or "exceed the budget" in r["reason"])
        for r in plan["rejected"]
    )


def test_nothing_fits_says_why_and_what_would() -> None:
    cluster = cluster_from_data({"nodes": [{"name": "n1", "gpu": "L4", "gpu_count": 1}]})
    with pytest.raises(NothingFitsError) as err:
        plan_cluster(load_model("meta-llama/Llama-3.1-70B"), cluster, Wishes(max_model_len=8192))
    text = str(err.value)
    assert text.startswith("model: no layout fits meta-llama/Llama-3.1-70B")
    assert "fix:" in text and "GPUs of" in text


def test_forced_layout_is_honoured() -> None:
    plan = _plan(
        "meta-llama/Llama-3.1-8B", "2x8xa800.yml", tensor_parallel_size=2, pipeline_parallel_size=1, max_model_len=8192
    )
    assert {i["tensor_parallel_size"] for i in plan["instances"]} == {2}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        pytest.param([], r"nodes: the cluster has no nodes", id="empty"),
        pytest.param(
            [{"name": "a", "gpu": "Z100", "gpu_count": 8}],
            r"nodes\[0\] \(a\)\.gpu: unknown GPU 'Z100'",
            id="unknown-gpu",
        ),
        pytest.param([{"name": "a", "gpu": "H100", "gpu_count": 0}], r"gpu_count: must be positive", id="zero-gpus"),
        pytest.param([{"name": "a", "gpu": "H100"}], r"gpu_count: is missing", id="missing-count"),
        pytest.param(
            [{"name": "a", "gpu": "cpu", "gpu_count": 1}],
            r"gpu_memory_gib: is required for a CPU node",
            id="cpu-needs-memory",
        ),
        pytest.param(
            [{"name": "a", "gpu": "H100", "gpu_count": 1}, {"name": "a", "gpu": "H100", "gpu_count": 1}],
            r"node name 'a' appears twice",
            id="duplicate",
        ),
        pytest.param(
            [{"name": "a", "gpu": "H100", "gpu_count": 1, "nic_gbps": "fast"}],
            r"nic_gbps: 'fast' is not a number",
            id="bad-nic",
        ),
        pytest.param(
            [{"name": "a", "gpu": "H100", "gpu_count": 1, "gpu_memory_gib": -3}],
            r"gpu_memory_gib: must be positive",
            id="negative-memory",
        ),
    ],
)
def test_bad_cluster_names_the_field(nodes: list[dict[str, object]], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        cluster_from_data({"nodes": nodes})


def test_bad_wishes_name_the_field() -> None:
    cluster = load_cluster(FIXTURES / "2x8xa800.yml")
    with pytest.raises(PlanError, match=r"--tensor-parallel-size: TP=3 does not divide the 32 attention heads"):
        plan_cluster(load_model("meta-llama/Llama-3.1-8B"), cluster, Wishes(tensor_parallel_size=3))
    with pytest.raises(PlanError, match=r"gpu_memory_utilization: 1.2 is above 1, the largest the planner accepts"):
        plan_cluster(load_model("meta-llama/Llama-3.1-8B"), cluster, Wishes(gpu_memory_utilization=1.2))


def test_missing_cluster_file(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"--cluster: .* does not exist"):
        load_cluster(tmp_path / "nope.yml")


def test_an_asked_dtype_is_rendered_even_where_it_is_the_checkpoints() -> None:
    """vllm_fleet_dtype: bfloat16 reaches vLLM as --dtype bfloat16 (on a float16 checkpoint vLLM's
    auto would pick float16); unset (auto), a bfloat16 checkpoint renders no --dtype."""
    cluster = cluster_from_data({"nodes": [{"name": "n", "gpu": "H100-SXM", "gpu_count": 1}]})
    rendered = {}
    for dtype in ("auto", "bfloat16", "float16"):
        plan = plan_cluster(load_model("Qwen/Qwen3-8B"), cluster, Wishes(dtype=dtype, max_model_len=4096))
        args = plan["instances"][0]["vllm_args"]
        rendered[dtype] = args[args.index("--dtype") + 1] if "--dtype" in args else None
    assert rendered == {"auto": None, "bfloat16": "bfloat16", "float16": "float16"}
