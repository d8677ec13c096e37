"""The container definitions the roles give community.docker.docker_container, rendered by
Ansible on this machine only (local connections, no container engine): nodes whose
recorded gpu_facts list 4 active InfiniBand HCAs, and a node without RDMA devices.

The path is the real one from the facts on: the first play's filters (settings, plan),
the records filter (every node's record, with every node's facts), serve.yml's own
hand-over to vllm_server (read from serve.yml) and the role's tasks/container.yml in check
mode, where a stand-in docker_container module writes down the arguments it is given;
each launch's environment file rendered by the role's template (container and systemd
runtimes); and cluster.yml's own
hand-over to ray_cluster with the role's own tasks that compose the Ray container's
environment and description (read from node.yml and start.yml)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import FIXTURES, PLAYBOOK, ROOT, failures, run_playbook
from vllm_fleet.agents.envfile import parse_env
from vllm_fleet.inventory import facts

pytestmark = pytest.mark.skipif(PLAYBOOK is None, reason="ansible-playbook not installed")

IB_HCA = "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
RDMA = {"capabilities": ["IPC_LOCK"], "devices": ["/dev/infiniband:/dev/infiniband"], "ulimits": ["memlock:-1:-1"]}
NOFILE = "nofile:65536:65536"

# Writes down what the task gives it (one JSON line per container) and changes nothing.
FAKE_MODULE = """#!/usr/bin/python
# WANT_JSON
import json
import os
import sys

with open(sys.argv[1]) as handle:
    args = json.load(handle)
with open(os.environ["VLLM_FLEET_TEST_CONTAINERS"], "a") as out:
    out.write(json.dumps({k: v for k, v in args.items() if not k.startswith("_ansible")}) + "\\n")
print(json.dumps({"changed": False}))
"""

PLAY = """
- name: Settings and plan, as playbooks/plan.yml makes them
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Read every node's settings
      ansible.builtin.set_fact:
        vllm_fleet_settings: "{{ hostvars | vllm_fleet_settings(groups['vllm_nodes']) }}"

    - name: Plan
      ansible.builtin.set_fact:
        vllm_fleet_plan: "{{ plan_nodes | vllm_fleet_plan(vllm_fleet_model, vllm_fleet_settings.wishes) }}"

    - name: Every node's record, as playbooks/plan.yml computes them
      ansible.builtin.set_fact:
        vllm_fleet_records: "{{ vllm_fleet_plan | vllm_fleet_records(vllm_fleet_settings, hostvars) }}"

- name: Each node's record, and what the roles give the container engine
  hosts: vllm_nodes
  gather_facts: false
  vars_files: ["{{ root }}/playbooks/vars/secrets.yml"]
  vars:
    __vllm_server_mode: container  # what the role's tasks/mode.yml picks for the container runtime
  tasks:
    - name: Keep this node's record, as playbooks/plan.yml gives it
      ansible.builtin.set_fact:
        vllm_fleet_node: "{{ hostvars['localhost'].vllm_fleet_records[inventory_hostname] }}"

    - name: Start the launches as serve.yml hands them over
      ansible.builtin.include_role:
        name: vllm_server
        tasks_from: container.yml
      vars: {SERVER_VARS}

    - name: Render each launch's environment file, for the container and for the systemd unit
      ansible.builtin.set_fact:
        env_files: >-
          {{ env_files | default({}) | combine({launch.0.name ~ '/' ~ launch.1: lookup('ansible.builtin.template',
             root ~ '/roles/vllm_server/templates/launch.env.j2',
             template_vars={'item': launch.0, '__vllm_server_mode': launch.1, 'vllm_server_env': {},
                            'vllm_server_api_key': '', 'vllm_server_hf_token': '', 'ansible_managed': 'managed'})}) }}
      loop: "{{ vllm_fleet_node.launches | product(['container', 'systemd']) | list }}"
      loop_control:
        loop_var: launch
        label: "{{ launch.0.name }} ({{ launch.1 }})"

    - name: Describe the Ray container as cluster.yml hands ray_cluster over
      ansible.builtin.include_tasks: "{{ tmp }}/ray_container.yml"
      vars: {CLUSTER_VARS}

    - name: Write down the record, the environment files and the Ray container
      ansible.builtin.copy:
        dest: "{{ tmp }}/{{ inventory_hostname }}.json"
        content: "{{ {'record': vllm_fleet_node, 'env_files': env_files | default({}),
                      'ray': __ray_cluster_container} | to_json }}"
        mode: "0600"
      check_mode: false
      delegate_to: localhost
"""

# The ray_cluster role's own tasks, after what the node probe would have read (tasks/node.yml's
# shell task) and the role's defaults.
RAY_STUBS = """
- name: The ray_cluster role's defaults
  ansible.builtin.include_vars: "{{ root }}/roles/ray_cluster/defaults/main.yml"

