"""What the node agents share (vllm_fleet/agents/common.py), and that they stay runnable where
they run: a node's or a serving container's own python3, 3.10 or later."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import AGENTS, agent
from vllm_fleet.agents import common

# A leader that exits at once on SIGTERM and a child (same process group) that needs 0.5 s to
# finish its shutdown, then writes a file: vLLM's API server and an engine core freeing memory.
LEADER = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import signal, sys, time
def stop(*_):
    time.sleep(0.5)
    open(sys.argv[1], "w").write("clean")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
time.sleep(60)
''', sys.argv[1]])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
time.sleep(60)
"""


@pytest.mark.parametrize(("kill_rest", "cleaned"), [(False, True), (True, False)])
def test_stop_group_lets_the_rest_finish_unless_told(tmp_path: Path, kill_rest: bool, cleaned: bool) -> None:
    marker = tmp_path / "clean"
    leader = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LEADER), str(marker)], start_new_session=True)
    time.sleep(0.5)  # both started and their handlers set
    common.stop_group(leader.pid, 5.0, lambda: leader.poll() is not None, kill_rest=kill_rest)
    leader.wait(timeout=10)
    time.sleep(1.0)
    assert marker.exists() is cleaned


def test_runs_agent_knows_this_folders_agents() -> None:
    proc = subprocess.Popen([*agent("reap"), "--", sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)
        assert common.runs_agent(proc.pid, "reap") and not common.runs_agent(proc.pid, "watchdog")
        assert not common.runs_agent(1 << 22, "reap")  # no such process
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("path", sorted(AGENTS.glob("*.py")), ids=lambda p: p.name)
def test_the_agents_parse_as_python_3_10(path: Path) -> None:
    """Ubuntu 22.04 and some serving images run 3.10: no syntax of a later release."""
    ast.parse(path.read_text(), feature_version=(3, 10))
