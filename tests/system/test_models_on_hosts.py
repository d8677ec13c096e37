"""Several models from one inventory (issue 15): ``vllm_fleet_models`` lists two tiny
models of different sizes and names (alpha: 4 layers, beta: 8), the planner gives each a
test host (node1, node2), and the gateway on node3 routes every request by the model
its body names. One site.yml run, then on that deployment: each model answers through
the one gateway endpoint by its name (plain and streamed), an unknown name gets vLLM's
own 404, ``/v1/models`` lists both, the allocation table in plan.md matches what runs on
each host, a second run changes nothing, and teardown leaves no unit.

The gateway runs with ``vllm_fleet_gateway_balancer: vllm-router``: nginx checks the key and
routes by name to one vLLM router per model on node3's loopback (vllm-router from the
hosts' wheel folder), whose workers the gateway's watcher set: each router lists exactly
its model's replica, listens on loopback only, and holds the replicas' key in no command
line. (nginx's own least_conn per model is what tests/integration/test_gateway_routing.py
runs with real nginx and njs.)"""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT, failures, run_playbook, run_site
from tests.hosts.common import SSH_OPTIONS
from tests.hosts.nodes import ssh_argv
from tests.system.conftest import Hosts
from tests.system.test_site_on_hosts import _recap

API_KEY = "models-test-key-41c9"
MODELS = [
    {"model": str(ROOT / "inventories/local/files/tiny-llama"), "served_model_name": "alpha", "max_model_len": 1024},
    {"model": str(ROOT / "tests/system/files/tiny-llama-8"), "served_model_name": "beta", "max_model_len": 1024},
]


def _inventory(path: Path, hosts: Hosts) -> Path:
    servers, gateway = hosts.nodes[:2], hosts.nodes[2]
    inventory = {
        "all": {
            "hosts": {"localhost": {"ansible_connection": "local"}, gateway.name: {"ansible_host": gateway.address}},
            "children": {
                "vllm_nodes": {
                    "hosts": {
                        n.name: {
                            "ansible_host": n.address,
                            "vllm_fleet_gpu": "cpu",
                            "vllm_fleet_gpu_count": 1,
                            "vllm_fleet_gpu_memory_gib": 1,
                            # One core each: the hosts share this machine's two.
                            "vllm_fleet_extra_env": {"VLLM_CPU_OMP_THREADS_BIND": str(i)},
                        }
                        for i, n in enumerate(servers)
                    }
                }
            },
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": hosts.key,
                "ansible_ssh_common_args": SSH_OPTIONS,
                "vllm_fleet_models": MODELS,
                "vllm_fleet_build_model": True,
                "vllm_fleet_prepare_model": False,
                "vllm_fleet_connect_timeout": 5,
                "vllm_fleet_runtime": "systemd",
                "vllm_fleet_gateway_host": gateway.name,
                "vllm_fleet_api_key": API_KEY,
                # Prometheus is test_serve_on_hosts' (about a minute more here for nothing new).
                "vllm_fleet_monitoring": False,
                "vllm_fleet_enforce_eager": True,
                "vllm_fleet_gateway_balancer": "vllm-router",
                "llm_gateway_router_pip_args": ["--no-index", "--find-links", "/opt/wheels"],
                "vllm_server_installer": "uv",
                "vllm_server_pip_args": ["--no-index", "--find-links", "/opt/wheels"],
            },
        }
    }
    path.write_text(yaml.safe_dump(inventory))
    return path


def _post(url: str, body: dict[str, Any], key: str | None = API_KEY) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _changed_tasks(stdout: str) -> list[str]:
    """The tasks a run reported changed, with the host."""
    task, out = "", []
    for line in stdout.splitlines():
        if line.startswith("TASK ["):
            task = line
        elif line.startswith("changed: ["):
            out.append(f"{task} {line}")
    return out


def _on(node: str, command: str) -> str:
    done = subprocess.run(ssh_argv(node, command), capture_output=True, text=True, timeout=60, check=False)
    return done.stdout


