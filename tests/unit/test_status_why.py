"""``vllm-fleet status -i``: what the nodes of an unhealthy instance say (vllm_fleet/ops/why.py,
and why_node.py, which runs on the node)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from vllm_fleet.agents import reap
from vllm_fleet.ops import why, why_node


def test_the_last_lines_fold_progress_bars_and_skip_blank_ones() -> None:
    text = "a\n\nload 10%\rload 100%\nvllm: error: unrecognized arguments: --no-such-flag\n  \n"
    assert why_node.tail(text, 2) == ["load 100%", "vllm: error: unrecognized arguments: --no-such-flag"]
    assert why_node.tail(text, 9) == ["a", "load 100%", "vllm: error: unrecognized arguments: --no-such-flag"]


def test_backoff_in_words(tmp_path: Path) -> None:
    state = tmp_path / "vllm-x.backoff"
    now = time.time()
    assert why_node.backoff(state, now) is None  # no file: never failed quickly
    state.write_text(json.dumps({"key": "k", "failures": 3, "exited": now - 5, "due": now + 35}))
    assert why_node.backoff(state, now) == "3 quick failure(s) in a row; the next start waits until 35 s from now"
    state.write_text(json.dumps({"key": "k", "failures": 3, "exited": now - 50, "due": now - 10}))
    assert why_node.backoff(state, now) == "3 quick failure(s) in a row"
    state.write_text(json.dumps({"key": "k", "failures": 0, "exited": now}))
    assert why_node.backoff(state, now) is None


def test_notes_per_node() -> None:
    answers = {
        "node1": {"error": "UNREACHABLE"},
        "node2": {},
        "node3": {
            "vllm-tiny-0": {
                "unit": "vllm-fleet-vllm-tiny-0.service", "state": "activating (auto-restart)", "restarts": 4,
                "exit": "exit 2", "backoff": "4 quick failure(s) in a row", "last_lines": ["usage: vllm", "error: x"],
            }
        },
    }  # fmt: skip
    assert why.notes(["node3", "node1", "node2"], "vllm-tiny-0", answers) == [
        "node3: vllm-fleet-vllm-tiny-0.service activating (auto-restart), 4 restart(s), exit 2, "
        "4 quick failure(s) in a row; its last lines:",
        "    usage: vllm",
        "    error: x",
        "node1: could not ask the node: UNREACHABLE",
        "node2: no vllm-tiny-0 unit or container on the node (not deployed there?)",
    ]


def test_asking_a_node_through_ansible(tmp_path: Path) -> None:
    """The real ad hoc call (json callback, script module) on this machine as the node: it has
    no such unit or container, and says so; a node the inventory lacks is named."""
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"here": local}}}))
    answers = why.ask(str(inventory), {"here": ["vllm-nothing"], "elsewhere": ["vllm-nothing"]})
    assert answers["here"] == {}
    assert "error" in answers["elsewhere"]
    assert why.notes(["here"], "vllm-nothing", answers) == [
        "here: no vllm-nothing unit or container on the node (not deployed there?)"
    ]


def test_what_reap_records_is_what_status_reads(tmp_path: Path) -> None:
    """reap writes ``due`` (its own backoff rule) at each exit; why_node.py only reads it."""
    state = tmp_path / "vllm-x.backoff"
    reap.record_exit(state, "k", 3, ran=5.0, failed=True, now=1000.0)  # the 4th quick failure: 80 s
    assert json.loads(state.read_text())["due"] == pytest.approx(1080.0)
    assert reap.backoff_wait(state, "k", 1010.0) == pytest.approx((70.0, 4))
    assert why_node.backoff(state, 1010.0) == "4 quick failure(s) in a row; the next start waits until 70 s from now"
    reap.record_exit(state, "k", 4, ran=5.0, failed=False, now=2000.0)
    assert why_node.backoff(state, 2000.0) is None
