"""The declared inventory interface (vllm_fleet/inventory/interface.py): types, defaults,
one-line errors naming the field, deployment-wide agreement, typo warnings, and
the README's inventory table kept equal to the declarations."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.conftest import ROOT
from vllm_fleet.accounting.base import CURRENT_VLLM
from vllm_fleet.errors import PlanError
from vllm_fleet.inventory import interface


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [
        ("port", 9000, 9000),
        ("port", "8000", 8000),  # -e vllm_fleet_port=8000
        ("gpu_count", " 8 ", 8),
        ("build_model", "true", True),  # -e vllm_fleet_build_model=true
        ("build_model", "no", False),
        ("build_model", True, True),
        ("nvlink", "False", False),
        ("gpu_memory_utilization", "0.85", 0.85),
        ("gpu_memory_gib", 2, 2.0),
        ("nic_gbps", "25", 25.0),
        ("gateway", True, "true"),  # YAML true for a choice that spells true
        ("gateway", "FALSE", "false"),
        ("runtime", "Systemd", "systemd"),
        ("multinode_backend", "native", "native"),
        ("model", "Qwen/Qwen3-8B", "Qwen/Qwen3-8B"),
        ("vllm_version", "0.31.1", "0.31.1"),
        ("extra_args", ["--seed", 7], ["--seed", "7"]),
        ("extra_env", {"VLLM_LOGGING_LEVEL": "DEBUG", "N": 2}, {"VLLM_LOGGING_LEVEL": "DEBUG", "N": "2"}),
    ],
    ids=lambda v: repr(v) if not isinstance(v, str) else v,
)
def test_resolve_types_good_values(name: str, raw: Any, expected: Any) -> None:
    got = interface.resolve({f"vllm_fleet_{name}": raw})[name]
    assert got == expected
    assert type(got) is type(expected)  # "8000" -> int 8000, "true" -> bool True, 2 -> float 2.0


def test_resolve_fills_every_default() -> None:
    got = interface.resolve({})
    assert set(got) == {v.name for v in interface.VARIABLES}
    assert {k: got[k] for k in ("port", "runtime", "multinode_backend", "ray", "gateway", "gateway_port")} == {
        "port": 8000,
        "runtime": "container",
        "multinode_backend": "auto",
        "ray": "auto",
        "gateway": "auto",
        "gateway_port": 8080,
    }
    assert (got["vllm_version"], got["master_port"], got["dp_rpc_port"]) == (CURRENT_VLLM, 29501, 13345)
    assert (got["model"], got["gpu_count"], got["nvlink"], got["extra_args"], got["extra_env"]) == (
        None, None, None, [], {},
    )  # fmt: skip
    assert (got["prepare_driver"], got["build_model"], got["api_key"]) == (True, False, False)


@pytest.mark.parametrize("empty", [None, "", "  ", "None"], ids=["none", "empty", "blank", "None-string"])
def test_unset_values_take_the_default(empty: Any) -> None:
    got = interface.resolve({"vllm_fleet_port": empty, "vllm_fleet_runtime": empty, "vllm_fleet_build_model": empty})
    assert (got["port"], got["runtime"], got["build_model"]) == (8000, "container", False)


def test_defaults_are_not_shared_between_calls() -> None:
    first = interface.resolve({})
    first["extra_args"].append("--seed")
    first["extra_env"]["X"] = "1"
    again = interface.resolve({})
    assert (again["extra_args"], again["extra_env"]) == ([], {})


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("gpu_count", True, "True is a boolean, not a number"),
        ("port", False, "False is a boolean, not a number"),
        ("port", "abc", "'abc' is not an integer"),
        ("gpu_count", 2.5, "2.5 is not an integer"),
        ("nic_gbps", "fast", "'fast' is not a number"),
        ("gpu_memory_utilization", float("nan"), "nan is not a finite number"),
        ("nic_gbps", "inf", "'inf' is not a finite number"),
        ("gpu_memory_gib", float("-inf"), "-inf is not a finite number"),
        ("port", 70000, "70000 is above 65535"),
        ("gateway_port", "0", "0 is below 1"),
        ("gpu_memory_utilization", 1.5, "1.5 is above 1"),
        ("build_model", "maybe", "'maybe' is not true or false"),
        ("runtime", "podman", "must be one of ['container', 'systemd'], got 'podman'"),
        ("ray", True, "must be one of ['auto', 'always'], got True"),
        ("served_model_name", "tiny\nllama", "holds a newline or NUL"),
        ("address", "10.0.0.1\r", "holds a newline or NUL"),
        ("model", ["a", "b"], "must be a single value, got a list"),
        ("gateway_host", {"host": "n1"}, "must be a single value, got a dict"),
        ("extra_env", ["A=1"], "must be a mapping, got ['A=1']"),
        ("extra_args", "--seed 1", "must be a list of strings, got '--seed 1'"),
        ("extra_args", [["--seed"]], "must be a list of strings"),
    ],
    ids=lambda v: repr(v) if not isinstance(v, str) else v.replace("\n", "\\n").replace("\r", "\\r"),
)
def test_resolve_bad_values_name_the_field(name: str, raw: Any, message: str) -> None:
    with pytest.raises(PlanError, match=re.escape(f"vllm_fleet_{name}: {message}")) as err:
        interface.resolve({f"vllm_fleet_{name}": raw})
    assert err.value.field == f"vllm_fleet_{name}"
    assert "\n" not in str(err.value) and "; fix: " in str(err.value)


@pytest.mark.parametrize("var", [v for v in interface.VARIABLES if v.default not in (None, [], {})], ids=str)
def test_every_default_passes_its_own_type(var: interface.Var) -> None:
    assert interface.resolve({var.full: var.default})[var.name] == var.default
    if var.type == "choice":
        assert var.default in var.choices


def test_declarations_are_well_formed() -> None:
    names = [v.full for v in interface.VARIABLES]
    assert len(names) == len(set(names)) == len(interface.BY_NAME)
    kinds = {"str", "int", "float", "bool", "list", "dict", "json", "choice", "models"}
    assert {v.type for v in interface.VARIABLES} <= kinds
    assert {v.scope for v in interface.VARIABLES} == {"all", "node", "all/node"}
    assert all(bool(v.choices) for v in interface.VARIABLES if v.type == "choice")
    assert all(v.type in ("choice", "int") for v in interface.VARIABLES if v.choices)  # an int: max_lora_rank
    assert not set(names) & interface.DERIVED


def test_secrets_are_presence_booleans_never_values() -> None:
    got = interface.resolve({"vllm_fleet_api_key": "s3cret-key", "vllm_fleet_hf_token": ""})
    assert (got["api_key"], got["hf_token"]) == (True, False)
    assert "s3cret-key" not in repr(got)
    assert {v.name for v in interface.VARIABLES if v.secret} == {"api_key", "hf_token"}


@pytest.mark.parametrize("raw", ["s3cret\nkey", ["s3cret"], {"s3cret": "key"}], ids=["newline", "list", "dict"])
def test_a_bad_secret_is_named_but_never_shown(raw: Any) -> None:
    with pytest.raises(PlanError, match=r"^vllm_fleet_api_key: ") as err:
        interface.resolve({"vllm_fleet_api_key": raw})
    assert "s3cret" not in str(err.value)


@pytest.mark.parametrize(
    ("first", "second", "message"),
    [
        ({"vllm_fleet_port": 8000}, {"vllm_fleet_port": "9000"}, "vllm_fleet_port: differs between n1 (8000) and n2"),
        ({"vllm_fleet_model": "a"}, {}, "vllm_fleet_model: differs between n1 ('a') and n2 (None)"),
        ({"vllm_fleet_api_key": "k"}, {}, "vllm_fleet_api_key: differs between n1 (True) and n2 (False)"),
        ({"vllm_fleet_gateway": True}, {"vllm_fleet_gateway": "auto"}, "vllm_fleet_gateway: differs"),
    ],
    ids=["port", "model-unset-on-one", "secret-on-one", "gateway"],
)  # fmt: skip
def test_check_nodes_refuses_deployment_wide_values_that_differ(
    first: dict[str, Any], second: dict[str, Any], message: str
) -> None:
    per_node = {"n1": interface.resolve(first), "n2": interface.resolve(second), "n3": interface.resolve(second)}
    with pytest.raises(PlanError, match=re.escape(message) + ".*fix: set it once for the whole deployment"):
        interface.check_nodes(per_node)


@pytest.mark.parametrize(
    "per_node_vars",
    [
        {"vllm_fleet_gpu_count": 8},  # node scope
        {"vllm_fleet_runtime": "systemd", "vllm_fleet_extra_env": {"A": "1"}},  # all/node scope
        {"vllm_fleet_port": "8000"},  # the same value, written differently
    ],
    ids=["node", "all-node", "same-value"],
)
def test_check_nodes_accepts_per_node_values(per_node_vars: dict[str, Any]) -> None:
    interface.check_nodes({"n1": interface.resolve({}), "n2": interface.resolve(per_node_vars)})


NOT = " is not a vllm-fleet variable"


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["vllm_fleet_gpu_cout"], [f"vllm_fleet_gpu_cout{NOT}; did you mean vllm_fleet_gpu_count?"]),
        (["vllm_fleet_runtim", "vllm_fleet_runtim"], [f"vllm_fleet_runtim{NOT}; did you mean vllm_fleet_runtime?"]),
        (["vllm_fleet_zzzzzzzzzzzzzzzzzz"], [f"vllm_fleet_zzzzzzzzzzzzzzzzzz{NOT}; see the README's inventory table"]),
        (["vllm_fleet_gpu_count", "vllm_fleet_api_key", "vllm_fleet_ray"], []),  # declared
        (["vllm_fleet_plan", "vllm_fleet_node", "vllm_fleet_launches"], []),  # derived facts
        (["vllm_fleet_doctor_port", "vllm_fleet_doctor_listen_seconds"], []),  # doctor.yml's own knobs
        (["ansible_host", "ray_cluster_name", "gpu_count"], []),  # not ours
    ],
    ids=["typo", "typo-once", "no-close-name", "declared", "derived", "doctor", "other-prefixes"],
)  # fmt: skip
def test_unknown_names_get_the_closest_real_one(names: list[str], expected: list[str]) -> None:
    assert interface.unknown(names) == expected


@pytest.mark.parametrize(
    ("raw", "role_vars", "expected_ray"),
    [
        ({}, None, True),  # container runtime, derived image (the role's default) has Ray
        ({"vllm_fleet_runtime": "systemd"}, None, False),
        ({}, {"serving_image_mode": "pull"}, False),
    ],
    ids=["container-derived", "systemd", "container-pulled-image"],
)
def test_wishes_from_settings(raw: dict[str, Any], role_vars: dict[str, Any] | None, expected_ray: bool) -> None:
    settings = interface.resolve({**raw, "vllm_fleet_max_model_len": "4096", "vllm_fleet_api_key": "k"})
    got = interface.wishes(settings, role_vars)
    assert got["ray_available"] is expected_ray
    assert (got["max_model_len"], got["port"], got["multinode_backend"]) == (4096, 8000, "auto")
    assert "tensor_parallel_size" not in got and "api_key" not in got and "runtime" not in got


def _inventory_section() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Inventory format\n", 1)[1].split("\n## ", 1)[0]
    return section.splitlines()


def test_markdown_rows_are_one_table_row_per_variable() -> None:
    rows = interface.markdown_rows()
    assert len(rows) == len(interface.VARIABLES)
    assert all(row.count("|") == 6 for row in rows)  # no stray pipe in a meaning
    assert "| `vllm_fleet_port` | int | `8000` | all | first vLLM port on each node |" in rows
    assert "| `vllm_fleet_build_model` | bool | `false` | all |" in next(r for r in rows if "build_model`" in r)


def test_readme_inventory_table_is_the_generated_one() -> None:
    text = (ROOT / "README.md").read_text()
    start = text.index(interface.README_BEGIN)
    end = text.index(interface.README_END) + len(interface.README_END)
    assert text[start:end] == interface.readme_table(), "README.md's inventory table is out of date: run make docs"


def test_readme_inventory_table_lists_exactly_the_declared_variables() -> None:
    lines = _inventory_section()
    assert "| variable | type | default | scope | meaning |" in lines
    missing = [row for row in interface.markdown_rows() if row not in lines]
    assert missing == [], "README.md's inventory table is out of date; paste interface.markdown_rows()"
    named = [re.match(r"\| `(vllm_fleet_\w+)` \|", line) for line in lines]
    listed = [m.group(1) for m in named if m]
    assert sorted(listed) == sorted(interface.BY_NAME), "README.md lists a variable that is not declared"
