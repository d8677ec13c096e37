from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.conftest import ROOT
from vllm_fleet import deploy, interface

pytest.importorskip("ansible")


def _plugin() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_fleet_filter", ROOT / "plugins/filter/vllm_fleet.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_filters_return_the_cli_structure() -> None:
    filters = _plugin().FilterModule().filters()
    nodes = [{"name": "a800-node", "gpu": "A800", "gpu_count": 8}, {"name": "l20-node", "gpu": "L20", "gpu_count": 8}]
    plan = filters["vllm_fleet_plan"](nodes, "deepseek-ai/DeepSeek-R1", {"max_model_len": "32768", "port": 9000})
    assert plan["instances"][0]["layer_partition"] and plan["instances"][0]["port"] == 9000
    assert filters["vllm_fleet_instances_on"](plan, "l20-node") == plan["instances"]
    assert "Plan for deepseek-ai/DeepSeek-R1" in filters["vllm_fleet_plan_table"](plan)
    est = filters["vllm_fleet_estimate"]("Qwen/Qwen3-8B", 79.2, {"max_model_len": 8192})
    assert est["fits"]


def test_filter_errors_carry_the_planners_reason(tmp_path: Path) -> None:
    from ansible.errors import AnsibleFilterError

    filters = _plugin().FilterModule().filters()
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
    settings = _plugin().vllm_fleet_settings(hostvars, ["n1"])
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
                if copied and deploy.is_secret_role_var(name) and not name.endswith("_tls_key"):  # a path
                    named.add(name)
                    assert opt.get("no_log"), f"{spec}: {name} looks like a secret but is not no_log"
    assert set(SECRETS) - {"vllm_server_extra_password"} == named <= deploy.SECRET_ROLE_VARS


def test_the_api_key_from_anywhere_opens_the_gateway_and_only_its_presence_is_kept() -> None:
    """$VLLM_API_KEY (not an inventory value) counts: the playbook passes whether there is a key."""
    hostvars = {"n1": {"vllm_fleet_model": "Qwen/Qwen3-8B"}}
    plugin = _plugin()
    assert plugin.vllm_fleet_settings(hostvars, ["n1"])["nodes"]["n1"]["api_key"] is False
    assert plugin.vllm_fleet_settings(hostvars, ["n1"], True)["nodes"]["n1"]["api_key"] is True
