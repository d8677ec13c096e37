#!/usr/bin/env python3
"""One check of a vLLM launch, for the role's wait loop: does /health answer
200, and has the process crashed since it was started (restart count > 0, or
not running at all)? Prints one JSON line; exit 0 always. Stdlib only.

    health.py --url URL --runtime container|systemd|process --name NAME [--state DIR] [--supervise PATH]
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


def process_state(args: argparse.Namespace) -> tuple[bool, int]:
    if args.runtime == "container":
        out = run(["docker", "inspect", "-f", "{{.State.Running}} {{.RestartCount}}", args.name])
        if not out:
            return False, 0
        running, restarts = out.split()
        return running == "true", int(restarts)
    if args.runtime == "systemd":
        props = dict(
            line.split("=", 1)
            for line in run(
                ["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "-p", "NRestarts", args.name]
            ).splitlines()
            if "=" in line
        )
        restarts = int(props.get("NRestarts") or 0)
        if props.get("SubState") == "auto-restart":  # exited, waiting for RestartSec: it crashed
            return False, restarts + 1
        return props.get("ActiveState") in ("active", "activating", "reloading"), restarts
    status = json.loads(run([sys.executable, args.supervise, "status", "--state", args.state, "--name", args.name]))
    return bool(status["running"]), int(status.get("restarts", 0))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--runtime", required=True, choices=["container", "systemd", "process"])
    parser.add_argument("--name", required=True)
    parser.add_argument("--state", default="")
    parser.add_argument("--supervise", default="")
    args = parser.parse_args()
    healthy = http_ok(args.url)
    running, restarts = process_state(args)
    crashed = not healthy and (not running or restarts > 0)
    print(json.dumps({"healthy": healthy, "running": running, "restarts": restarts, "crashed": crashed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
