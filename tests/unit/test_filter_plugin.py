from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.conftest import ROOT, filter_plugins, load_script
from vllm_fleet.deploy import deployment, records
from vllm_fleet.inventory import interface

pytest.importorskip("ansible")


def _plugin() -> ModuleType:
    return load_script(ROOT / "plugins/filter/vllm_fleet_plan.py")


def test_filters_return_the_cli_structure() -> None:
    filters = filter_plugins()
    nodes = [{"name": "a800-node", "gpu": "A800", "gpu_count": 8}, {"name": "l20-node", "gpu": "L20", "gpu_count": 8}]
    plan = filters["vllm_fleet_plan"](nodes, "deepseek-ai/DeepSeek-R1", {"max_model_len": "32768", "port": 9000})
    assert plan["instances"][0]["layer_partition"] and plan["instances"][0]["port"] == 9000
    assert "Plan for deepseek-ai/DeepSeek-R1" in filters["vllm_fleet_plan_table"](plan)


def test_filter_errors_carry_the_planners_reason(tmp_path: Path) -> None:
    from ansible.errors import AnsibleFilterError

    filters = filter_plugins()
    with pytest.raises(AnsibleFilterError, match=r"nodes\[0\] \(x\)\.gpu: unknown GPU 'Q1'"):
        filters["vllm_fleet_plan"]([{"name": "x", "gpu": "Q1", "gpu_count": 1}], "Qwen/Qwen3-8B")
    with pytest.raises(AnsibleFilterError, match=r"unknown wish\(es\) \['colour'\]"):
        filters["vllm_fleet_plan"]([{"name": "x", "gpu": "H100", "gpu_count": 1}], "Qwen/Qwen3-8B", {"colour": 1})


def test_the_plugin_puts_its_checkout_first() -> None:
    """A checkout's plugin plans with the checkout's own package, not an installed copy."""
    saved = list(sys.path)
    try:
        sys.path.insert(0, "/nonexistent/site-packages")
        _plugin()
        assert sys.path[0] == str(ROOT)
    finally:
        sys.path[:] = saved


SECRETS = {
    "ray_cluster_auth_token": "ray-secret-0123456789abcdef0123456789",
    "llm_gateway_api_key": "gw-secret",
    "vllm_server_api_key": "vs-secret",
    "vllm_server_hf_token": "hf-secret",
    "model_cache_hf_token": "mc-secret",
    "vllm_server_extra_password": "undeclared-secret",  # named like a secret, declared nowhere
}


def test_settings_never_copy_a_secret_role_variable() -> None:
    """vllm_fleet_settings is a fact (Ansible prints facts at -v): the role variables it keeps
    for the planner hold no secret, whether a role declares it no_log or its name says so."""
    hostvars = {
        "n1": {"vllm_fleet_model": "Qwen/Qwen3-8B", "ray_cluster_gcs_port": 6390, "ray_cluster_auth": True, **SECRETS}
    }
    settings = filter_plugins()["vllm_fleet_settings"](hostvars, ["n1"])
    kept = settings["role_vars"]["n1"]
    assert kept == {"ray_cluster_gcs_port": 6390, "ray_cluster_auth": True}
    assert not any(value in repr(settings) for value in SECRETS.values())


