"""Bad inventories stop site.yml in its first plays, naming the field (``--tags plan``:
localhost only, CPU nodes like inventories/local, no host is reached)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PLAYBOOK, ROOT
from tests.conftest import run_site as _run

pytestmark = pytest.mark.skipif(PLAYBOOK is None, reason="ansible-playbook not installed")

TINY = str(ROOT / "inventories/local/files/tiny-llama")
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
CPU = {"vllm_fleet_gpu": "cpu", "vllm_fleet_gpu_count": 1, "vllm_fleet_gpu_memory_gib": 2}
BASE = {"vllm_fleet_model": TINY, "vllm_fleet_max_model_len": 2048}


def _inventory(tmp_path: Path, nodes: dict[str, dict[str, Any]], extra: dict[str, Any] | None = None) -> Path:
    """An inventory file (JSON is YAML) with the controller and CPU nodes."""
    path = tmp_path / "hosts.yml"
    hosts = {name: {**LOCAL, **CPU, **values} for name, values in nodes.items()}
    data = {
        "all": {
            "hosts": {"localhost": LOCAL},
            "vars": {**BASE, **(extra or {})},
            "children": {"vllm_nodes": {"hosts": hosts}},
        }
    }
    path.write_text(json.dumps(data, indent=2))
    return path


def _two(first: dict[str, Any] | None = None, second: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    return {
        "n1": {"vllm_fleet_address": "127.0.0.1", **(first or {})},
        "n2": {"vllm_fleet_address": "127.0.0.2", **(second or {})},
    }


RAW_HEAD = (
    "all:\n"
    "  hosts:\n"
    '    localhost: {ansible_connection: local, ansible_python_interpreter: "{{ ansible_playbook_python }}"}\n'
    "  vars:\n"
    f"    vllm_fleet_model: {TINY}\n"
)
RAW_NODES = (
    "  children:\n"
    "    vllm_nodes:\n"
    "      hosts:\n"
    "        localhost: {vllm_fleet_gpu: cpu, vllm_fleet_gpu_count: 1, vllm_fleet_gpu_memory_gib: 2,"
    " vllm_fleet_address: 127.0.0.1}\n"
)

CASES = [
    pytest.param(
        {"n1": {"vllm_fleet_gpu_count": True}},
        None,
        "vllm_fleet_gpu_count: True is a boolean, not a number",
        id="bad-type-bool-count",
    ),
    pytest.param(
        {"n1": {"vllm_fleet_gpu_count": 1.5}},
        None,
        "vllm_fleet_gpu_count: 1.5 is not an integer",
        id="bad-type-fraction",
    ),
    pytest.param(
        {"n1": {"vllm_fleet_gpu_count": 10**12}},
        None,
        "vllm_fleet_gpu_count: 1000000000000 is above 1024",
        id="gpu-count-above-bound",
    ),
    pytest.param(
        _two({"vllm_fleet_max_model_len": 1024}),
        None,
        "vllm_fleet_max_model_len: differs between n1 (1024) and n2 (2048)",
        id="disagreeing-deployment-wide",
    ),
    pytest.param(
        {"n1": {}},
        {"vllm_fleet_port": 8080, "vllm_fleet_gateway": True},
        "vllm_fleet_port: vllm_fleet_port (the API port of 1 instance) 8080 overlaps "
        "vllm_fleet_gateway_port (nginx) 8080 on n1; fix: set vllm_fleet_port to 8081",
        id="port-vs-gateway",
    ),
    pytest.param(
        # Ray's ports count where Ray runs: vllm_fleet_ray: always puts n1 in a Ray cluster.
        {"n1": {"ray_cluster_gcs_port": 8000}},
        {"vllm_fleet_ray": "always"},
        "ray_cluster_gcs_port: Ray's gcs_port 8000 overlaps vllm_fleet_port (the API port of 1 instance) 8000",
        id="ray-port-vs-vllm-port",
    ),
    pytest.param(
        _two(second={"vllm_fleet_address": "127.0.0.1"}),
        None,
        "vllm_fleet_address: n1 and n2 are one machine (127.0.0.1)",
        id="duplicate-address",
    ),
    # Ports of different components on one host (a class: monitoring's against serving's).
    pytest.param(
        _two(),
        {"vllm_fleet_node_exporter_port": 8000},
        "vllm_fleet_node_exporter_port: vllm_fleet_node_exporter_port (node exporter) 8000 overlaps vllm_fleet_port",
        id="exporter-on-the-vllm-port",
    ),
    pytest.param(
        _two(),
        {"vllm_fleet_monitoring_port": 8080},
        "vllm_fleet_monitoring_port: vllm_fleet_monitoring_port (Prometheus) 8080 overlaps vllm_fleet_gateway_port "
        "(nginx) 8080 on n1",
        id="prometheus-on-the-gateway-port",
    ),
    pytest.param(
        _two(),
        {"vllm_fleet_port": 9113},
        "vllm_fleet_port: vllm_fleet_port (the API port of 1 instance) 9113 overlaps the nginx exporter 9113 on n1",
        id="vllm-on-the-nginx-exporter-port",
    ),
    # A record's own check (records.py ray_membership): in a run that only plans, it runs in the
    # plan step, before plan.json is written (the records step is skipped there).
    pytest.param(
        {"n1": {"ray_cluster_num_gpus": "four"}},
        {"vllm_fleet_ray": "always"},
        "ray_cluster_num_gpus: 'four' is not a whole number of GPUs",
        id="record-check-ray-gpus",
    ),
    # Hosts the plan names but the inventory lacks (a class: every host field).
    pytest.param(
        {"n1": {}},
        {"vllm_fleet_gateway": "true", "vllm_fleet_gateway_host": "gw-9"},
        "vllm_fleet_gateway_host: gw-9 is not in the inventory; fix: add gw-9 to the inventory",
        id="gateway-host-not-in-inventory",
    ),
    pytest.param(
        {"n1": {}},
        {"vllm_fleet_monitoring": "true", "vllm_fleet_monitoring_host": "prom-1"},
        "vllm_fleet_monitoring_host: prom-1 is not in the inventory",
        id="monitoring-host-not-in-inventory",
    ),
    # What reaches vLLM around the declared options (a class: flags, secret variables, planned variables).
    pytest.param(
        {"n1": {"vllm_fleet_extra_args": ["--api-key=sk-123"]}},
        None,
        "vllm_fleet_extra_args: holds --api-key: a secret on the command line is visible in ps",
        id="extra-args-secret-flag",
    ),
    pytest.param(
        {"n1": {}},
        {"vllm_fleet_extra_env": {"HF_TOKEN": "hf_x"}},
        "vllm_fleet_extra_env: sets HF_TOKEN, a secret",
        id="extra-env-secret",
    ),
    pytest.param(
        {"n1": {}},
        {"vllm_fleet_extra_env": {"VLLM_PP_LAYER_PARTITION": "3,3"}},
        "vllm_fleet_extra_env: sets VLLM_PP_LAYER_PARTITION: the plan computes each pipeline's layer partition",
        id="extra-env-planned-partition",
    ),
    pytest.param(
        {"n1": {}},
        {"vllm_fleet_gateway_listen": "eth0"},
        "vllm_fleet_gateway_listen: is not an IP address ('eth0')",
        id="gateway-listen-not-an-address",
    ),
    pytest.param(
        {"n1": {}},
        {"vllm_fleet_max_model_len": 4096},
        "vllm_fleet_max_model_len: 4096 is above the model's derived maximum (max_position_embeddings=2048)",
        id="vllm-refuses-long-context",
    ),
    pytest.param(
        {"n1": {}},
        {"vllm_fleet_model": None},
        "vllm_fleet_model: the inventory declares no model; fix: set vllm_fleet_model",
        id="no-model",
    ),
]


@pytest.mark.parametrize(("nodes", "extra", "message"), CASES)
def test_bad_inventory_stops_in_the_first_plays(
    tmp_path: Path, nodes: dict[str, dict[str, Any]], extra: dict[str, Any] | None, message: str
) -> None:
    result = _run(_inventory(tmp_path, nodes, extra), tmp_path / "art", "--tags", "plan")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert message in " ".join(out.split()), out
    # An Ansible run names inventory variables, never the CLI's flags (errors.for_inventory).
    assert not re.search(r"--(max-model-len|quantization|env|tensor-parallel-size|dtype)\b", out), out
    # Stopped by the validation or the plan play: nothing written, no node play ran.
    before = out.split("fatal:", 1)[0]
    assert "PLAY [Validate the inventory]" in before or "PLAY [Plan the layout from the inventory]" in before
    assert not (tmp_path / "art" / "plan.json").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            RAW_HEAD + "    vllm_fleet_max_model_len: 2048\n    vllm_fleet_max_model_len: 1024\n" + RAW_NODES,
            "duplicate mapping key 'vllm_fleet_max_model_len'",
            id="duplicate-yaml-key",
        ),
        pytest.param(
            RAW_HEAD
            + "    vllm_fleet_api_key: !vault |\n"
            + "      $ANSIBLE_VAULT;1.1;AES256\n"
            + "      62626262626262626262626262626262\n"
            + RAW_NODES,
            "vllm_fleet_api_key cannot be read",
            id="undecryptable-vault-value",
        ),
    ],
)
def test_unreadable_inventory_stops_in_the_first_play(tmp_path: Path, text: str, message: str) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(text)
    result = _run(inventory, tmp_path / "art", "--tags", "plan")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert message in " ".join(out.split()), out
    # Stopped in the first play, or before any (an inventory Ansible cannot parse at all:
    # ansible.cfg's unparsed_is_failed).
    stopped_early = "PLAY [" not in out and "No inventory was parsed" in out
    assert stopped_early or "PLAY [Validate the inventory]" in out.split("fatal:", 1)[0]
    assert not (tmp_path / "art" / "plan.json").exists()


def test_misspelled_name_warns_and_plans(tmp_path: Path) -> None:
    result = _run(_inventory(tmp_path, {"n1": {"vllm_fleet_gpu_cout": 2}}), tmp_path / "art", "--tags", "plan")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "WARNING vllm_fleet_gpu_cout is not a vllm-fleet variable; did you mean vllm_fleet_gpu_count?" in out
    assert (tmp_path / "art" / "plan.json").exists()
    # Only planned: no record or deployment.json (no play of the run reads them)
    assert not (tmp_path / "art" / "records").exists() and not (tmp_path / "art" / "deployment.json").exists()


def test_a_limit_without_localhost_stops_before_any_node_with_the_fix(tmp_path: Path) -> None:
    """The plan plays run on localhost; `--limit n1` skipped them silently and the run then failed on
    the node's missing record. Now the first node play says so and names the fix."""
    result = _run(_inventory(tmp_path, _two()), tmp_path / "art", "--limit", "n1")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "--limit n1 leaves out localhost" in " ".join(out.split()), out
    assert "--limit 'n1,localhost'" in out, out
    # Stopped before a node was reached or anything written.
    assert "Connect and run Python on the node" not in out.split("fatal:", 1)[0]
    assert not (tmp_path / "art" / "plan.json").exists()
