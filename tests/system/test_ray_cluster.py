"""ray_cluster failure paths that need a real engine: they must stop before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.hosts import nodes
from tests.hosts.engine import docker, ray_image_name
from tests.system.conftest import Hosts

PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


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
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    result = subprocess.run(
        [PLAYBOOK, "-i", str(nodes.INVENTORY), str(play)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "Ray versions differ, nothing was started: localhost has 2.60.0" in result.stdout, result.stdout[-3000:]
    assert docker("ps", "--all", "--quiet", "--filter", "name=vf-version-check").strip() == ""
