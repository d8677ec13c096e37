#!/usr/bin/env python3
"""One check of a vLLM launch, for the role's wait loop: does /health answer
200, and has the process crashed since it was started (restarted more often than
--regroups allows, or not running at all)? Prints one JSON line; exit 0 always.
Stdlib only.

A multi-node group's head restarts when a member leaves (group.py): a re-run that
restarts the members one after another makes the head re-form the group up to once
per member, so --regroups is the number of members (0 for a single-node launch).

    health.py --url URL --runtime container|systemd|process --name NAME [--state DIR] [--supervise PATH]
              [--regroups N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.error
import urllib.request


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()


def process_state(args: argparse.Namespace) -> tuple[bool, int, bool]:
    """(running, restarts since started, waiting to be restarted)."""
    if args.runtime == "container":
        out = run(["docker", "inspect", "-f", "{{.State.Running}} {{.State.Restarting}} {{.RestartCount}}", args.name])
        if not out:
            return False, 0, False
        running, restarting, restarts = out.split()
        return running == "true", int(restarts), restarting == "true"
    if args.runtime == "systemd":
        props = dict(
            line.split("=", 1)
            for line in run(
                ["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "-p", "NRestarts", args.name]
            ).splitlines()
            if "=" in line
        )
        restarts = int(props.get("NRestarts") or 0)
        if props.get("SubState") == "auto-restart":  # exited, waiting for RestartSec: one more restart
            return False, restarts + 1, True
        return props.get("ActiveState") in ("active", "activating", "reloading"), restarts, False
    status = json.loads(run([sys.executable, args.supervise, "status", "--state", args.state, "--name", args.name]))
    return bool(status["running"]), int(status.get("restarts", 0)), False


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--runtime", required=True, choices=["container", "systemd", "process"])
    parser.add_argument("--name", required=True)
    parser.add_argument("--state", default="")
    parser.add_argument("--supervise", default="")
    parser.add_argument("--regroups", type=int, default=0)
    args = parser.parse_args()
    healthy = http_ok(args.url)
    running, restarts, restarting = process_state(args)
    crashed = not healthy and (restarts > args.regroups or not (running or restarting))
    print(json.dumps({"healthy": healthy, "running": running, "restarts": restarts, "crashed": crashed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
