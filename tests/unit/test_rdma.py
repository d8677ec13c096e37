"""InfiniBand and RoCE from recorded gpu_facts (vllm_fleet/deploy/rdma.py, the record's ``rdma``
part): the NCCL variables of every launch and of Ray, and the container settings, for a
node with 4 active InfiniBand HCAs, a RoCE node with its GID index, a node without RDMA,
nodes whose facts were not gathered, and mixed clusters."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.conftest import FIXTURES
from vllm_fleet.deploy import rdma, records
from vllm_fleet.errors import PlanError
from vllm_fleet.inventory import facts, interface
from vllm_fleet.inventory import hostvars as inventory
from vllm_fleet.model.spec import load_model
from vllm_fleet.planning.cluster import cluster_from_data
from vllm_fleet.planning.strategy import Wishes, plan_cluster

F = FIXTURES / "facts"
MODEL = "Qwen/Qwen3-8B"
IB_HCA = "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
ROCE_HCA = "=mlx5_0:1,mlx5_1:1"
WITH_RDMA = {"capabilities": ["IPC_LOCK"], "devices": ["/dev/infiniband:/dev/infiniband"], "ulimits": ["memlock:-1:-1"]}
WITHOUT = {"capabilities": [], "devices": [], "ulimits": []}


def _ports(name: str) -> list[dict[str, Any]]:
    """gpu_facts' ``infiniband`` list of a recorded /sys/class/infiniband reading."""
    ports: list[dict[str, Any]] = facts.host_facts({"ib": (F / f"{name}.ib.txt").read_text()})["infiniband"]
    return ports


def _recorded(name: str) -> list[dict[str, Any]] | None:
    """A recorded reading; "none": a node without RDMA devices, "not gathered": no facts."""
    return {"none": [], "not gathered": None}[name] if name in ("none", "not gathered") else _ports(name)


def _settings(**values: Any) -> dict[str, Any]:
    return interface.resolve({"vllm_fleet_model": MODEL, **{f"vllm_fleet_{k}": v for k, v in values.items()}})


def _fabric(nodes: dict[str, tuple[list[dict[str, Any]] | None, dict[str, Any]]]) -> dict[str, Any]:
    """The record's ``fabric`` context as vllm_fleet/inventory/hostvars.py builds it."""
    return {
        name: {"infiniband": ports, **{k: _settings(**values)[k] for k in records.FABRIC_KEYS}}
        for name, (ports, values) in nodes.items()
    }


def _plan(names: list[str], **wishes: Any) -> dict[str, Any]:
    nodes = [{"name": n, "gpu": "H100-SXM", "gpu_count": 8, "address": f"10.0.0.{i + 1}"} for i, n in enumerate(names)]
    return plan_cluster(load_model(MODEL), cluster_from_data({"nodes": nodes}), Wishes(max_model_len=8192, **wishes))


def test_gpu_facts_reads_the_link_layer_of_each_port() -> None:
    ports = _ports("hgx-4ib")
    assert [(p["device"], p["port"], p["state"], p["link_layer"]) for p in ports] == [
        ("mlx5_0", 1, "ACTIVE", "infiniband"),
        ("mlx5_1", 1, "ACTIVE", "infiniband"),
        ("mlx5_2", 1, "ACTIVE", "infiniband"),
        ("mlx5_3", 1, "ACTIVE", "infiniband"),
        ("mlx5_4", 1, "ACTIVE", "roce"),
        ("mlx5_5", 1, "DOWN", "infiniband"),
    ]
    assert {p["link_layer"] for p in _ports("roce-2x200")} == {"roce"}
    # A reading without the fifth field (the role before it read link_layer): unknown.
    assert {p["link_layer"] for p in _ports("multi-nic")} == {None}
    assert facts.parse_ib("mlx5_0\t1\t100 Gb/sec (4X EDR)\t4: ACTIVE\tunknown\n")[0]["link_layer"] is None


