from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT

pytest.importorskip("ansible")


def _plugin() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_fleet_filter", ROOT / "plugins/filter/vllm_fleet.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_filters_return_the_cli_structure() -> None:
    filters = _plugin().FilterModule().filters()
    nodes = [{"name": "a800-node", "gpu": "A800", "gpu_count": 8}, {"name": "l20-node", "gpu": "L20", "gpu_count": 8}]
    plan = filters["vllm_fleet_plan"](nodes, "deepseek-ai/DeepSeek-R1", {"max_model_len": "32768", "port": 9000})
    assert plan["instances"][0]["layer_partition"] and plan["instances"][0]["port"] == 9000
    assert filters["vllm_fleet_instances_on"](plan, "l20-node") == plan["instances"]
    assert "Plan for deepseek-ai/DeepSeek-R1" in filters["vllm_fleet_plan_table"](plan)
    est = filters["vllm_fleet_estimate"]("Qwen/Qwen3-8B", 79.2, {"max_model_len": 8192})
    assert est["fits"]


def test_filter_errors_carry_the_planners_reason(tmp_path: Path) -> None:
    from ansible.errors import AnsibleFilterError

    filters = _plugin().FilterModule().filters()
    with pytest.raises(AnsibleFilterError, match=r"nodes\[0\] \(x\)\.gpu: unknown GPU 'Q1'"):
        filters["vllm_fleet_plan"]([{"name": "x", "gpu": "Q1", "gpu_count": 1}], "Qwen/Qwen3-8B")
    with pytest.raises(AnsibleFilterError, match=r"unknown wish\(es\) \['colour'\]"):
        filters["vllm_fleet_plan"]([{"name": "x", "gpu": "H100", "gpu_count": 1}], "Qwen/Qwen3-8B", {"colour": 1})


def test_the_plugin_puts_its_checkout_first() -> None:
    """A checkout's plugin plans with the checkout's own package, not an installed copy."""
    saved = list(sys.path)
    try:
        sys.path.insert(0, "/nonexistent/site-packages")
        _plugin()
        assert sys.path[0] == str(ROOT)
    finally:
        sys.path[:] = saved
