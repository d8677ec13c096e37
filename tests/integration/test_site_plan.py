"""site.yml on real inventories: the plan play end to end through ansible-playbook."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PLAYBOOK = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)) or shutil.which("ansible-playbook")
pytestmark = pytest.mark.skipif(PLAYBOOK is None, reason="ansible-playbook not installed")


def _run(inventory: Path, artifacts: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [str(PLAYBOOK), "site.yml", "-i", str(inventory), "-e", f"vllm_fleet_artifacts_dir={artifacts}", *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_local_inventory_plans_and_writes_artifacts(tmp_path: Path) -> None:
    result = _run(ROOT / "inventories/local", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Plan for" in result.stdout and "tiny-llama-0" in result.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    (inst,) = plan["instances"]
    assert "--kv-cache-memory-bytes" in inst["vllm_args"] and inst["env"]["VLLM_CPU_KVCACHE_SPACE"]
    assert (tmp_path / "plan.md").read_text().startswith("# vllm-fleet plan")
    # A second run changes nothing.
    again = _run(ROOT / "inventories/local", tmp_path)
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