@pytest.mark.parametrize(
    ("ports", "values", "kind", "source", "env", "container"),
    [
        ("hgx-4ib", {}, "infiniband", "detected", {"NCCL_IB_HCA": IB_HCA}, WITH_RDMA),
        # The GID index is a RoCE setting: InfiniBand ports ignore it (NCCL's ncclIbGetGidIndex).
        ("hgx-4ib", {"roce_gid_index": 3}, "infiniband", "detected", {"NCCL_IB_HCA": IB_HCA}, WITH_RDMA),
        ("roce-2x200", {"roce_gid_index": 3}, "roce", "detected",
         {"NCCL_IB_HCA": ROCE_HCA, "NCCL_IB_GID_INDEX": "3"}, WITH_RDMA),
        ("roce-2x200", {}, "roce", "detected", {"NCCL_IB_HCA": ROCE_HCA}, WITH_RDMA),
        ("multi-nic", {}, "infiniband", "detected", {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"}, WITH_RDMA),
        ("none", {}, "none", "detected", {"NCCL_IB_DISABLE": "1"}, WITHOUT),
        ("not gathered", {}, "none", "not detected", {"NCCL_IB_DISABLE": "1"}, WITHOUT),
        ("hgx-4ib", {"rdma": "off"}, "none", "inventory", {"NCCL_IB_DISABLE": "1"}, WITHOUT),
        # Stated by hand: with or without facts, the inventory wins.
        ("not gathered", {"rdma": "infiniband", "rdma_devices": ["mlx5_0", "mlx5_1"]}, "infiniband", "inventory",
         {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}, WITH_RDMA),
        ("hgx-4ib", {"rdma": "infiniband", "rdma_devices": ["mlx5_0:1", "mlx5_2:1"]}, "infiniband", "inventory",
         {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_2:1"}, WITH_RDMA),
        ("hgx-4ib", {"rdma": "roce", "roce_gid_index": 1}, "roce", "detected",
         {"NCCL_IB_HCA": "=mlx5_4:1", "NCCL_IB_GID_INDEX": "1"}, WITH_RDMA),
    ],
    ids=[
        "4 active IB HCAs", "IB ignores the GID index", "RoCE with its GID index", "RoCE, NCCL picks the GID",
        "ports read before the link layer", "no RDMA device", "facts not gathered", "off", "stated without facts",
        "stated subset", "RoCE chosen on a mixed node",
    ],
)  # fmt: skip
def test_node_rdma_from_recorded_facts(
    ports: str, values: dict[str, Any], kind: str, source: str, env: dict[str, str], container: dict[str, Any]
) -> None:
    got = rdma.node_rdma("node1", _recorded(ports), _settings(**values))
    assert (got["kind"], got["source"], got["env"], got["container"]) == (kind, source, env, container)


def test_a_node_with_infiniband_and_roce_uses_infiniband_only() -> None:
    got = rdma.node_rdma("node1", _ports("hgx-4ib"), _settings())
    assert got["devices"] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]  # not the RoCE mlx5_4, not the down mlx5_5
    assert got["reason"] == (
        "4 active InfiniBand port(s) found by gpu_facts; "
        "the RoCE port(s) mlx5_4:1 left out (NCCL does not mix link layers)"
    )


@pytest.mark.parametrize(
    ("ports", "values", "message"),
    [
        (None, {"rdma": "infiniband"},
         "vllm_fleet_rdma: is infiniband on node1, but its gpu_facts were not gathered; fix: list the devices in "
         "vllm_fleet_rdma_devices, or set vllm_fleet_rdma: auto (or off)"),
        ("roce-2x200", {"rdma": "infiniband"},
         "vllm_fleet_rdma: is infiniband on node1, but its gpu_facts list no active InfiniBand port"),
    ],
    ids=["stated without facts or devices", "stated link layer not found"],
)  # fmt: skip
def test_a_stated_link_layer_without_devices_is_refused(
    ports: str | None, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(PlanError, match="^" + re.escape(message)):
        rdma.node_rdma("node1", _ports(ports) if ports else None, _settings(**values))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"vllm_fleet_rdma_devices": ["mlx5_0"]},
         "vllm_fleet_rdma_devices: names devices, but vllm_fleet_rdma is auto (their link layer is not stated); fix: "
         "set vllm_fleet_rdma: infiniband (or roce) on this node too, or drop vllm_fleet_rdma_devices"),
        ({"vllm_fleet_rdma": "roce", "vllm_fleet_rdma_devices": ["mlx5_0 port 1"]},
         "vllm_fleet_rdma_devices: 'mlx5_0 port 1' is not a valid entry; fix: e.g. [mlx5_0, mlx5_1:1]"),
        ({"vllm_fleet_rdma": "roce", "vllm_fleet_rdma_devices": []},
         "vllm_fleet_rdma_devices: is empty; fix: list the devices, or set vllm_fleet_rdma: off for none"),
        ({"vllm_fleet_rdma": "rocev2"}, "vllm_fleet_rdma: must be one of ['auto', 'infiniband', 'roce', 'off']"),
        ({"vllm_fleet_roce_gid_index": -1}, "vllm_fleet_roce_gid_index: -1 is below 0; fix: use 0 or more"),
    ],
    ids=["devices without a link layer", "not a device name", "empty", "unknown mode", "negative GID index"],
)  # fmt: skip
def test_bad_rdma_settings_stop_the_first_play(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError, match="^" + re.escape(message)):
        interface.resolve(raw)


