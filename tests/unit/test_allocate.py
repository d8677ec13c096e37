"""Several models on one cluster (vllm_fleet/planning/allocate.py, ``vllm-fleet plan --models``).

Every expectation about a layout comes from the single-model planner itself (plan_cluster on
the same GPUs), not from numbers written here.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import FIXTURES
from vllm_fleet import cli
from vllm_fleet.deploy import deployment, records
from vllm_fleet.errors import NothingFitsError, PlanError
from vllm_fleet.inventory import interface
from vllm_fleet.model.catalog import lookup_model
from vllm_fleet.model.files import is_pooling
from vllm_fleet.model.spec import load_model
from vllm_fleet.planning.allocate import (
    MAX_SHARED_UTILIZATION,
    Allocation,
    Footprint,
    ModelWish,
    allocate,
    combined_plan,
    find_footprints,
    render_allocation,
    wishes_from_data,
)
from vllm_fleet.planning.cluster import Node, cluster_from_data, load_cluster
from vllm_fleet.planning.strategy import Wishes, plan_cluster
from vllm_fleet.planning.table import render_plan

L70 = "meta-llama/Llama-3.3-70B-Instruct"
L8 = "meta-llama/Llama-3.1-8B-Instruct"
E5 = "intfloat/e5-mistral-7b-instruct"
A800 = FIXTURES / "2x8xa800.yml"


def _footprint(model: str, nodes: list[Node], **wish: object) -> Footprint:
    wish_obj = ModelWish(model, **wish)  # type: ignore[arg-type]
    found = find_footprints(load_model(model), wish_obj, "x", nodes, [])
    return found[0]


def _used(result: Allocation) -> list[tuple[str, int]]:
    """Every (node, GPU) an instance's plan runs a stage on."""
    return [
        (stage["node"], gpu)
        for m in result.models
        for inst in m.instances
        for stage in inst.plan["instances"][0]["stages"]
        for gpu in stage["gpu_ids"]
    ]


