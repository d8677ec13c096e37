"""vllm-fleet doctor on real test hosts: a healthy cluster passes, and each planted fault is named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.hosts.nodes import ssh_argv
from tests.system.conftest import Hosts
from tests.system.test_site_on_hosts import _inventory

MODEL_DIR = "/srv/models/tiny"
PORT = 29599


def _ssh(node: str, command: str, stdin: bytes | None = None) -> None:
    subprocess.run(ssh_argv(node, command), input=stdin, check=True, capture_output=True, timeout=120)


def _doctor(inventory: Path) -> tuple[int, dict[str, dict[str, str]]]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [sys.executable, "-m", "vllm_fleet.cli", "doctor", "-i", str(inventory), "--json"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.stdout.strip(), done.stderr[-3000:]
    return done.returncode, {c["name"]: c for c in json.loads(done.stdout)["checks"]}


@pytest.fixture
def model_on_every_node(test_hosts: Hosts, tiny_model: Path) -> Iterator[None]:
    archive = subprocess.run(["tar", "-C", str(tiny_model), "-c", "."], check=True, capture_output=True).stdout
    for node in test_hosts.nodes:
        _ssh(node.name, f"rm -rf {MODEL_DIR} && mkdir -p {MODEL_DIR} && tar -C {MODEL_DIR} -x", stdin=archive)
    yield
    for node in test_hosts.nodes:
        _ssh(node.name, f"rm -rf {MODEL_DIR}")


def test_doctor_passes_a_healthy_cluster_then_names_each_planted_fault(
    test_hosts: Hosts, model_on_every_node: None, tmp_path: Path
) -> None:
    cpu = {node.name: {"vllm_fleet_gpu": "cpu"} for node in test_hosts.nodes}
    extra = {"model_cache_dir": MODEL_DIR, "vllm_fleet_artifacts_dir": str(tmp_path / "artifacts")}
    inventory = _inventory(tmp_path / "hosts.yml", test_hosts, extra, **cpu)
    code, checks = _doctor(inventory)
    assert code == 0, checks
    assert checks["model files"]["status"] == "PASS" and MODEL_DIR in checks["model files"]["detail"]
    assert checks["ports between members"]["detail"] == "6 connections between members succeed"
    assert checks["address = route to head"]["status"] == checks["/dev/shm"]["status"] == "PASS"

    first, second, third = (node.name for node in test_hosts.nodes)
    shard = f"{MODEL_DIR}/model-00002-of-00002.safetensors"
    _ssh(second, f"truncate --size=-64 {shard}")
    install = "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables >/dev/null"
    _ssh(third, f"command -v iptables >/dev/null || ({install})")  # fresh hosts have no firewall tool
    _ssh(third, f"iptables -I INPUT -p tcp --dport {PORT} -j DROP")
    try:
        # The first node says its traffic leaves by eth1; its route to the head says eth0.
        cpu[first]["vllm_fleet_interface"] = "eth1"
        inventory = _inventory(tmp_path / "hosts.yml", test_hosts, extra, **cpu)
        code, checks = _doctor(inventory)
    finally:
        _ssh(third, f"iptables -D INPUT -p tcp --dport {PORT} -j DROP")
    failed = {name for name, check in checks.items() if check["status"] == "FAIL"}
    assert code == 1 and failed == {"model files", "ports between members", "address = route to head"}, checks
    assert f"{second}: model-00002-of-00002.safetensors" in checks["model files"]["detail"]
    blocked = f"blocked: {first} -> {third}:{PORT}, {second} -> {third}:{PORT}"
    assert checks["ports between members"]["detail"].startswith(blocked)
    wrong_interface = f"{first} names interface eth1 but the route to the head leaves by eth0"
    assert wrong_interface in checks["address = route to head"]["detail"]