def test_two_models_behind_one_gateway_routed_by_name(test_hosts: Hosts, tmp_path: Path) -> None:
    inventory = _inventory(tmp_path / "hosts.yml", test_hosts)
    artifacts = tmp_path / "artifacts"
    first = run_site(inventory, artifacts, timeout=1500)
    assert first.returncode == 0, failures(first)
    assert API_KEY not in first.stdout + first.stderr, "the API key was logged"

    # The allocation the plan printed is what runs: alpha on node1, beta on node2.
    plan = json.loads((artifacts / "plan.json").read_text())
    placed = {i["served_model_name"]: (i["nodes"], i["endpoint"]) for i in plan["instances"]}
    node1, node2, node3 = test_hosts.nodes
    assert placed == {"alpha": ([node1.name], f"{node1.address}:8000"), "beta": ([node2.name], f"{node2.address}:8000")}
    table = (artifacts / "plan.md").read_text()
    assert "Allocation of 2 model(s) on 2 node(s)" in table and "alpha-0" in table and "beta-0" in table, table
    for node, unit in ((node1, "vllm-alpha-0"), (node2, "vllm-beta-0")):
        active = _on(node.name, f"systemctl is-active vllm-fleet-{unit}.service").strip()
        assert active == "active", f"{node.name}: {unit} is {active!r}"

    # verify probed each model through the gateway by its name, and each instance directly.
    rows = json.loads((artifacts / "verify.json").read_text())
    assert sorted((r["via"], r["model"]) for r in rows) == [
        ("direct", "alpha"), ("direct", "beta"), ("gateway", "alpha"), ("gateway", "beta"),
    ], rows  # fmt: skip
    assert all(r["ok"] for r in rows), rows
    for row in rows:
        assert row["kv"]["verdict"] == "match", row  # each model's KV tokens within 5 % of its plan

    # One vllm-router per model on node3's loopback, each with its model's replica as its only worker.
    assert {r["layout"] for r in rows if r["via"] == "gateway"} == {"1 instance(s), vllm-router cache_aware"}, rows
    listening = _on(node3.name, "ss -ltnH")
    for index, (name, node) in enumerate((("alpha", node1), ("beta", node2))):
        unit = f"vllm-fleet-gateway-router-{index}.service"
        assert _on(node3.name, f"systemctl is-active {unit}").strip() == "active", unit
        assert f"127.0.0.1:{8200 + index} " in listening and f"0.0.0.0:{8200 + index} " not in listening, listening
        workers = json.loads(_on(node3.name, f"curl -s -m 5 http://127.0.0.1:{8200 + index}/list_workers"))
        assert workers == {"urls": [f"http://{node.address}:8000"]}, (name, workers)
        pid = _on(node3.name, f"systemctl show -p MainPID --value {unit}").strip()
        assert API_KEY not in _on(node3.name, f"tr '\\0' ' ' < /proc/{pid}/cmdline"), "the key is on argv"
        assert API_KEY not in _on(node3.name, f"systemctl cat {unit}")
    assert _on(node3.name, "stat -c '%a %U' /etc/vllm-fleet/gateway/router.key").split() == ["600", "root"]

    gateway = f"http://{node3.address}:8080"
    # Each model by its name through the one endpoint; vLLM's answer names the model that served it.
    for name in ("alpha", "beta"):
        status, raw = _post(f"{gateway}/v1/completions", {"model": name, "prompt": "Hello", "max_tokens": 4})
        assert status == 200, raw
        assert json.loads(raw)["model"] == name
    status, raw = _post(
        f"{gateway}/v1/chat/completions",
        {"model": "beta", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True},
    )
    assert status == 200 and raw.count(b"data: ") >= 2 and b"[DONE]" in raw, raw[:400]

    # An unknown model: vLLM's own 404 from the gateway; no key: 401; a body without JSON: 400.
    status, raw = _post(f"{gateway}/v1/completions", {"model": "gamma", "prompt": "Hello"})
    assert status == 404, raw
    assert json.loads(raw)["error"] == {
        "message": "The model `gamma` does not exist.", "type": "NotFoundError", "param": "model", "code": 404,
    }  # fmt: skip
    assert _post(f"{gateway}/v1/completions", {"model": "alpha", "prompt": "x"}, key=None)[0] == 401
    request = urllib.request.Request(
        f"{gateway}/v1/completions", data=b"not json", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    try:
        urllib.request.urlopen(request, timeout=30)
        raise AssertionError("a body that is not JSON was routed")
    except urllib.error.HTTPError as err:
        assert err.code == 400

    # /v1/models through the gateway: both models, as their replicas list them (each its own folder).
    request = urllib.request.Request(f"{gateway}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        listed = {m["id"]: m for m in json.loads(resp.read())["data"]}
    assert sorted(listed) == ["alpha", "beta"], listed
    assert listed["alpha"]["root"].endswith("/tiny-llama") and listed["beta"]["root"].endswith("/tiny-llama-8")

    # Same inventory again: nothing changes on any host.
    again = run_site(inventory, artifacts, timeout=900)
    assert again.returncode == 0, failures(again)
    recap = _recap(again.stdout)
    assert all(c["changed"] == 0 for c in recap.values()), (recap, _changed_tasks(again.stdout))

    down = run_playbook("playbooks/teardown.yml", inventory)
    assert down.returncode == 0, failures(down)
    for node in test_hosts.nodes:
        units = _on(node.name, "systemctl list-units --all --no-legend 'vllm-fleet-*' | grep -v ' not-found '")
        assert units.strip() == "", f"{node.name}: {units}"
    assert _on(node3.name, "test -e /opt/vllm-fleet/router && echo left || true").strip() == "", "the router's venv"
