#!/usr/bin/env python3
"""Why a vLLM launch is not serving, as its node sees it: ``vllm-fleet status -i INVENTORY``
sends this file to the nodes of every instance that is not healthy (Ansible's script module)
and shows what it prints. Standard library only: it runs with the node's python3.

    why_node.py [--lines N] [--state-dir DIR] LAUNCH...
        -> {"LAUNCH": {"runtime": "systemd"|"container", "state": "...", "restarts": N,
                       "exit": "...", "backoff": "...", "last_lines": [...]}, ...}

A launch that is on this node as neither a unit nor a container is left out. The unit is
vllm_server's ``vllm-fleet-LAUNCH.service``; its journal's last lines are vLLM's own output
and the reap agent's (``backing off``), not systemd's messages about the unit; the backoff
state is reap's ``LAUNCH.backoff`` in the role's state folder. The container is ``LAUNCH`` (``docker logs``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

UNIT_PREFIX = "vllm-fleet-"
STATE_DIR = "/var/lib/vllm-fleet/vllm"
PROPS = ("LoadState", "ActiveState", "SubState", "NRestarts", "ExecMainStatus", "ExecMainCode", "Result")


def _run(argv: list[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return done.returncode, done.stdout + (done.stderr if done.returncode else "")


def tail(text: str, lines: int) -> list[str]:
    """The last ``lines`` lines that say something (progress bars' carriage returns folded)."""
    kept = [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]
    return [line[:300] for line in kept if line.strip()][-lines:]


def backoff(path: Path, now: float) -> str | None:
    """reap's backoff state, in words: the quick failures in a row, and when the next start may
    come (``due``, which reap writes at each exit)."""
    try:
        data = json.loads(path.read_text())
        failures = int(data["failures"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if failures < 1:
        return None
    said = f"{failures} quick failure(s) in a row"
    due = data.get("due")
    if isinstance(due, (int, float)) and due > now:
        said += f"; the next start waits until {due - now:.0f} s from now"
    return said


def systemd(launch: str, lines: int, state_dir: str) -> dict[str, Any] | None:
    unit = f"{UNIT_PREFIX}{launch}.service"
    rc, out = _run(["systemctl", "show", *(f"--property={p}" for p in PROPS), unit])
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if rc != 0 or props.get("LoadState") != "loaded":
        return None
    # The launch's own output (the unit's SyslogIdentifier, vllm_server's vllm.service.j2): vLLM's,
    # the reap and group agents'; not systemd's restart messages about the unit.
    argv = ["journalctl", "--unit", unit, "--identifier", "vllm", "--lines", str(lines * 4), "--output", "cat"]
    _, journal = _run([*argv, "--no-pager"])
    code, status = props.get("ExecMainCode", ""), props.get("ExecMainStatus", "")
    exited = {"1": f"exit {status}", "2": f"killed by signal {status}", "3": f"dumped core, signal {status}"}
    return {
        "runtime": "systemd",
        "unit": unit,
        "state": f"{props.get('ActiveState', '?')} ({props.get('SubState', '?')})",
        "restarts": int(props.get("NRestarts") or 0),
        "exit": exited.get(code, "") if status not in ("", "0") else "",
        "backoff": backoff(Path(state_dir) / f"{launch}.backoff", time.time()),
        "last_lines": tail(journal, lines),
    }


def container(launch: str, lines: int) -> dict[str, Any] | None:
    rc, out = _run(["docker", "inspect", "--format", "{{json .State}}|{{.RestartCount}}", launch])
    if rc != 0 or "|" not in out:
        return None
    state_text, restarts = out.strip().rsplit("|", 1)
    try:
        state = json.loads(state_text)
    except ValueError:
        return None
    _, logs = _run(["docker", "logs", "--tail", str(lines * 4), launch])
    code = int(state.get("ExitCode") or 0)
    return {
        "runtime": "container",
        "unit": launch,
        "state": str(state.get("Status", "?")) + (" (restarting)" if state.get("Restarting") else ""),
        "restarts": int(restarts or 0),
        "exit": f"exit {code}" if code else "",
        "backoff": None,
        "last_lines": tail(logs, lines),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="why_node.py", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=6)
    parser.add_argument("--state-dir", default=STATE_DIR)
    parser.add_argument("launches", nargs="+")
    args = parser.parse_args(argv)
    found = {}
    for launch in args.launches:
        seen = systemd(launch, args.lines, args.state_dir) or container(launch, args.lines)
        if seen is not None:
            found[launch] = seen
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
