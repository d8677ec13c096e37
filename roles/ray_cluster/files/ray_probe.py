#!/usr/bin/env python3
"""Ask a running Ray cluster what it has, from its head node (installed by the ray_cluster role).

    ray_probe.py --address IP:PORT status
        -> {"nodes": N, "gpus": G, "members": [{"id": ..., "ip": ..., "gpus": ..., "cpus": ...}, ...]}
    ray_probe.py --address IP:PORT placement --bundles '[{"GPU": 4}, {"GPU": 4}]' --strategy STRICT_SPREAD
        -> {"state": "CREATED" | "INFEASIBLE" | "PENDING", "seconds": s, ...}; exit 3 unless CREATED

The placement group is always removed again. An infeasible group never errors in
Ray, it stays pending forever; this reads its scheduling state instead, so an
impossible layout fails in well under a second with the cluster's resources.
Token authentication: RAY_AUTH_MODE / RAY_AUTH_TOKEN_PATH come from the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def _connect(address: str) -> Any:
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False, include_dashboard=False)
    return ray


def status(address: str) -> dict[str, Any]:
    ray = _connect(address)
    members = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        resources = node.get("Resources", {})
        members.append(
            {
                "id": node.get("NodeID"),
                "ip": node.get("NodeManagerAddress"),
                "gpus": resources.get("GPU", 0.0),
                "cpus": resources.get("CPU", 0.0),
            }
        )
    members.sort(key=lambda m: str(m["ip"]))
    return {"nodes": len(members), "gpus": sum(m["gpus"] for m in members), "members": members}


def fits(bundles: list[dict[str, float]], nodes: list[dict[str, float]], strategy: str) -> list[int] | None:
    """A node index per bundle that respects the strategy and the nodes' total resources, or None.

    Ray marks a group INFEASIBLE only when no single node could hold a bundle; a
    STRICT_SPREAD over too few large nodes stays PENDING forever. This decides it
    from the totals (exact backtracking, largest bundles first; groups are small).
    """
    if strategy == "STRICT_PACK":
        total: dict[str, float] = {}
        for bundle in bundles:
            for key, value in bundle.items():
                total[key] = total.get(key, 0.0) + value
        for index, node in enumerate(nodes):
            if all(node.get(k, 0.0) >= v for k, v in total.items()):
                return [index] * len(bundles)
        return None
    order = sorted(range(len(bundles)), key=lambda i: -sum(bundles[i].values()))
    free = [dict(node) for node in nodes]
    used: set[int] = set()
    placed: list[int] = [-1] * len(bundles)

    def place(k: int) -> bool:
        if k == len(order):
            return True
        bundle = bundles[order[k]]
        for index, node in enumerate(free):
            if strategy == "STRICT_SPREAD" and index in used:
                continue
            if all(node.get(key, 0.0) >= value for key, value in bundle.items()):
                for key, value in bundle.items():
                    node[key] = node.get(key, 0.0) - value
                used.add(index)
                placed[order[k]] = index
                if place(k + 1):
                    return True
                used.discard(index)
                for key, value in bundle.items():
                    node[key] += value
        return False

    return placed if place(0) else None


def placement(address: str, bundles: list[dict[str, float]], strategy: str, timeout: float) -> dict[str, Any]:
    ray = _connect(address)
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    alive = [n for n in ray.nodes() if n.get("Alive")]
    totals = [{k: float(v) for k, v in n.get("Resources", {}).items()} for n in alive]
    result: dict[str, Any] = {
        "bundles": bundles,
        "strategy": strategy,
        "nodes": [
            {"ip": node.get("NodeManagerAddress"), "gpus": total.get("GPU", 0.0)}
            for node, total in zip(alive, totals, strict=True)
        ],
    }
    start = time.monotonic()
    if fits(bundles, totals, strategy) is None:
        gpus = ", ".join(f"{t.get('GPU', 0.0):g}" for t in totals)
        result.update(
            state="INFEASIBLE",
            seconds=round(time.monotonic() - start, 3),
            reason=f"{strategy} of {len(bundles)} bundles cannot fit nodes with GPUs [{gpus}] even when idle",
        )
        return result
    group = placement_group(bundles, strategy=strategy, name="vllm-fleet-probe")
    state = "PENDING"
    try:
        while time.monotonic() - start < timeout:
            table = placement_group_table(group)
            if table["state"] == "CREATED":
                state = "CREATED"
                break
            if table["stats"]["scheduling_state"] == "INFEASIBLE":
                state = "INFEASIBLE"
                break
            time.sleep(0.1)
    finally:
        remove_placement_group(group)
    result.update(state=state, seconds=round(time.monotonic() - start, 3))
    if state == "PENDING":
        result["reason"] = f"not scheduled in {timeout:g} s: the resources exist but are in use"
    elif state == "INFEASIBLE":
        result["reason"] = "Ray reports the group infeasible"
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", required=True)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status")
    p_pg = sub.add_parser("placement")
    p_pg.add_argument("--bundles", required=True, help="JSON list of resource dicts")
    p_pg.add_argument("--strategy", default="PACK", choices=["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"])
    p_pg.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    # Ray (Python and C++) prints to stdout while nodes come and go, and again from its exit
    # handlers. Keep stdout for the one JSON line the role parses: fd 1 points at stderr for the
    # rest of the process, and the answer goes to the saved original.
    sys.stdout.flush()
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    if args.command == "status":
        result = status(args.address)
    else:
        result = placement(args.address, json.loads(args.bundles), args.strategy, args.timeout)
    answer.write(json.dumps(result) + "\n")
    answer.close()
    return 0 if args.command == "status" or result["state"] == "CREATED" else 3


if __name__ == "__main__":
    sys.exit(main())
