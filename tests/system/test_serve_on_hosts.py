"""Serving for real on the test hosts: site.yml with two CPU vLLM replicas (node1,
node2) from the venv runtime behind the nginx gateway on node3, verify through
the gateway and each replica, a second run with changed=0, one replica stopped
while requests keep succeeding through the gateway, then teardown."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from tests.conftest import ROOT, failures, run_playbook, run_site
from tests.hosts.common import SSH_OPTIONS
from tests.hosts.nodes import ssh_argv
from tests.system.conftest import Hosts
from tests.system.test_site_on_hosts import _recap

API_KEY = "serve-test-key-7f3a"


def _inventory(path: Path, hosts: Hosts) -> Path:
    replicas, gateway = hosts.nodes[:2], hosts.nodes[2]
    inventory = {
        "all": {
            "hosts": {
                "localhost": {"ansible_connection": "local"},
                gateway.name: {"ansible_host": gateway.address},
            },
            "children": {
                "vllm_nodes": {
                    "hosts": {
                        n.name: {
                            "ansible_host": n.address,
                            "vllm_fleet_gpu": "cpu",
                            "vllm_fleet_gpu_count": 1,
                            "vllm_fleet_gpu_memory_gib": 1,
                        }
                        for n in replicas
                    }
                }
            },
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": hosts.key,
                "ansible_ssh_common_args": SSH_OPTIONS,
                "vllm_fleet_model": str(ROOT / "inventories/local/files/tiny-llama"),
                "vllm_fleet_build_model": True,
                "vllm_fleet_max_model_len": 1024,
                "vllm_fleet_served_model_name": "tiny-llama",
                "vllm_fleet_connect_timeout": 5,
                "vllm_fleet_runtime": "systemd",
                "vllm_fleet_prepare_model": False,
                "vllm_fleet_gateway_host": gateway.name,
                "vllm_fleet_api_key": API_KEY,
                "vllm_server_installer": "uv",
                "vllm_server_pip_args": ["--no-index", "--find-links", "/opt/wheels"],
            },
        }
    }
    path.write_text(yaml.safe_dump(inventory))
    return path


def _complete(url: str, key: str | None = API_KEY) -> dict[str, object]:
    body = json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": 4}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url + "/v1/completions", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def test_two_replicas_behind_the_gateway(test_hosts: Hosts, tmp_path: Path) -> None:
    inventory = _inventory(tmp_path / "hosts.yml", test_hosts)
    artifacts = tmp_path / "artifacts"
    first = run_site(inventory, artifacts, timeout=1500)
    output = first.stdout + first.stderr
    assert first.returncode == 0, failures(first)
    assert API_KEY not in output, "the API key was logged"

    rows = json.loads((artifacts / "verify.json").read_text())
    assert [r["via"] for r in rows] == ["gateway", "direct", "direct"]
    assert all(r["ok"] for r in rows), rows
    for row in rows[1:]:
        assert row["kv"]["verdict"] == "match", row  # vLLM's KV tokens within 5 % of the plan
    assert "endpoint" in output and "KV predicted" in output  # the summary table

    # Same inventory again: nothing changes on any host.
    again = run_site(inventory, artifacts, timeout=900)
    assert again.returncode == 0, failures(again)
    recap = _recap(again.stdout)
    assert all(c["changed"] == 0 for c in recap.values()), {h: c["changed"] for h, c in recap.items()}

    gateway = f"http://{test_hosts.nodes[2].address}:8080"
    try:
        _complete(gateway, key=None)
        raise AssertionError("the gateway let a request without the key through")
    except urllib.error.HTTPError as err:
        assert err.code == 401

    # One replica down: every request through the gateway still gets its answer.
    victim = test_hosts.nodes[1]
    stop = subprocess.run(
        ssh_argv(victim.name, "systemctl stop vllm-fleet-vllm-tiny-llama-1.service"),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert stop.returncode == 0, stop.stderr
    for _ in range(6):
        answer = _complete(gateway)
        assert answer["usage"]["completion_tokens"] > 0  # type: ignore[index]

    down = run_playbook("playbooks/teardown.yml", inventory)
    assert down.returncode == 0, failures(down)
    for node in test_hosts.nodes:
        probe = subprocess.run(
            ssh_argv(node.name, "systemctl list-units --all --plain --no-legend 'vllm-fleet-*'; echo ---; "
                                "pgrep -af '[b]in/vllm serve' || true"),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        units, processes = probe.stdout.split("---", 1)
        assert "vllm-fleet-vllm" not in units and "vllm-fleet-gateway" not in units, units
        assert processes.strip() == "", f"vLLM still runs on {node.name}: {processes}"
