"""site.yml end to end on real test hosts (SSH, systemd), with logical GPUs declared."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from pathlib import Path

import yaml

from tests.conftest import ROOT, failures, run_site
from tests.hosts.common import SSH_OPTIONS
from tests.hosts.nodes import ssh_argv
from tests.integration.test_secrets_verbose import leaks, vault_file
from tests.system.conftest import Hosts

TINY_MODEL = ROOT / "inventories/local/files/tiny-llama"


def _inventory(
    path: Path, hosts: Hosts, extra: dict[str, object] | None = None, **node_overrides: dict[str, object]
) -> Path:
    nodes = {}
    for node in hosts.nodes:
        nodes[node.name] = {
            "ansible_host": node.address,
            "vllm_fleet_gpu": "L4",
            "vllm_fleet_gpu_count": 4,
            "vllm_fleet_interface": "eth0",
            **node_overrides.get(node.name, {}),
        }
    inventory = {
        "all": {
            "hosts": {"localhost": {"ansible_connection": "local"}},
            "children": {"vllm_nodes": {"hosts": nodes}},
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": hosts.key,
                "ansible_ssh_common_args": SSH_OPTIONS,
                "vllm_fleet_model": str(TINY_MODEL),
                "vllm_fleet_max_model_len": 2048,
                "vllm_fleet_connect_timeout": 5,
                # Ray and vLLM on the test hosts: one venv under systemd (no registry for images),
                # installed from the hosts' wheels, within these machines' limits.
                "vllm_fleet_runtime": "systemd",
                "vllm_server_installer": "uv",
                "vllm_server_pip_args": ["--no-index", "--find-links", "/opt/wheels"],
                "ray_cluster_memlock": 8388608,
                "ray_cluster_nofile": 20000,
                "ray_cluster_num_cpus": 1,
                "ray_cluster_object_store_memory": 100_000_000,
                "ray_cluster_auth_token_file": str(path.parent / "ray.token"),
                **(extra or {}),
            },
        }
    }
    path.write_text(yaml.safe_dump(inventory))
    return path


def _site(inventory: Path, artifacts: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    # Logical L4s: plan, prepare and Ray for real; vLLM itself is served on the CPU in test_serve_on_hosts.py.
    return run_site(inventory, artifacts, "--tags", "facts,preflight,plan,prepare,cluster", *extra)


# On a test host: which world-readable files the roles write (and the journal) hold one of the
# patterns on stdin (kept in a 0600 temporary file, never in argv).
SCAN = (
    "pat=$(mktemp); cat > $pat; "
    "find /etc/vllm-fleet /var/lib/vllm-fleet /opt/vllm-fleet /etc/systemd/system /etc/nginx /tmp /var/log "
    "-xdev -type f -perm -o=r -size -8M -not -path '*/site-packages/*' -print0 2>/dev/null "
    "| xargs -0 -r grep -l -F -f $pat; journalctl --no-pager -o cat | grep -q -F -f $pat && echo JOURNAL; "
    "rm -f $pat; true"
)


def _recap(stdout: str) -> dict[str, dict[str, int]]:
    recap = {}
    for host, counters in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", stdout, re.MULTILINE):
        recap[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counters)}
    return recap


def test_site_plans_for_the_hosts_and_reaches_every_one(test_hosts: Hosts, tmp_path: Path) -> None:
    """At -vvv, with the API key, the Hub token and the Ray token from an Ansible Vault file: no
    secret in the output, the artifacts, a world-readable file on a host or its journal. (No
    instance here uses Ray, so the token reaches no host: test_local_default runs a Ray head with
    a Vault token at -vvv and scans this machine the same way.)"""
    inventory = _inventory(tmp_path / "hosts.yml", test_hosts)
    values = {
        "vllm_fleet_api_key": f"key-{secrets.token_hex(12)}",
        "vllm_fleet_hf_token": f"hf_{secrets.token_hex(12)}",
        "ray_cluster_auth_token": secrets.token_hex(32),
    }
    vault, password = vault_file(tmp_path / "secrets.yml", values)
    result = _site(inventory, tmp_path / "artifacts", "-vvv", "-e", f"@{vault}", "--vault-password-file", str(password))
    assert result.returncode == 0, failures(result)
    assert leaks(values, result.stdout + result.stderr, tmp_path / "artifacts") == []
    assert "ESTABLISH SSH CONNECTION" in result.stdout  # -vvv reached the hosts
    patterns = "".join(f"{v}\n" for v in values.values())
    for node in test_hosts.nodes:
        done = subprocess.run(ssh_argv(node.name, SCAN), input=patterns, capture_output=True, text=True, timeout=120,
                              check=False)  # fmt: skip
        assert done.returncode == 0 and done.stdout.strip() == "", f"{node.name} holds a secret in: {done.stdout}"
    recap = _recap(result.stdout)
    for node in test_hosts.nodes:
        assert recap[node.name]["unreachable"] == 0 and recap[node.name]["failed"] == 0
        assert recap[node.name]["ok"] >= 2, recap[node.name]  # reached, then given its part of the plan
    plan = json.loads((tmp_path / "artifacts/plan.json").read_text())
    addresses = {n.name: n.address for n in test_hosts.nodes}
    placed = {inst["head_node"] for inst in plan["instances"]}
    assert placed == set(addresses), f"every host serves: {placed}"
    for inst in plan["instances"]:
        assert addresses[inst["head_node"]] in inst["endpoint"]
        assert inst["env"].get("NCCL_SOCKET_IFNAME") == "eth0" or inst["tensor_parallel_size"] == 1
    # A second run changes nothing.
    # A second run's changed=0 is the ray_cluster scenarios' idempotence and test_multinode's
    # second run (both through the same cluster phase); not repeated here (CI time).


def test_a_node_that_does_not_answer_stops_the_run_by_name(test_hosts: Hosts, tmp_path: Path) -> None:
    last = test_hosts.nodes[-1]
    # sshd refuses on a closed port of a real host: the run must stop before any phase, naming it.
    inventory = _inventory(tmp_path / "hosts.yml", test_hosts, **{last.name: {"ansible_port": 2}})
    result = _site(inventory, tmp_path / "artifacts")
    assert result.returncode != 0
    assert f"{last.name} ({last.address}) does not answer" in result.stdout
    assert "No host has been changed" in result.stdout
    assert "PLAY [Prepare the nodes]" not in result.stdout, "later plays ran after a node failed"


def test_hosts_without_gpus_stop_the_plan_with_the_reason(test_hosts: Hosts, tmp_path: Path) -> None:
    """Nothing states the GPUs: gpu_facts detects none on the test hosts (no nvidia-smi) and the plan says so."""
    inventory = _inventory(tmp_path / "hosts.yml", test_hosts)
    data = yaml.safe_load(inventory.read_text())
    for host in data["all"]["children"]["vllm_nodes"]["hosts"].values():
        del host["vllm_fleet_gpu"], host["vllm_fleet_gpu_count"]
    inventory.write_text(yaml.safe_dump(data))
    result = _site(inventory, tmp_path / "artifacts")
    assert result.returncode != 0
    assert "Host node1 reports no NVIDIA GPU (gpu_facts found 0)" in result.stdout, result.stdout[-3000:]
    assert "no NVIDIA GPU (" in result.stdout  # gpu_facts' own line per host, with nvidia-smi's reason
    assert not (tmp_path / "artifacts/plan.json").exists()
