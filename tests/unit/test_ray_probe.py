"""The ray_cluster role's placement feasibility check (pure Python, no Ray needed)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
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


def test_stdout_holds_only_the_answer_whatever_ray_prints(tmp_path: Path) -> None:
    """Ray prints to stdout while nodes rejoin and from its exit handlers; the role parses stdout
    as one JSON document, so anything else must go to stderr."""
    driver = tmp_path / "driver.py"
    driver.write_text(
        textwrap.dedent(
            f"""
            import atexit, os, sys
            sys.path.insert(0, {str(ROOT / "roles/ray_cluster/files")!r})
            import ray_probe

            def status(address):
                print("(raylet) node rejoined")
                os.write(1, b"C++ log line\\n")
                atexit.register(lambda: print("shutdown noise"))
                return {{"nodes": 3, "gpus": 10.0, "members": []}}

            ray_probe.status = status
            sys.argv = ["ray_probe.py", "--address", "10.0.0.1:6379", "status"]
            sys.exit(ray_probe.main())
            """
        )
    )
    done = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == {"nodes": 3, "gpus": 10.0, "members": []}
    assert "rejoined" in done.stderr and "C++ log line" in done.stderr and "shutdown noise" in done.stderr