def test_mixed_cluster_of_single_node_replicas() -> None:
    """Three nodes, each with its own replicas: each launch gets its own node's NCCL variables."""
    plan = _plan(["ib", "roce", "plain"])
    fabric = _fabric({"ib": (_ports("hgx-4ib"), {}), "roce": (_ports("roce-2x200"), {"roce_gid_index": 3}),
                      "plain": ([], {})})  # fmt: skip
    expected = {
        "ib": ({"NCCL_IB_HCA": IB_HCA}, WITH_RDMA),
        "roce": ({"NCCL_IB_HCA": ROCE_HCA, "NCCL_IB_GID_INDEX": "3"}, WITH_RDMA),
        "plain": ({"NCCL_IB_DISABLE": "1"}, WITHOUT),
    }
    for node, (env, container) in expected.items():
        settings = _settings(roce_gid_index=3) if node == "roce" else _settings()
        rec = records.node_record(plan, node, settings, {"fabric": fabric})
        assert rec["launches"] and rec["rdma"]["container"] == container and rec["rdma"]["notes"] == []
        for launch in rec["launches"]:
            nccl = {k: v for k, v in launch["env"].items() if k.startswith("NCCL_IB_")}
            assert nccl == env, (node, launch["name"])
        assert rec["rdma"]["env"] == env


@pytest.mark.parametrize(
    ("second", "second_values", "first_env", "second_env", "note"),
    [
        ("hgx-4ib", {}, {"NCCL_IB_HCA": IB_HCA}, {"NCCL_IB_HCA": IB_HCA}, None),
        ("roce-2x200", {}, {"NCCL_IB_DISABLE": "1"}, {"NCCL_IB_DISABLE": "1"},
         "Qwen3-8B-0: sockets: a has infiniband but b: roce (NCCL cannot mix them in one group)"),
        ("none", {}, {"NCCL_IB_DISABLE": "1"}, {"NCCL_IB_DISABLE": "1"},
         "Qwen3-8B-0: sockets: a has infiniband but b: none (NCCL cannot mix them in one group)"),
        # A member whose facts were not gathered (outside --limit) does not veto a's RDMA; b's
        # own record, computed where its facts are gathered, reads them.
        ("not gathered", {}, {"NCCL_IB_HCA": IB_HCA}, {"NCCL_IB_DISABLE": "1"}, None),
    ],
    ids=["both InfiniBand", "InfiniBand and RoCE", "InfiniBand and none", "a member not gathered"],
)  # fmt: skip
def test_a_multi_node_instance_uses_rdma_only_where_every_member_has_it(
    second: str, second_values: dict[str, Any], first_env: dict[str, str], second_env: dict[str, str], note: str | None
) -> None:
    plan = _plan(["a", "b"], tensor_parallel_size=8, pipeline_parallel_size=2, multinode_backend="native")
    (inst,) = plan["instances"]
    assert (inst["nodes"], inst["executor"]) == (["a", "b"], "native")
    fabric = _fabric({"a": (_ports("hgx-4ib"), {}), "b": (_recorded(second), second_values)})
    for node, env in (("a", first_env), ("b", second_env)):
        rec = records.node_record(plan, node, _settings(), {"fabric": fabric})
        (launch,) = rec["launches"]
        assert {k: v for k, v in launch["env"].items() if k.startswith("NCCL_IB_")} == env
        if node == "a":
            assert rec["rdma"]["notes"] == ([note] if note else [])
            assert rec["rdma"]["container"] == WITH_RDMA  # the devices are there, whatever the group does


