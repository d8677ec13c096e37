"""site.yml on real inventories: the plan play end to end through ansible-playbook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import PLAYBOOK, ROOT
from tests.conftest import run_site as _run

pytestmark = pytest.mark.skipif(PLAYBOOK is None, reason="ansible-playbook not installed")


def test_local_inventory_plans_and_writes_artifacts(tmp_path: Path) -> None:
    # Plan and prepare: Ray and serving for real are tests/system/test_local_default.py.
    result = _run(ROOT / "inventories/local", tmp_path, "--tags", "facts,preflight,plan,prepare")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Plan for" in result.stdout and "tiny-llama-0" in result.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    (inst,) = plan["instances"]
    assert "--kv-cache-memory-bytes" in inst["vllm_args"]
    # the legacy whole-GiB variable would override the exact flag on vLLM's CPU platform
    assert "VLLM_CPU_KVCACHE_SPACE" not in inst["env"]
    assert (tmp_path / "plan.md").read_text().startswith("# vllm-fleet plan")
    # A second run changes nothing.
    again = _run(ROOT / "inventories/local", tmp_path, "--tags", "facts,preflight,plan,prepare")
    assert again.returncode == 0 and "changed=0" in again.stdout


@pytest.mark.parametrize("inventory", ["example", "example-2x8xa800"])
def test_example_inventories_plan(inventory: str, tmp_path: Path) -> None:
    # --tags plan: plan only, reach no host (the example machines do not exist).
    result = _run(ROOT / "inventories" / inventory, tmp_path, "--tags", "plan")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "TASK [Connect and run Python on the node]" not in result.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["instances"][0]["pipeline_parallel_size"] == 2


def test_impossible_request_stops_before_any_host(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n    localhost: {ansible_connection: local}\n"
        "  vars: {vllm_fleet_model: meta-llama/Llama-3.1-405B}\n"
        "  children:\n    vllm_nodes:\n      hosts:\n"
        "        gpu-1: {ansible_host: 192.0.2.1, vllm_fleet_gpu: T4, vllm_fleet_gpu_count: 1}\n"
    )
    result = _run(inventory, tmp_path / "art")
    assert result.returncode != 0
    assert "no layout fits meta-llama/Llama-3.1-405B" in result.stdout + result.stderr
    # No play ever ran on the GPU node (192.0.2.1 is unreachable by design).
    assert "gpu-1" not in result.stdout.split("PLAY RECAP")[-1]
    assert not (tmp_path / "art" / "plan.json").exists()


def test_the_multi_model_example_plans_and_prints_its_allocation(tmp_path: Path) -> None:
    """inventories/example-models through site.yml --tags plan: the allocation table, then the
    instances, in plan.md; plan.json holds every model's instances and the gateway's routes."""
    result = _run(ROOT / "inventories/example-models", tmp_path, "--tags", "plan")
    assert result.returncode == 0, result.stdout + result.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    routes = {r["model"]: len(r["upstreams"]) for r in plan["gateway"]["routes"]}
    assert routes == {"llama-70b": 2, "llama-8b": 2, "e5-mistral": 1}
    assert {i["served_model_name"] for i in plan["instances"]} == set(routes)
    table = (tmp_path / "plan.md").read_text()
    assert "Allocation of 3 model(s) on 2 node(s), 16 GPU(s)" in table and "Plan for 3 models" in table
