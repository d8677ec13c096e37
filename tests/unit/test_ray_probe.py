"""The ray_cluster role's placement feasibility check (pure Python, no Ray needed)."""

from __future__ import annotations

from types import ModuleType

from tests.conftest import ROOT, load_script


def _probe() -> ModuleType:
    return load_script(ROOT / "roles/ray_cluster/files/ray_probe.py")


NODES = [{"GPU": 4.0, "CPU": 1.0}, {"GPU": 4.0, "CPU": 1.0}, {"GPU": 2.0, "CPU": 1.0}]


def test_strict_spread_needs_a_distinct_node_per_bundle() -> None:
    fits = _probe().fits
    assert fits([{"GPU": 4}, {"GPU": 4}, {"GPU": 2}], NODES, "STRICT_SPREAD") is not None
    # Each bundle alone fits a node, but three GPU-4 bundles need three GPU-4 nodes: Ray would wait forever.
    assert fits([{"GPU": 4}, {"GPU": 4}, {"GPU": 4}], NODES, "STRICT_SPREAD") is None
    assert fits([{"GPU": 1}] * 4, NODES, "STRICT_SPREAD") is None


def test_pack_and_strict_pack_use_capacity() -> None:
    fits = _probe().fits
    assert fits([{"GPU": 2}] * 5, NODES, "PACK") is not None
    assert fits([{"GPU": 2}] * 6, NODES, "PACK") is None
    assert fits([{"GPU": 2}, {"GPU": 2}], NODES, "STRICT_PACK") == [0, 0]
    assert fits([{"GPU": 4}, {"GPU": 2}], NODES, "STRICT_PACK") is None


def test_backtracking_finds_the_only_assignment() -> None:
    # Largest first: GPU-4 takes the 4-GPU node and GPU-3 the other.
    nodes = [{"GPU": 4.0}, {"GPU": 3.0}]
    assert _probe().fits([{"GPU": 3}, {"GPU": 4}], nodes, "SPREAD") == [1, 0]