def test_every_secret_looking_role_option_is_no_log() -> None:
    """The roles' argument specs are where a secret is declared: every option of the roles whose
    variables the planner copies that is named like a secret is no_log, and the planner's list
    of secret role variables is read from them."""
    named = set()
    for spec in ROOT.glob("roles/*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(spec.read_text())["argument_specs"].values():
            for name, opt in (entry.get("options") or {}).items():
                copied = name.startswith(interface.ROLE_PREFIXES)  # the planner copies these from hostvars
                if copied and records.is_secret_role_var(name) and not name.endswith("_tls_key"):  # a path
                    named.add(name)
                    assert opt.get("no_log"), f"{spec}: {name} looks like a secret but is not no_log"
    assert set(SECRETS) - {"vllm_server_extra_password"} == named <= records.SECRET_ROLE_VARS


def test_the_api_key_from_anywhere_opens_the_gateway_and_only_its_presence_is_kept() -> None:
    """$VLLM_API_KEY (not an inventory value) counts: the playbook passes whether there is a key."""
    hostvars = {"n1": {"vllm_fleet_model": "Qwen/Qwen3-8B"}}
    settings = filter_plugins()["vllm_fleet_settings"]
    assert settings(hostvars, ["n1"])["nodes"]["n1"]["api_key"] is False
    assert settings(hostvars, ["n1"], True)["nodes"]["n1"]["api_key"] is True


def test_the_planners_nodes_take_the_inventory_first_then_what_gpu_facts_found() -> None:
    """The merge of stated and detected values is the planner's (it was a set_fact per node in
    plan.yml): the inventory wins, memory/NVLink/free memory only from GPUs actually seen, the
    route's address and interface, and the cores counted there reach the record's context."""
    filters = filter_plugins()
    found = {
        "gpu": "H100-SXM", "gpu_count": 8, "gpu_memory_gib": 79.6, "gpu_free_gib": 79.1, "nvlink": True,
        "nic_gbps": 400.0, "route_to_head": {"interface": "ib0", "address": "10.9.0.2"}, "cpu_cores": 96,
        "infiniband": [],
    }  # fmt: skip
    hostvars = {
        "a": {"gpu_facts_found": found, "vllm_fleet_nic_gbps": 100, "ansible_host": "192.168.1.2"},
        "b": {"gpu_facts_found": {**found, "gpu": None, "gpu_count": 0}, "vllm_fleet_gpu": "L40S",
              "vllm_fleet_gpu_count": 4, "ansible_host": "192.168.1.3"},
        "c": {"vllm_fleet_gpu": "A100-80G", "vllm_fleet_gpu_count": 2},
    }  # fmt: skip
    a, b, c = filters["vllm_fleet_plan_nodes"](hostvars, ["a", "b", "c"])
    assert (a["gpu"], a["gpu_count"], a["gpu_memory_gib"], a["nvlink"]) == ("H100-SXM", 8, 79.6, True)
    assert a["nic_gbps"] == 100  # stated: wins over the 400 detected
    assert (a["address"], a["interface"]) == ("10.9.0.2", "ib0")
    # No GPU seen: the inventory's GPU with the catalog's memory, never the facts' memory.
    assert (b["gpu"], b["gpu_count"], b["gpu_memory_gib"], b["nvlink"]) == ("L40S", 4, None, None)
    # Not gathered (--tags plan): the inventory alone; the address falls back to the name.
    assert (c["address"], c["interface"], c["nic_gbps"]) == ("c", None, None)
    with pytest.raises(Exception, match="Host d reports no NVIDIA GPU"):
        filters["vllm_fleet_plan_nodes"]({"d": {"gpu_facts_found": {**found, "gpu": None, "gpu_count": 0}}}, ["d"])

    model = {"vllm_fleet_model": "meta-llama/Llama-3.1-8B-Instruct"}
    settings = filters["vllm_fleet_settings"]({n: {**h, **model} for n, h in hostvars.items()}, ["a", "b", "c"])
    contexts = filters["vllm_fleet_contexts"](settings, hostvars)
    assert (contexts["a"]["detected_cores"], contexts["c"]["detected_cores"]) == (96, None)
    assert contexts["a"]["host"] == {"address": "10.9.0.2", "interface": "ib0", "gpu_count": 8}
    assert contexts["a"]["fabric"] == contexts["b"]["fabric"] and set(contexts["a"]["fabric"]) == {"a", "b", "c"}


def test_the_serve_batches_follow_what_each_node_last_applied() -> None:
    filters = filter_plugins()
    rolling = {"enabled": True, "batch": 1, "reason": "2 replicas: 1 node(s) at a time, drained first"}
    stale = {"current": False, "reason": "launch vllm-0: argv changed"}
    hostvars = {
        "a": {"__vllm_server_applied": stale},
        "b": {"__vllm_server_applied": {"current": True, "reason": ""}},
        "c": {"__vllm_server_applied": {"current": False, "reason": "no record of an earlier run"}},
        "d": {"__vllm_server_applied": {"skipped": True}},
        "e": {},
    }
    got = filters["vllm_fleet_rolling_now"](hostvars, list(hostvars), rolling)
    assert (got["serial"], got["nodes"]) == (1, ["a"]) and got["message"].startswith("Rolling restart of a: ")
    first = filters["vllm_fleet_rolling_now"]({"c": hostvars["c"]}, ["c"], rolling)
    assert (first["serial"], first["nodes"]) == ("100%", [])
    off = filters["vllm_fleet_rolling_now"](hostvars, list(hostvars), {**rolling, "enabled": False})
    assert (off["serial"], off["nodes"]) == ("100%", [])


def test_a_multi_node_replica_restarts_with_all_its_nodes_in_one_batch() -> None:
    """A PP=2 group on node1+node2 and a replica on node3 (the faults bench's deployment): a changed
    setting restarts the group first, both nodes in one batch (the head drained), then node3; before,
    any multi-node replica turned rolling off and every node restarted at once (the bench's 22 failed
    requests). A change on the member alone still takes its head along."""
    filters = filter_plugins()
    rolling = {"enabled": True, "batch": 1, "reason": "2 replicas"}
    stale = {"__vllm_server_applied": {"current": False, "reason": "launch vllm-tiny-1: environment changed"}}
    current = {"__vllm_server_applied": {"current": True, "reason": ""}}

    def node(applied: dict[str, object], *instances: str) -> dict[str, object]:
        return {**applied, "vllm_fleet_node": {"launches": [{"instance": i} for i in instances]}}

    every = {"node1": node(stale, "tiny-1"), "node2": node(stale, "tiny-1"), "node3": node(stale, "tiny-0")}
    got = filters["vllm_fleet_rolling_now"](every, list(every), rolling)
    assert got["serial"] == [2, 1, 1] and got["order"] == ["node1", "node2", "node3"], got
    assert got["message"].startswith("Rolling restart of node1+node2, node3: "), got["message"]
    member = {"node1": node(current, "tiny-1"), "node2": node(stale, "tiny-1"), "node3": node(current, "tiny-0")}
    got = filters["vllm_fleet_rolling_now"](member, list(member), rolling)
    assert (got["serial"], got["nodes"], got["order"]) == ([2, 1], ["node1", "node2"], ["node1", "node2", "node3"])
    replica = {"node3": node(stale, "tiny-0"), "node1": node(current, "tiny-1"), "node2": node(current, "tiny-1")}
    got = filters["vllm_fleet_rolling_now"](replica, ["node1", "node2", "node3"], rolling)
    assert (got["serial"], got["nodes"], got["order"]) == (1, ["node3"], ["node3", "node1", "node2"])


@pytest.mark.parametrize(
    ("instances", "units"),
    [
        ({"a": ["x-0"], "b": ["x-0"], "c": ["y-0"]}, [["a", "b"], ["c"]]),
        ({"a": ["p"], "b": ["q"], "c": ["p", "q"], "d": []}, [["a", "b", "c"], ["d"]]),  # c bridges two groups
        ({"a": ["x-0", "y-0"], "b": ["z-0"]}, [["a"], ["b"]]),  # two single-node replicas on one node
    ],
)
def test_nodes_sharing_an_instance_restart_together(instances: dict[str, list[str]], units: list[list[str]]) -> None:
    assert deployment.restart_units(instances) == units
