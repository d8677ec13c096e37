"""Why an instance is not serving, from its nodes: ``vllm-fleet status -i INVENTORY`` asks the
nodes of every unhealthy instance once (one ad hoc Ansible call, the inventory's own SSH
settings; :mod:`vllm_fleet.ops.why_node` runs there) for its unit's or container's state, its
restarts, the reap agent's backoff and the last lines of its log.

Only with an inventory: ``--plan`` alone has no way to the nodes. Nothing here changes a node.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vllm_fleet import tools

NODE_SCRIPT = Path(__file__).resolve().with_name("why_node.py")
CHECKOUT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120


def ask(inventory: str, wanted: Mapping[str, Sequence[str]], lines: int = 6) -> dict[str, dict[str, Any]]:
    """``wanted``: node name -> launch names. Returns node -> launch -> what the node says
    (why_node.py's object), or node -> {"error": why the node could not be asked}."""
    if not wanted:
        return {}
    launches = sorted({name for names in wanted.values() for name in names})
    command = " ".join([shlex.quote(str(NODE_SCRIPT)), "--lines", str(lines), *map(shlex.quote, launches)])
    argv = [
        tools.tool("ansible", "--inventory"), ":".join(sorted(wanted)), "-i", tools.inventory(inventory),
        "-m", "ansible.builtin.script", "-a", command,
    ]  # fmt: skip
    env = {**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, check=False, timeout=TIMEOUT_S, env=env, cwd=CHECKOUT
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {node: {"error": f"ansible did not answer ({type(exc).__name__})"} for node in wanted}
    return parse(done.stdout, wanted)


def parse(stdout: str, wanted: Mapping[str, Sequence[str]]) -> dict[str, dict[str, Any]]:
    """The json callback's output of the ad hoc call, per node (the launches it was asked about)."""
    try:
        results = json.loads(stdout[stdout.index("{") :])["plays"][0]["tasks"][0]["hosts"]
    except (ValueError, KeyError, IndexError, TypeError):
        return {node: {"error": "ansible printed no result"} for node in wanted}
    out: dict[str, dict[str, Any]] = {}
    for node, names in wanted.items():
        result = results.get(node)
        if not isinstance(result, dict):
            out[node] = {"error": "not asked (not in the inventory?)"}
        elif result.get("unreachable") or result.get("failed"):
            out[node] = {"error": str(result.get("msg") or "failed").splitlines()[0][:200]}
        else:
            try:
                seen = json.loads(result.get("stdout") or "")
            except ValueError:
                out[node] = {"error": "the node printed no JSON"}
                continue
            out[node] = {name: seen[name] for name in names if name in seen}
    return out


def notes(nodes: Sequence[str], launch: str, answers: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One instance's lines for the status table: per node, the launch's state and restarts,
    its exit and backoff, then its last log lines (indented)."""
    out = []
    for node in nodes:
        answer = answers.get(node) or {}
        if "error" in answer:
            out.append(f"{node}: could not ask the node: {answer['error']}")
            continue
        seen = answer.get(launch)
        if seen is None:
            out.append(f"{node}: no {launch} unit or container on the node (not deployed there?)")
            continue
        parts = [f"{seen.get('unit', launch)} {seen.get('state', '?')}", f"{seen.get('restarts', 0)} restart(s)"]
        parts += [str(seen[k]) for k in ("exit", "backoff") if seen.get(k)]
        out.append(f"{node}: " + ", ".join(parts) + ("; its last lines:" if seen.get("last_lines") else ""))
        out += [f"    {line}" for line in seen.get("last_lines") or []]
    return out