- name: What tasks/validate.yml and the node probe leave
  ansible.builtin.set_fact:
    __ray_cluster_ip: "{{ ray_cluster_node_ip }}"
    __ray_cluster_is_head: "{{ inventory_hostname == ray_cluster_head }}"
    __ray_cluster_args: ["--block"]
    __ray_cluster_node_probe:
      stdout: |
        ### route
        {{ '2: eth0    inet ' ~ ray_cluster_node_ip ~ '/24 scope global eth0' if inventory_hostname == ray_cluster_head
           else hostvars[ray_cluster_head].ansible_host ~ ' dev eth0 src ' ~ ray_cluster_node_ip }}
        ### shm
        1B-blocks
        17179869184
        ### memtotal
        68719476736
        ### packages
"""


def _task(path: Path, name: str) -> dict[str, Any]:
    tasks: list[dict[str, Any]] = yaml.safe_load(path.read_text())
    return next(t for t in tasks if t.get("name") == name)


def _role_vars(playbook: str, role: str) -> dict[str, Any]:
    """The vars a playbook gives its ``include_role: role`` (the run, not ``state: absent``)."""
    for play in yaml.safe_load((ROOT / "playbooks" / playbook).read_text()):
        for task in play.get("tasks") or []:
            include = task.get("ansible.builtin.include_role") or {}
            wanted = include.get("name") == role and not include.get("tasks_from")
            if wanted and "ray_cluster_state" not in task["vars"]:
                found: dict[str, Any] = task["vars"]
                return found
    raise AssertionError(f"{playbook} does not include {role}")


def _deploy(
    tmp: Path, nodes: dict[str, str | None], model_path: str | None = "/srv/models/Qwen3-8B"
) -> dict[str, dict[str, Any]]:
    """One run over ``nodes`` ({name: recorded /sys/class/infiniband reading or None for none});
    ``model_path`` None: no folder on the nodes, vLLM fetches the Hub name itself."""
    collection = tmp / "collections/ansible_collections/community/docker/plugins/modules"
    collection.mkdir(parents=True)
    (collection / "docker_container.py").write_text(FAKE_MODULE)
    server_vars = {**_role_vars("serve.yml", "vllm_server"), "vllm_server_config_dir": str(tmp / "config")}
    cluster_vars = _role_vars("cluster.yml", "ray_cluster")
    play = PLAY.replace("{SERVER_VARS}", json.dumps(server_vars)).replace("{CLUSTER_VARS}", json.dumps(cluster_vars))
    (tmp / "play.yml").write_text(play)
    tasks = [
        *yaml.safe_load(RAY_STUBS),
        _task(
            ROOT / "roles/ray_cluster/tasks/node.yml", "Work out the interface, /dev/shm, object store and environment"
        ),
        _task(ROOT / "roles/ray_cluster/tasks/start.yml", "Describe the Ray container"),
    ]
    (tmp / "ray_container.yml").write_text(yaml.safe_dump(tasks, sort_keys=False))
    hosts = {}
    for i, (name, reading) in enumerate(nodes.items()):
        ib = (FIXTURES / "facts" / f"{reading}.ib.txt").read_text() if reading else ""
        hosts[name] = {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "ansible_host": f"10.0.0.{i + 1}", "vllm_fleet_address": f"10.0.0.{i + 1}",
            "vllm_fleet_gpu": "H100-SXM", "vllm_fleet_gpu_count": 8, "vllm_fleet_interface": "eth0",
            # What the gpu_facts role leaves on the node (the recorded reading, parsed as it parses it).
            "gpu_facts_found": facts.host_facts({"ib": ib}),
        }  # fmt: skip
    group = {
        "vllm_fleet_model": "Qwen/Qwen3-8B", "vllm_fleet_tensor_parallel_size": 8, "vllm_fleet_max_model_len": 8192,
        "vllm_fleet_ray": "always", "ray_cluster_image": "vllm-fleet/serving:test",
        # No folder on the nodes: the prepare phase leaves the model to vLLM (which fetches the Hub name).
        **({"vllm_fleet_model_path": model_path} if model_path else {"vllm_fleet_prepare_model": False}),
    }  # fmt: skip
    inventory = {
        "all": {
            "hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}},
            "children": {"vllm_nodes": {"hosts": hosts}},
            "vars": group,
        }
    }
    (tmp / "hosts.yml").write_text(yaml.safe_dump(inventory))
    plan_nodes = [
        {"name": n, "gpu": "H100-SXM", "gpu_count": 8, "address": h["vllm_fleet_address"], "interface": "eth0"}
        for n, h in hosts.items()
    ]
    extra = {"root": str(ROOT), "tmp": str(tmp), "plan_nodes": plan_nodes}
    (tmp / "extra.json").write_text(json.dumps(extra))
    (tmp / "containers.jsonl").write_text("")
    # The stand-in community.docker collection comes first; the module writes to containers.jsonl.
    env = {
        "ANSIBLE_COLLECTIONS_PATH": str(tmp / "collections"),
        "VLLM_FLEET_TEST_CONTAINERS": str(tmp / "containers.jsonl"),
    }
    done = run_playbook(tmp / "play.yml", tmp / "hosts.yml", "--check", "-e", f"@{tmp / 'extra.json'}", env=env)
    assert done.returncode == 0, failures(done)
    out = {name: json.loads((tmp / f"{name}.json").read_text()) for name in nodes}
    for line in (tmp / "containers.jsonl").read_text().splitlines():
        container = json.loads(line)
        name = next(n for n, o in out.items() if container["name"] in [la["name"] for la in o["record"]["launches"]])
        out[name].setdefault("containers", []).append(container)
    return out


@pytest.fixture(scope="module")
def infiniband(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Two HGX nodes with 4 active InfiniBand HCAs each (and a RoCE storage port, a port down)."""
    return _deploy(tmp_path_factory.mktemp("ib"), {"ib1": "hgx-4ib", "ib2": "hgx-4ib"})


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """A node without RDMA devices, serving a Hub name (no model folder on the node)."""
    return _deploy(tmp_path_factory.mktemp("plain"), {"plain1": None}, model_path=None)


