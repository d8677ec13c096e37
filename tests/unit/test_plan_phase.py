"""The plan phase as one Python pass (vllm_fleet/inventory/plan_phase.py, the action
plugins/action/vllm_fleet_plan_phase.py): the same plan, deployment and records as the filters
it replaced in playbooks/plan.yml, from a snapshot of the hosts that holds everything they read,
and files written only when they change."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import filter_plugins
from vllm_fleet.inventory import hostvars as inventory
from vllm_fleet.inventory import plan_phase

pytest.importorskip("ansible")

FOUND = {
    "gpu": "H100-SXM", "gpu_count": 8, "gpu_memory_gib": 79.6, "gpu_free_gib": 79.1, "nvlink": True,
    "nic_gbps": 400.0, "route_to_head": {"interface": "ib0", "address": "10.9.0.2"}, "cpu_cores": 96,
    "infiniband": [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "link_layer": "InfiniBand", "rate_gbps": 400}],
}  # fmt: skip
COMMON = {
    "vllm_fleet_model": "meta-llama/Llama-3.1-70B-Instruct", "vllm_fleet_max_model_len": 8192,
    "vllm_fleet_gateway": True, "vllm_fleet_gateway_host": "gw", "ansible_port": 22, "ray_cluster_gcs_port": 6390,
    "unrelated_variable": "x", "ansible_user": "ops",
}  # fmt: skip


def _hostvars(gathered: bool) -> dict[str, dict[str, Any]]:
    nodes = {
        f"n{i}": {**COMMON, "ansible_host": f"10.0.0.{i}", "vllm_fleet_gpu": "H100-SXM", "vllm_fleet_gpu_count": 8,
                  **({"gpu_facts_found": {**FOUND, "route_to_head": {"interface": "ib0", "address": f"10.9.0.{i}"}}}
                     if gathered else {})}
        for i in range(1, 5)
    }  # fmt: skip
    nodes["n2"]["vllm_fleet_nic_gbps"] = 200
    nodes["n3"]["vllm_fleet_cpu_cores"] = 32
    return {**nodes, "gw": {**COMMON, "ansible_host": "10.0.1.1"}}


class Reads(Mapping[str, Any]):
    """A host's variables that remember which were read."""

    def __init__(self, data: dict[str, Any], seen: set[str]) -> None:
        self._data, self._seen = data, seen

    def __getitem__(self, key: str) -> Any:
        self._seen.add(key)
        return self._data[key]

    def __contains__(self, key: object) -> bool:
        self._seen.add(str(key))
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def _settings(hostvars: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return inventory.settings_of(hostvars, ["n1", "n2", "n3", "n4"], False, "/opt/fleet/playbooks")


@pytest.mark.parametrize("gathered", [False, True], ids=["inventory", "gathered"])
def test_the_snapshot_holds_every_host_variable_the_plan_and_records_read(gathered: bool) -> None:
    """plan_nodes, contexts and the deployment read nothing of a host outside HOST_KEYS, so a
    plan phase that reached no host can read each host once (hostvars.snapshot)."""
    full = _hostvars(gathered)
    settings = _settings(full)
    nodes = list(settings["nodes"])
    seen: set[str] = set()
    watched = {name: Reads(values, seen) for name, values in full.items()}
    planned = inventory.plan_nodes(watched, nodes)
    contexts = inventory.contexts(settings, watched, nodes)
    plan = plan_phase.plan_of(planned, settings)
    whole = plan_phase.deployment_for(plan, settings, watched)
    assert seen and seen <= set(inventory.HOST_KEYS), seen - set(inventory.HOST_KEYS)

    snap = inventory.snapshot(full, [*nodes, *settings["extra_hosts"]])
    assert set(snap) == {*nodes, "gw"} and "unrelated_variable" not in snap["n1"]
    assert inventory.plan_nodes(snap, nodes) == planned
    assert inventory.contexts(settings, snap, nodes) == contexts
    assert plan_phase.deployment_for(plan, settings, snap) == whole
    assert plan_phase.records_for(plan, settings, snap) == plan_phase.records_for(plan, settings, full)


def test_the_python_pass_gives_what_the_filters_gave() -> None:
    """The filters stay for operators and tests: the same settings, nodes and plan (ports
    checked) as the filter chain playbooks/plan.yml ran before. (vllm_fleet_deployment,
    vllm_fleet_records and vllm_fleet_check_ports call plan_phase's own functions.)"""
    filters = filter_plugins()
    full = _hostvars(True)
    settings = filters["vllm_fleet_settings"](full, ["n1", "n2", "n3", "n4"], False, "/opt/fleet/playbooks")
    assert settings == _settings(full)
    nodes = filters["vllm_fleet_plan_nodes"](full, list(settings["nodes"]))
    plan = filters["vllm_fleet_check_ports"](
        filters["vllm_fleet_plan"](nodes, COMMON["vllm_fleet_model"], settings["wishes"]), settings
    )
    assert plan_phase.plan_of(inventory.plan_nodes(full, list(settings["nodes"])), settings) == plan


def test_the_files_are_written_once_and_read_back_only_as_written(tmp_path: Path) -> None:
    full = _hostvars(False)
    settings = {**_settings(full), "artifacts": str(tmp_path / "art")}
    nodes = list(settings["nodes"])
    small = plan_phase.write_inputs(settings, inventory.snapshot(full, nodes), True)
    assert small["stated"] and small["extra_hosts"] == ["gw"] and "nodes" not in small
    inputs = plan_phase.read_back(Path(small["file"]), small["sha"])
    assert inputs["settings"] == json.loads(json.dumps(settings))
    assert os.stat(small["file"]).st_mode & 0o777 == 0o600

    plan = plan_phase.plan_of(inventory.plan_nodes(full, nodes), settings)
    folder = Path(settings["artifacts"])
    changed, table, sha = plan_phase.write_plan(folder, plan, None)
    assert changed and "Plan for meta-llama/Llama-3.1-70B-Instruct" in table
    assert (folder / "plan.md").read_text().startswith("# vllm-fleet plan")
    assert plan_phase.write_plan(folder, plan, None)[0] is False  # the same text: untouched
    work = folder / plan_phase.PLAN_WORK
    assert plan_phase.read_back(work, sha) == json.loads(json.dumps(plan))
    # Check mode: plan.json and plan.md keep the plan that was applied; the change is reported.
    applied = (folder / "plan.json").read_text(), (folder / "plan.md").read_text()
    other = {**plan, "warnings": [*plan.get("warnings", []), "another plan"]}
    changed, _, other_sha = plan_phase.write_plan(folder, other, None, check=True)
    assert changed and ((folder / "plan.json").read_text(), (folder / "plan.md").read_text()) == applied
    assert plan_phase.read_back(work, other_sha)["warnings"][-1] == "another plan"
    assert plan_phase.write_plan(folder, plan, None, check=True)[0] is False
    work.write_text("{}\n")
    with pytest.raises(inventory.InventoryError, match=r"changed during this run.*fix: run one site\.yml at a time"):
        plan_phase.read_back(work, sha)

    by_node = plan_phase.records_for(plan, settings, full)
    (folder / "records").mkdir()
    (folder / "records" / "gone.json").write_text("{}\n")  # a node that left the inventory
    assert plan_phase.write_records(folder, by_node)
    assert sorted(p.name for p in (folder / "records").iterdir()) == [f"{n}.json" for n in nodes]
    assert json.loads(plan_phase.record_path(folder, "n2").read_text()) == json.loads(json.dumps(by_node["n2"]))
    assert os.stat(folder / "records").st_mode & 0o777 == 0o700
    assert plan_phase.write_records(folder, by_node) is False
    with pytest.raises(inventory.InventoryError, match="'rack1/n1': this inventory name cannot name its record file"):
        plan_phase.record_path(folder, "rack1/n1")

    whole = plan_phase.deployment_for(plan, settings, full)
    wrote, carried = plan_phase.write_deployment(folder, whole)
    assert wrote and json.loads((folder / "deployment.json").read_text()) == json.loads(json.dumps(whole))
    assert "targets" not in carried["monitoring"] and "targets" not in carried["verify"]
    assert carried["gateway"] == whole["gateway"] and carried["file"] == str(folder / "deployment.json")
    assert whole["monitoring"]["targets"] and whole["verify"]["targets"]


def test_the_ports_check_still_finds_a_clash_with_the_plan_indexed_once() -> None:
    """check_plan_ports and the records index the plan's instances by node once (at 1,000 nodes
    the per-node scans were 0.7 s of the plan phase): a gateway on a node's API port is still
    named, on that node, with the variable to move."""
    full = _hostvars(False)
    settings = _settings(full)
    nodes = list(settings["nodes"])
    planned = inventory.plan_nodes(full, nodes)
    plan = plan_phase.plan_of(planned, settings)
    assert plan["instances"][0]["head_node"] == "n1" and plan["instances"][0]["port"] == 8000
    clash = {
        **settings,
        "nodes": {n: {**s, "gateway_host": "n1", "gateway_port": 8000} for n, s in settings["nodes"].items()},
    }
    with pytest.raises(inventory.InventoryError, match=r"n1.*vllm_fleet_gateway_port"):
        plan_phase.plan_of(planned, clash)


class _Lazy(Mapping[str, Any]):
    """A mapping that is not a dict, as Ansible's lazy containers are."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def test_plain_converts_a_shared_container_once() -> None:
    # Every node's context holds the one fabric dict; one copy per node made the records step
    # quadratic in the cluster's size (issue 48's bench: 309 MiB instead of 104 at 1,000 hosts).
    fabric = _Lazy({f"node{i}": _Lazy({"ports": [{"rate": 400}]}) for i in range(3)})
    contexts = {f"node{i}": _Lazy({"fabric": fabric, "role_vars": {"k": ("a", "b")}}) for i in range(3)}
    out = inventory.plain(contexts)
    assert out["node0"]["fabric"] is out["node1"]["fabric"] is out["node2"]["fabric"]
    assert type(out["node0"]["fabric"]) is dict and type(out["node0"]["fabric"]["node1"]) is dict
    assert out["node1"]["fabric"]["node2"] == {"ports": [{"rate": 400}]}
    assert out["node0"]["role_vars"] == {"k": ["a", "b"]}
    assert json.loads(json.dumps(out)) == out