def _seeds() -> tuple[Allocation, Footprint]:
    nodes = load_cluster(A800)
    fp70 = _footprint(L70, nodes, max_model_len=32768)
    assert len(fp70.stage_gpus) == 1 and 8 % fp70.gpus == 0, fp70
    wishes = [
        ModelWish(L70, served_model_name="llama-70b", max_model_len=32768, min_replicas=8 // fp70.gpus),
        ModelWish(L8, served_model_name="llama-8b", max_model_len=32768, min_replicas=2),
        ModelWish(E5, served_model_name="bge", max_model_len=4096),
    ]
    return allocate(wishes, nodes), fp70


def test_seeds_example_70b_on_one_node_8b_on_two_embedding_on_one() -> None:
    result, fp70 = _seeds()
    by_name = {m.name: m for m in result.models}
    big, small, embed = by_name["llama-70b"], by_name["llama-8b"], by_name["bge"]
    # The 70B: 8 GPUs of one node, in instances of the planner's smallest layout.
    assert sum(len(ids) for inst in big.instances for ids in inst.gpus.values()) == 8
    assert len({n for inst in big.instances for n in inst.gpus}) == 1
    for inst in big.instances:
        assert inst.plan["instances"][0]["tensor_parallel_size"] == fp70.tensor_parallel_size
    # The planner on exactly that many A800s plans the same TP (and nothing smaller fits).
    alone = plan_cluster(
        load_model(L70), [Node("n", "A800", fp70.gpus, 79.15, True, 400.0, arch="ampere")], Wishes(max_model_len=32768)
    )
    assert alone["instances"][0]["tensor_parallel_size"] == fp70.tensor_parallel_size
    assert [len(ids) for inst in small.instances for ids in inst.gpus.values()] == [1, 1]
    assert [len(ids) for inst in embed.instances for ids in inst.gpus.values()] == [1]
    # The others share the second node; no GPU is used twice.
    used = _used(result)
    assert len(used) == len(set(used)) == 8 + 2 + 1
    assert result.to_dict()["free_gpus"] == 16 - len(used)
    assert not {n for m in (small, embed) for inst in m.instances for n in inst.gpus} & set(big.instances[0].gpus)
    # Ports are distinct on each node, and every instance's vllm serve has its own.
    endpoints = [inst.plan["instances"][0]["endpoint"] for m in result.models for inst in m.instances]
    assert len(endpoints) == len(set(endpoints))
    # Denied layouts carry the planner's own reason.
    assert any(d["layout"].startswith("replicas: TP=1 PP=1") and "exceed" in d["reason"] for d in big.denied)


def test_seeds_table_shows_every_gpu() -> None:
    result, _ = _seeds()
    text = render_allocation(result)
    rows = [line.split() for line in text.splitlines() if line.startswith("a800-")]
    assert len(rows) == 16
    held = {(node, int(gpu)): who for node, gpu, _type, who, *_ in rows}
    for m in result.models:
        for inst in m.instances:
            for node, ids in inst.gpus.items():
                for i in ids:
                    assert held[(node, i)] == inst.name
    assert sum(1 for who in held.values() if who == "free") == result.to_dict()["free_gpus"]
    assert "Denied layouts of llama-70b:" in text


def test_priorities_decide_who_gets_the_extra_replicas() -> None:
    nodes = cluster_from_data({"nodes": [{"name": "one", "gpu": "A800", "gpu_count": 8}]})

    def run(p8: int, pe5: int) -> dict[str, int]:
        wishes = [
            ModelWish(L8, served_model_name="llama-8b", max_model_len=8192, replicas=8, priority=p8),
            ModelWish(E5, served_model_name="e5", max_model_len=4096, replicas=8, priority=pe5),
        ]
        result = allocate(wishes, nodes)
        assert any("of the 8 instances wished fit" in w for w in result.warnings)
        return {m.name: len(m.instances) for m in result.models}

    # Both get their minimum (1), then the higher priority takes the rest.
    assert run(10, 1) == {"llama-8b": 7, "e5": 1}
    assert run(1, 10) == {"llama-8b": 1, "e5": 7}


def test_target_concurrency_sets_the_replicas_from_the_plan() -> None:
    nodes = load_cluster(A800)
    fp = _footprint(L8, nodes, max_model_len=32768)
    target = int(fp.max_concurrency * 2) + 1  # a bit more than two instances hold
    result = allocate([ModelWish(L8, max_model_len=32768, target_concurrency=target)], nodes)
    assert len(result.models[0].instances) == 3


def test_not_everything_fits_names_the_models_and_what_fits() -> None:
    nodes = cluster_from_data({"nodes": [{"name": "one", "gpu": "A800", "gpu_count": 8}]})
    fp70 = _footprint(L70, nodes, max_model_len=32768)
    need = 8 // fp70.gpus  # the 70B alone fills the node
    wishes = [
        ModelWish(L70, served_model_name="llama-70b", max_model_len=32768, min_replicas=need, priority=5),
        ModelWish(L8, served_model_name="llama-8b", max_model_len=8192, min_replicas=1),
    ]
    with pytest.raises(PlanError) as err:
        allocate(wishes, nodes)
    assert err.value.field == "vllm_fleet_models"
    text = str(err.value)
    assert f"fits: llama-70b x{need}" in text and "does not fit: llama-8b" in text
    assert "the most free on one A800 node is 0" in text
    # With the 8B first, the 70B is the one left short.
    swapped = [wishes[0], ModelWish(L8, served_model_name="llama-8b", max_model_len=8192, priority=9)]
    with pytest.raises(PlanError, match=r"fits: llama-8b x1; does not fit: llama-70b"):
        allocate(swapped, nodes)


def test_cli_exit_3_on_what_does_not_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = tmp_path / "models.yml"
    models.write_text(
        yaml.safe_dump(
            {"vllm_fleet_models": [{"model": L8, "max_model_len": 8192, "min_replicas": 17, "served_model_name": "m"}]}
        )
    )
    assert cli.main(["plan", "--models", str(models), "--cluster", str(A800)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vllm_fleet_models:" in err and "lower min_replicas of m to 16" in err


def test_cli_prints_the_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = tmp_path / "models.yml"
    models.write_text(yaml.safe_dump({"vllm_fleet_models": [{"model": L8, "max_model_len": 8192}, E5]}))
    assert cli.main(["plan", "--models", str(models), "--cluster", str(A800)]) == 0
    assert "instance" in capsys.readouterr().out
    assert cli.main(["plan", "--models", str(models), "--cluster", str(A800), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [m["replicas"] for m in data["models"]] == [1, 1]
    assert len(data["gpus"]) == 16 and data["free_gpus"] == 14
    plan = data["models"][1]["instances"][0]["plan"]
    assert plan["instances"][0]["served_model_name"] == "e5-mistral-7b-instruct"
    # Neither --model nor --models: one line, exit 2.
    assert cli.main(["plan", "--cluster", str(A800)]) == 2
    assert "--model: is required" in capsys.readouterr().err


def test_mixed_gpu_types_put_the_big_model_on_the_big_gpus() -> None:
    nodes = cluster_from_data(
        {
            "nodes": [
                {"name": "a100", "gpu": "A100-40G", "gpu_count": 4},
                {"name": "h100", "gpu": "H100-SXM", "gpu_count": 4},
            ]
        }
    )
    big, small = "Qwen/Qwen2.5-32B", L8
    # The planner's own verdicts: the 32B does not fit one A100-40G, it fits one H100.
    with pytest.raises(NothingFitsError):
        plan_cluster(load_model(big), [replace(nodes[0], gpu_count=1)], Wishes(max_model_len=8192))
    plan_cluster(load_model(big), [replace(nodes[1], gpu_count=1)], Wishes(max_model_len=8192))
    result = allocate([ModelWish(big, max_model_len=8192), ModelWish(small, max_model_len=8192)], nodes)
    where = {m.name: {n for inst in m.instances for n in inst.gpus} for m in result.models}
    assert where == {"Qwen2.5-32B": {"h100"}, "Llama-3.1-8B-Instruct": {"a100"}}  # the 8B leaves the H100s free
    denied = result.models[0].denied
    assert any(d["gpu"] == "A100-40G" and "exceed" in d["reason"] for d in denied)
    # When the small GPUs are full, the 8B falls back to the H100 node.
    more = allocate([ModelWish(big, max_model_len=8192), ModelWish(small, max_model_len=8192, replicas=6)], nodes)
    eight = more.models[1]
    assert len(eight.instances) == 6
    assert sorted(n for inst in eight.instances for n in inst.gpus) == ["a100"] * 4 + ["h100"] * 2


def test_model_bigger_than_a_node_spans_whole_nodes() -> None:
    nodes = cluster_from_data({"nodes": [{"name": f"a800-{i}", "gpu": "A800", "gpu_count": 8} for i in range(3)]})
    result = allocate(
        [ModelWish("meta-llama/Llama-3.1-405B", max_model_len=32768), ModelWish(L8, max_model_len=8192)], nodes
    )
    (inst,) = result.models[0].instances
    expected = plan_cluster(load_model("meta-llama/Llama-3.1-405B"), nodes[:2], Wishes(max_model_len=32768))
    assert inst.footprint.pipeline_parallel_size == expected["instances"][0]["pipeline_parallel_size"] > 1
    assert {n: len(ids) for n, ids in inst.gpus.items()} == {"a800-0": 8, "a800-1": 8}
    assert set(result.models[1].instances[0].gpus) == {"a800-2"}


def test_memory_shares_put_two_instances_on_one_gpu() -> None:
    nodes = cluster_from_data({"nodes": [{"name": "one", "gpu": "A800", "gpu_count": 2}]})
    wishes = [
        ModelWish(E5, max_model_len=4096, gpu_memory_share=0.45),
        ModelWish("Qwen/Qwen3-0.6B", max_model_len=8192, gpu_memory_share=0.45),
    ]
    result = allocate(wishes, nodes)
    (gpu_a,) = result.models[0].instances[0].gpus["one"]
    (gpu_b,) = result.models[1].instances[0].gpus["one"]
    assert gpu_a == gpu_b
    args = result.models[0].instances[0].plan["instances"][0]["vllm_args"]
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.45"
    # Shares that add up past the limit go to separate GPUs; a whole-GPU model never shares.
    half = [
        ModelWish(E5, max_model_len=4096, gpu_memory_share=0.5),
        ModelWish("Qwen/Qwen3-0.6B", gpu_memory_share=0.5, max_model_len=8192),
    ]
    assert MAX_SHARED_UTILIZATION < 0.5 + 0.5
    apart = allocate(half, nodes)
    assert apart.models[0].instances[0].gpus != apart.models[1].instances[0].gpus
    whole = allocate([wishes[0], ModelWish(L8, max_model_len=8192, replicas=2)], nodes)
    assert len(whole.models[1].instances) == 1  # one GPU is shared-only, the 8B takes the other


def test_bad_wishes_name_the_field() -> None:
    with pytest.raises(PlanError, match=r"vllm_fleet_models\[0\] \(x\)\.replica: is not a model wish"):
        wishes_from_data({"vllm_fleet_models": [{"model": "x", "replica": 2}]})
    with pytest.raises(PlanError, match=r"replicas: 1 is below min_replicas 2"):
        wishes_from_data([{"model": "x", "replicas": 1, "min_replicas": 2}])
    with pytest.raises(PlanError, match=r"gpu_memory_share: must be in \(0, 0.95\]"):
        wishes_from_data([{"model": "x", "gpu_memory_share": 1.0}])
    with pytest.raises(PlanError, match=r"lists no models"):
        wishes_from_data({"vllm_fleet_models": []})
    nodes = load_cluster(A800)
    with pytest.raises(PlanError, match=r"'m' is also the name of vllm_fleet_models\[0\]"):
        allocate([ModelWish(L8, served_model_name="m"), ModelWish(E5, served_model_name="m")], nodes)
    with pytest.raises(NothingFitsError, match=r"vllm_fleet_models\[0\] \(meta-llama/Llama-3.1-405B\): fits on no GPU"):
        allocate([ModelWish("meta-llama/Llama-3.1-405B", max_model_len=32768)], nodes[:1])


def test_the_embedding_model_is_a_pooling_model_in_vllm() -> None:
    cfg = lookup_model(E5)
    assert cfg is not None and is_pooling(cfg)
    spec = load_model(E5)
    assert (spec.num_layers, spec.hidden_size, spec.num_kv_heads) == (32, 4096, 8)


# -- the allocation as the deployment's plan (node records, gateway routes) ------------

TINY = Path(__file__).resolve().parents[2] / "inventories/local/files/tiny-llama"
TINY8 = Path(__file__).resolve().parents[2] / "tests/system/files/tiny-llama-8"


def _two_model_plan() -> dict[str, Any]:
    nodes = cluster_from_data(
        [
            {"name": n, "gpu": "cpu", "gpu_count": 1, "gpu_memory_gib": 1, "address": f"10.77.0.1{i + 1}"}
            for i, n in enumerate(("node1", "node2"))
        ]
    )
    wishes = wishes_from_data(
        [
            {"model": str(TINY), "served_model_name": "alpha", "max_model_len": 1024},
            {"model": str(TINY8), "served_model_name": "beta", "max_model_len": 1024},
        ]
    )
    return combined_plan(allocate(wishes, nodes))


def test_the_combined_plan_gives_each_node_its_own_models_launch_path_and_name() -> None:
    plan = _two_model_plan()
    settings = interface.resolve(
        {"vllm_fleet_models": [{"model": "x"}], "vllm_fleet_build_model": True, "vllm_fleet_runtime": "systemd"}
    )
    by_node = {n: records.node_record(plan, n, settings, {"detected_cores": 2}) for n in ("node1", "node2")}
    for node, served, folder in (("node1", "alpha", TINY), ("node2", "beta", TINY8)):
        rec = by_node[node]
        (launch,) = rec["launches"]
        path = f"{records.BUILT_MODELS}/{folder.name}"
        assert launch["argv"][:3] == ["vllm", "serve", path]
        assert launch["argv"][launch["argv"].index("--served-model-name") + 1] == served
        assert rec["served_model_name"] == served
        assert rec["build_models"] == [{"path": path, "source": str(folder)}]
    shared = deployment.deployment_of(plan, settings)
    gateway = shared["gateway"]
    assert (
        by_node["node1"]["gateway"]["enabled"]
        and gateway["enabled"]
        and gateway["routes"]
        == [
            {"model": "alpha", "upstreams": ["10.77.0.11:8000"]},
            {"model": "beta", "upstreams": ["10.77.0.12:8000"]},
        ]
    )
    # verify: one gateway probe per model (its own instances' KV), then each instance directly.
    targets = shared["verify"]["targets"]
    assert [(t["via"], t["model"], t.get("instances")) for t in targets] == [
        ("gateway", "alpha", ["alpha-0"]), ("gateway", "beta", ["beta-0"]),
        ("direct", "alpha", None), ("direct", "beta", None),
    ]  # fmt: skip
    # A model with one replica cannot be drained: its node restarts in place.
    assert not by_node["node1"]["rolling"]["enabled"] and not shared["rolling"]["enabled"]
    assert "alpha, beta has one replica" in by_node["node1"]["rolling"]["reason"]


def test_the_combined_plan_table_is_the_allocation_then_the_instances() -> None:
    plan = _two_model_plan()
    text = render_plan(plan)
    assert text.startswith("Allocation of 2 model(s) on 2 node(s), 2 GPU(s): 2 used, 0 free")
    assert "alpha-0" in text and "beta-0" in text and "Plan for 2 models (alpha, beta)" in text
    assert json.loads(json.dumps(plan)) == plan  # plan.json holds it as it is


def test_models_and_model_together_or_with_prepare_model_are_refused() -> None:
    base = {"vllm_fleet_models": [{"model": "x"}], "vllm_fleet_prepare_model": False}
    with pytest.raises(PlanError, match="vllm_fleet_models: is set together with vllm_fleet_model"):
        interface.check_nodes({"n1": interface.resolve({**base, "vllm_fleet_model": "y"})})
    with pytest.raises(PlanError, match="vllm_fleet_served_model_name: names one model"):
        interface.check_nodes({"n1": interface.resolve({**base, "vllm_fleet_served_model_name": "y"})})
    with pytest.raises(PlanError, match="vllm_fleet_prepare_model"):
        interface.check_nodes({"n1": interface.resolve({**base, "vllm_fleet_prepare_model": True})})
    interface.check_nodes({"n1": interface.resolve(base)})


def test_every_model_inherits_the_deployment_wide_wishes_unless_its_entry_says_otherwise() -> None:
    nodes = cluster_from_data([{"name": "node1", "gpu": "cpu", "gpu_count": 2, "gpu_memory_gib": 1}])
    wishes = wishes_from_data(
        [
            {"model": str(TINY), "served_model_name": "alpha"},
            {"model": str(TINY8), "served_model_name": "beta", "max_model_len": 512},
        ]
    )
    plan = combined_plan(allocate(wishes, nodes, {"enforce_eager": True, "port": 9000, "max_model_len": 1024}))
    by_name = {i["served_model_name"]: i for i in plan["instances"]}
    assert all("--enforce-eager" in i["vllm_args"] for i in plan["instances"])
    assert sorted(i["port"] for i in plan["instances"]) == [9000, 9001]  # one node: the next port each
    assert (by_name["alpha"]["max_model_len"], by_name["beta"]["max_model_len"]) == (1024, 512)


def test_a_model_entry_takes_any_declared_option_as_its_own() -> None:
    """Each vllm_fleet_models entry takes every option vllm_fleet/schema.py declares (checked as
    its inventory variable is, the error naming the entry): one model with n-gram speculative
    decoding, the other with LoRA, on the same nodes; the deployment-wide value is the default."""
    nodes = cluster_from_data({"nodes": [{"name": "n1", "gpu": "H100-SXM", "gpu_count": 2}]})
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    entries = [
        {"model": "Qwen/Qwen3-8B", "served_model_name": "spec", "max_model_len": 8192, "speculative_config": ngram},
        {"model": "Qwen/Qwen3-8B", "served_model_name": "lora", "max_model_len": 8192, "enable_lora": "yes",
         "max_loras": 2, "max_lora_rank": 16},
    ]  # fmt: skip
    plan = combined_plan(allocate(wishes_from_data(entries), nodes, {"enforce_eager": True}))
    args = {i["served_model_name"]: i["vllm_args"] for i in plan["instances"]}
    assert args["spec"][args["spec"].index("--speculative-config") + 1] == json.dumps(ngram, separators=(",", ":"))
    assert "--enable-lora" not in args["spec"] and "--speculative-config" not in args["lora"]
    assert args["lora"][args["lora"].index("--max-loras") + 1] == "2" and "--enable-lora" in args["lora"]
    assert all("--enforce-eager" in a for a in args.values())  # the deployment-wide wish, inherited
    lora = next(i for i in plan["instances"] if i["served_model_name"] == "lora")
    spec = next(i for i in plan["instances"] if i["served_model_name"] == "spec")
    assert lora["memory"]["option_args"] != spec["memory"]["option_args"]  # each planned with its own

    with pytest.raises(PlanError, match=r"vllm_fleet_models\[0\] \(Qwen/Qwen3-8B\)\.max_loras: 0 is below 1"):
        wishes_from_data([{"model": "Qwen/Qwen3-8B", "max_loras": 0}])
    with pytest.raises(PlanError, match=r"\.speculative_config: 'x' is neither a mapping nor JSON"):
        wishes_from_data([{"model": "Qwen/Qwen3-8B", "speculative_config": "x"}])
    with pytest.raises(PlanError, match=r"\.colour: is not a model wish; fix: .*a declared option"):
        wishes_from_data([{"model": "Qwen/Qwen3-8B", "colour": 1}])


@pytest.mark.parametrize("key", ["vllm_version", "multinode_backend", "allow_cross_node_tp"])
def test_a_deployment_wide_option_is_no_models_own(key: str) -> None:
    """One vLLM release and one way to span nodes for the whole deployment: an entry that sets
    one is refused with the inventory variable to set instead (it was planned, then dropped)."""
    with pytest.raises(PlanError, match=rf"\.{key}: is one value for the whole deployment.*vllm_fleet_{key}"):
        wishes_from_data([{"model": "Qwen/Qwen3-8B", key: "auto" if key == "multinode_backend" else "0.32.0"}])


def test_a_models_request_rate_and_slo_set_its_replicas() -> None:
    """Each model's own workload and SLO: the instances its rate takes at what one instance
    serves within its SLO (the performance model), not the minimum."""
    nodes = load_cluster(A800)
    slo, rate = {"tpot_p90_ms": 40}, 12.0
    wish = {"max_model_len": 8192, "options": {"workload": {"request_rate": rate}, "slo": slo}}
    fp = _footprint(L8, nodes, **wish)
    assert fp.slo_capacity > 0
    result = allocate([ModelWish(L8, served_model_name="l8", **wish)], nodes)  # type: ignore[arg-type]
    (model,) = result.models
    assert len(model.instances) == -(-rate // fp.slo_capacity) > 1
    alone = allocate([ModelWish(L8, served_model_name="l8", max_model_len=8192)], nodes)
    assert len(alone.models[0].instances) == 1
