"""ray_cluster failure paths that need a real engine: they must stop before anything starts."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, failures, run_playbook
from tests.hosts import nodes
from tests.hosts.common import SSH_OPTIONS
from tests.hosts.engine import docker, ray_image_name
from tests.hosts.nodes import ssh_argv
from tests.system.conftest import Hosts


def test_a_ray_version_mismatch_names_the_node_and_starts_nothing(
    test_hosts: Hosts, docker_engine: str, tmp_path: Path
) -> None:
    play = tmp_path / "play.yml"
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n  roles: [ray_cluster]\n"
        "  vars:\n"
        "    ray_cluster_runtime: container\n"
        f"    ray_cluster_image: {ray_image_name()}\n"
        "    ray_cluster_version: 2.59.0\n"
        "    ray_cluster_name: vf-version-check\n"
        "    ray_cluster_node_ip: 127.0.0.1\n"
        "    ray_cluster_interface: lo\n"
        "    ray_cluster_gpu_device_requests: []\n"
        f"    ray_cluster_config_dir: {tmp_path}/ray\n"
        f"    ray_cluster_auth_token_file: {tmp_path}/token\n"
    )
    result = run_playbook(play, nodes.INVENTORY, timeout=300)
    assert result.returncode != 0
    assert "Ray versions differ, nothing was started: localhost has 2.60.0" in result.stdout, result.stdout[-3000:]
    assert docker("ps", "--all", "--quiet", "--filter", "name=vf-version-check").strip() == ""


def _systemd_cluster(path: Path, hosts: Hosts, env_by_node: dict[str, dict[str, str]]) -> Path:
    """An inventory for the role on the test hosts (systemd runtime), with per-node extra env."""
    lines = ["all:", "  children:", "    test_hosts:", "      hosts:"]
    for node in hosts.nodes:
        lines.append(f"        {node.name}:")
        lines.append(f"          ansible_host: {node.address}")
        if node.name in env_by_node:
            lines.append(f"          ray_cluster_env: {env_by_node[node.name]!r}")
    lines += [
        "  vars:",
        "    ansible_user: root",
        f"    ansible_ssh_private_key_file: {hosts.key}",
        f"    ansible_ssh_common_args: '{SSH_OPTIONS}'",
        "    ansible_python_interpreter: /usr/bin/python3",
    ]
    inventory = path / "hosts.yml"
    inventory.write_text("\n".join(lines) + "\n")
    return inventory


def _converge(inventory: Path, token: Path) -> dict[str, int]:
    """Run the bench play (systemd runtime, 4 logical GPUs each); return changed= per host."""
    result = run_playbook(ROOT / "tests/bench/ray_join.yml", inventory, env={"VLLM_FLEET_BENCH_TOKEN": str(token)})
    assert result.returncode == 0, failures(result)
    return {h: int(c) for h, c in re.findall(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", result.stdout, re.MULTILINE)}


def _node_ids(hosts: Hosts) -> dict[str, str]:
    head = hosts.nodes[0]
    probe = subprocess.run(
        ssh_argv(
            head.name,
            "RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=/etc/vllm-fleet/ray/auth_token /opt/vllm-fleet/ray/bin/python "
            f"/etc/vllm-fleet/ray/ray_probe.py --address {head.address}:6379 status",
        ),
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return {m["ip"]: m["id"] for m in json.loads(probe.stdout)["members"]}


# Extended (make test-extended; docs/testing.md "CI time"): three converges of a 3-node cluster, about
# 270 s; ray_cluster's Molecule scenarios converge, restart and verify the same units in CI.
@pytest.mark.extended
def test_a_changed_setting_restarts_only_what_it_affects(test_hosts: Hosts, tmp_path: Path) -> None:
    token = tmp_path / "token"
    first = _systemd_cluster(tmp_path, test_hosts, {})
    _converge(first, token)
    before = _node_ids(test_hosts)
    head, worker, last = (n.address for n in test_hosts.nodes[:3])

    # A worker-only change restarts that worker and nothing else.
    changed = _converge(_systemd_cluster(tmp_path, test_hosts, {"node3": {"VF_TEST": "1"}}), token)
    after_worker = _node_ids(test_hosts)
    assert changed["node1"] == 0 and changed["node2"] == 0 and changed["node3"] > 0, changed
    assert after_worker[head] == before[head] and after_worker[worker] == before[worker]
    assert after_worker[last] != before[last]

    # A head change restarts the head, then every worker (they must join the new GCS).
    _converge(_systemd_cluster(tmp_path, test_hosts, {"node1": {"VF_TEST": "1"}, "node3": {"VF_TEST": "1"}}), token)
    after_head = _node_ids(test_hosts)
    assert all(after_head[ip] != after_worker[ip] for ip in (head, worker, last)), (after_worker, after_head)