def test_vllm_containers_on_infiniband_nodes_get_ipc_lock_the_devices_and_memlock(
    infiniband: dict[str, dict[str, Any]],
) -> None:
    for name, node in infiniband.items():
        assert node["record"]["rdma"]["kind"] == "infiniband" and node["record"]["rdma"]["notes"] == []
        (container,) = node["containers"]
        assert container["capabilities"] == ["IPC_LOCK"], name
        assert container["devices"] == ["/dev/infiniband:/dev/infiniband"]
        assert container["ulimits"] == ["memlock:-1:-1", NOFILE]
        assert container["env_file"].endswith(f"/config/{container['name']}.env")
        env = _env_file(node["env_files"][container["name"] + "/container"])
        assert env["NCCL_IB_HCA"] == IB_HCA and "NCCL_IB_DISABLE" not in env and "NCCL_IB_GID_INDEX" not in env
        assert env["NCCL_SOCKET_IFNAME"] == "eth0"
        # The systemd runtime reads the same variables from its own environment file.
        unit = parse_env(node["env_files"][container["name"] + "/systemd"])
        assert {k: v for k, v in unit.items() if k.startswith("NCCL_IB")} == {"NCCL_IB_HCA": IB_HCA}


def test_vllm_containers_without_rdma_set_no_memlock(plain: dict[str, dict[str, Any]]) -> None:
    node = plain["plain1"]
    assert node["record"]["rdma"]["kind"] == "none"
    (container,) = node["containers"]
    # No IPC_LOCK, no devices, and no memlock: the Docker daemon's default ulimits apply.
    assert "capabilities" not in container and "devices" not in container
    assert container["ulimits"] == [NOFILE]
    # A Hub name: no model folder to mount (the container's first volume is the secrets file).
    assert node["record"]["model_path"] is None and "Qwen/Qwen3-8B" in container["command"], container
    assert [v.split(":")[1] for v in container["volumes"]] == ["/run/vllm-fleet/launch.secrets"], container["volumes"]
    env = _env_file(node["env_files"][container["name"] + "/container"])
    assert env["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in env
    unit = parse_env(node["env_files"][container["name"] + "/systemd"])
    assert {k: v for k, v in unit.items() if k.startswith("NCCL_IB")} == {"NCCL_IB_DISABLE": "1"}


def test_ray_containers_follow_the_record(
    infiniband: dict[str, dict[str, Any]], plain: dict[str, dict[str, Any]]
) -> None:
    for node in infiniband.values():
        ray = node["ray"]
        assert (ray["capabilities"], ray["devices"], ray["ulimits"]) == (
            RDMA["capabilities"], RDMA["devices"], [*RDMA["ulimits"], NOFILE],
        )  # fmt: skip
        assert ray["env"]["NCCL_IB_HCA"] == IB_HCA and "NCCL_IB_DISABLE" not in ray["env"]
        assert ray["env"]["NCCL_SOCKET_IFNAME"] == "eth0" and ray["env"]["VLLM_HOST_IP"].startswith("10.0.0.")
    ray = plain["plain1"]["ray"]
    assert (ray["capabilities"], ray["devices"], ray["ulimits"]) == ([], [], [NOFILE])
    assert ray["env"]["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in ray["env"]


def _env_file(text: str) -> dict[str, str]:
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    return dict(ln.split("=", 1) for ln in lines)