def test_ray_gets_the_clusters_nccl_variables() -> None:
    plan = _plan(["a", "b"], tensor_parallel_size=8, pipeline_parallel_size=2, multinode_backend="ray",
                 ray_available=True)  # fmt: skip
    assert plan["instances"][0]["executor"] == "ray"
    both = _fabric({"a": (_ports("hgx-4ib"), {}), "b": (_ports("hgx-4ib"), {})})
    head, worker = (records.node_record(plan, n, _settings(), {"fabric": both}) for n in ("a", "b"))
    for rec in (head, worker):
        assert rec["ray"] is not None and rec["ray"]["nccl_env"] == {"NCCL_IB_HCA": IB_HCA}
        assert rec["rdma"]["container"] == WITH_RDMA
    assert head["launches"][0]["env"]["NCCL_IB_HCA"] == IB_HCA and worker["launches"] == []
    odd = _fabric({"a": (_ports("hgx-4ib"), {}), "b": ([], {})})
    rec = records.node_record(plan, "a", _settings(), {"fabric": odd})
    assert rec["ray"] is not None and rec["ray"]["nccl_env"] == {"NCCL_IB_DISABLE": "1"}
    assert rec["rdma"]["notes"][0] == (
        "Ray cluster vllm-fleet-ray: sockets: a has infiniband but b: none (NCCL cannot mix them in one group)"
    )


def test_the_inventorys_extra_env_wins_over_the_plans_nccl_variables() -> None:
    plan = _plan(["ib"])
    fabric = _fabric({"ib": (_ports("hgx-4ib"), {})})
    rec = records.node_record(plan, "ib", _settings(extra_env={"NCCL_IB_HCA": "mlx5"}), {"fabric": fabric})
    assert {launch["env"]["NCCL_IB_HCA"] for launch in rec["launches"]} == {"mlx5"}


def test_a_record_without_facts_has_no_rdma() -> None:
    """The CLI and plans without gpu_facts (`--tags plan`): no devices known, sockets."""
    rec = records.node_record(_plan(["gpu1"]), "gpu1", _settings(), {})
    assert (rec["rdma"]["kind"], rec["rdma"]["source"], rec["rdma"]["container"]) == ("none", "not detected", WITHOUT)
    assert all(launch["env"]["NCCL_IB_DISABLE"] == "1" for launch in rec["launches"])


def test_the_records_fabric_reads_facts_and_settings() -> None:
    fabric = inventory.fabric
    settings = {"nodes": {"a": _settings(roce_gid_index=3), "b": _settings(rdma="off")}}
    hostvars = {"a": {"gpu_facts_found": {"infiniband": _ports("roce-2x200")}}, "b": {}}
    got = fabric(settings, hostvars, ["a", "b", "c"])
    assert got["a"] == {"infiniband": _ports("roce-2x200"), "rdma": "auto", "rdma_devices": None, "roce_gid_index": 3}
    assert got["b"] == {"infiniband": None, "rdma": "off", "rdma_devices": None, "roce_gid_index": None}
    assert got["c"] == {"infiniband": None, "rdma": None, "rdma_devices": None, "roce_gid_index": None}
