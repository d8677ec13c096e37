#!/usr/bin/env python3
"""The node's watchdog for hung vLLM launches: a process that crashed is restarted by
its supervisor (systemd's Restart=, Docker's restart policy), but one that is alive and
hung (a stuck engine, a stopped process) keeps its port and never exits. This asks each
serving launch's /health every interval; after ``failures`` failed checks in a row it
kills the launch and starts it again. A multi-node group follows its head: the group
wrapper (group.py) of every member sees the head go and restarts its rank with it.

A launch is watched only once it answered after its (re)start: vLLM loads and profiles
for minutes first, which the role's start-up wait covers. A launch that is not running
(stopped by the operator or the role) is left alone. Stdlib only.

    watchdog.py --config watchdog.json

watchdog.json: {"interval": S, "timeout": S, "failures": N, "status": PATH,
                "launches": [{"name": N, "url": URL, "runtime": "systemd"|"container", "unit": UNIT}]}
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def say(text: str) -> None:
    print(f"vllm-fleet watchdog: {text}", flush=True)


def healthy(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
        # HTTPException: something on the port that is not HTTP (BadStatusLine is no OSError).
        return False


def _out(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60).stdout.strip()


def generation(launch: dict[str, Any]) -> str | None:
    """What identifies this start of the launch (None: not running)."""
    if launch["runtime"] == "container":
        out = _out(["docker", "inspect", "-f", "{{.State.Running}} {{.State.StartedAt}}", launch["unit"]])
        running, _, started = out.partition(" ")
        return started if running == "true" else None
    props = dict(
        line.split("=", 1)
        for line in _out(["systemctl", "show", "-p", "ActiveState", "-p", "MainPID", launch["unit"]]).splitlines()
        if "=" in line
    )
    if props.get("ActiveState") != "active" or props.get("MainPID", "0") == "0":
        return None
    return props["MainPID"]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _is_reaper(pid: str) -> bool:
    """Whether the unit's main process is vllm_server's reap.py (the unit runs vLLM under it)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.endswith(b"/reap.py") for arg in argv[:3])


def restart(launch: dict[str, Any]) -> None:
    if launch["runtime"] == "container":
        _out(["docker", "restart", "--time", "0", launch["unit"]])
        return
    # SIGKILL reaches a stopped process too (SIGTERM would wait for SIGCONT).
    main = _out(["systemctl", "show", "-p", "MainPID", "--value", launch["unit"]])
    if main.isdigit() and main != "0" and _is_reaper(main):
        # Everything below reap.py, not reap.py itself: it reaps them and exits with the launch's
        # status once none is left, so systemd sees an empty unit at once. Killing the main
        # process too would leave systemd waiting TimeoutStopSec for a cgroup-empty
        # notification that the legacy cgroup hierarchy in a container never sends.
        for pid in descendants(int(main)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    else:
        # Every process of the unit (vLLM's engine and workers are its children).
        _out(["systemctl", "kill", "--signal=SIGKILL", launch["unit"]])
    _out(["systemctl", "restart", launch["unit"]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    args = parser.parse_args(argv)
    config = json.loads(args.config.read_text())
    interval, timeout = float(config.get("interval", 2)), float(config.get("timeout", 3))
    failures = int(config.get("failures", 3))
    status_path = Path(config["status"]) if config.get("status") else None
    launches: list[dict[str, Any]] = list(config["launches"])
    state = {launch["name"]: {"gen": None, "watched": False, "fails": 0, "restarts": 0} for launch in launches}
    stop = False

    def _stop(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    say(f"watching {len(launches)} launch(es) every {interval:g} s; {failures} failed checks in a row restart one")
    while not stop:
        started = time.monotonic()
        for launch in launches:
            st = state[launch["name"]]
            gen = generation(launch)
            if gen is None or gen != st["gen"]:
                # Not running, or started again (by the role, systemd or us): wait for its first answer.
                st.update(gen=gen, watched=False, fails=0)
                if gen is None:
                    continue
            if healthy(launch["url"], timeout):
                if not st["watched"]:
                    say(f"{launch['name']}: answers /health; watching it")
                st.update(watched=True, fails=0)
                continue
            if not st["watched"]:
                continue
            st["fails"] += 1
            if st["fails"] >= failures:
                say(
                    f"{launch['name']}: /health did not answer {st['fails']} times in a row "
                    f"({timeout:g} s each) while the process runs: hung; killing and restarting it"
                )
                restart(launch)
                st.update(gen=generation(launch), watched=False, fails=0, restarts=st["restarts"] + 1)
        if status_path is not None:
            tmp = status_path.with_name(f".{status_path.name}.tmp")
            tmp.write_text(json.dumps({"updated": time.time(), "launches": state}, sort_keys=True) + "\n")
            os.replace(tmp, status_path)
        time.sleep(max(0.0, interval - (time.monotonic() - started)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
