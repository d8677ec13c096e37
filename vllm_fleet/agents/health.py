"""One check of a vLLM launch, for the role's wait loop: does /health answer
200, and has the process crashed since it was started (restarted more often than
--regroups allows, or not running at all)? Prints one JSON line; exit 0 always.

A multi-node group's head restarts when a member leaves (the group agent): a re-run that
restarts the members one after another makes the head re-form the group up to once
per member, so --regroups is the number of members (0 for a single-node launch).

    health --url URL --runtime container|systemd|process --name NAME [--state DIR] [--regroups N]

--state: the supervise agent's state folder (runtime process).
"""

from __future__ import annotations

import argparse
import json

from . import supervise
from .common import container_state, http_ok, unit_props


def process_state(args: argparse.Namespace) -> tuple[bool, int, bool]:
    """(running, restarts since started, waiting to be restarted)."""
    if args.runtime == "container":
        found = container_state(args.name, ".State.Running", ".State.Restarting", ".RestartCount")
        if len(found) != 3:
            return False, 0, False
        running, restarting, count = found
        return running == "true", int(count), restarting == "true"
    if args.runtime == "systemd":
        props = unit_props(args.name, "ActiveState", "SubState", "NRestarts")
        restarts = int(props.get("NRestarts") or 0)
        if props.get("SubState") == "auto-restart":  # exited, waiting for RestartSec: one more restart
            return False, restarts + 1, True
        return props.get("ActiveState") in ("active", "activating", "reloading"), restarts, False
    status = supervise.status(supervise.paths(args.state, args.name))
    return bool(status["running"]), int(str(status["restarts"])), False


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="health")
    parser.add_argument("--url", required=True)
    parser.add_argument("--runtime", required=True, choices=["container", "systemd", "process"])
    parser.add_argument("--name", required=True)
    parser.add_argument("--state", default="")
    parser.add_argument("--regroups", type=int, default=0)
    args = parser.parse_args(argv)
    healthy = http_ok(args.url, 5)
    running, restarts, restarting = process_state(args)
    crashed = not healthy and (restarts > args.regroups or not (running or restarting))
    print(json.dumps({"healthy": healthy, "running": running, "restarts": restarts, "crashed": crashed}))
    return 0
