#!/usr/bin/python
"""Ansible module: the state a role last applied on a node, to skip a re-run that can change nothing.

A role records, after it converged, a digest of its inputs, the sha256, mode and owner of the
files it manages and the output of a few cheap probe commands (``systemctl is-active`` of its
units, the firewall chain it keeps, the packages it installed). The next run's first task asks
this module whether all of that is still so; only then does the role skip its other tasks. Any
difference (an input, an edited or removed file, a stopped unit, a flushed chain, a removed
package, a missing record) names itself in ``reason`` and the role converges as before.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: vllm_fleet_applied
short_description: Check or record the state a role applied on a node
description:
  - C(state=check) compares the recorded state with the node's (read-only, check mode safe).
  - C(state=record) writes it (root-only, 0600); changed only when the record differs.
options:
  path: {description: The record file., type: path, required: true}
  state: {description: check or record., type: str, choices: [check, record], default: check}
  inputs: {description: The role's inputs (hashed; secrets allowed, never returned)., type: raw, required: true}
  files: {description: Files (glob patterns allowed) the role manages., type: list, elements: path, default: []}
  probes: {description: Commands (argv lists) whose exit code and output the state includes., type: list,
           elements: list, default: []}
  pidfiles: {description: PID files whose process must be the same and alive., type: list, elements: path,
             default: []}
"""

RETURN = r"""
current: {description: True when the node is exactly as recorded., type: bool, returned: always}
reason: {description: The first difference found (empty when current)., type: str, returned: always}
"""


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _file(path: str) -> dict[str, Any] | None:
    try:
        info = os.stat(path)
        sha = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                sha.update(chunk)
        digest = sha.hexdigest()
    except OSError:
        return None
    return {"sha256": digest, "mode": oct(info.st_mode & 0o7777), "uid": info.st_uid, "gid": info.st_gid}


def _files(patterns: list[str], record: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pattern in patterns:
        paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        paths = [p for p in paths if p not in (record, record + ".part")]
        for path in paths:
            found[path] = _file(path)
        if not paths:
            found[pattern] = None
    return found


def _probe(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"error {type(exc).__name__}"
    return f"{done.returncode} " + hashlib.sha256(done.stdout).hexdigest()


def _pid(path: str) -> str:
    """The PID in ``path`` and whether that process is alive (not a zombie)."""
    try:
        with open(path, encoding="ascii") as handle:
            pid = int(handle.read().strip())
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            alive = handle.read().split(") ", 1)[1][0] != "Z"
    except (OSError, ValueError, IndexError):
        return "not running"
    return f"{pid} {'alive' if alive else 'zombie'}"


def state_now(params: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": 1,
        "inputs": _digest(params["inputs"]),
        "files": _files(params["files"], params["path"]),
        "probes": {" ".join(map(str, argv)): _probe([str(a) for a in argv]) for argv in params["probes"]},
        "pids": {path: _pid(path) for path in params["pidfiles"]},
    }


def difference(recorded: dict[str, Any], now: dict[str, Any]) -> str:
    """The first way ``now`` differs from ``recorded``, in words; empty when none."""
    if recorded.get("version") != now["version"]:
        return "no record of an earlier run"
    if recorded.get("inputs") != now["inputs"]:
        return "the role's inputs changed"
    files = recorded.get("files", {})
    for path, info in now["files"].items():
        if path not in files:
            return f"{path} is new"
        if files[path] != info:
            return f"{path} is missing" if info is None else f"{path} differs from the last run"
    if set(files) != set(now["files"]):
        return "the set of managed files changed"
    for path, pid in now["pids"].items():
        if recorded.get("pids", {}).get(path) != pid or not pid.endswith(" alive"):
            return f"the process of {path} is not the one the last run started ({pid})"
    for command, result in now["probes"].items():
        if recorded.get("probes", {}).get(command) != result:
            return f"`{command}` reports something else than after the last run"
    if set(recorded.get("probes", {})) != set(now["probes"]):
        return "the set of probes changed"
    return ""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["check", "record"], "default": "check"},
            "inputs": {"type": "raw", "required": True, "no_log": True},
            "files": {"type": "list", "elements": "path", "default": []},
            "probes": {"type": "list", "elements": "list", "default": []},
            "pidfiles": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    try:
        with open(path, encoding="utf-8") as handle:
            recorded = json.load(handle)
    except (OSError, ValueError):
        recorded = {}
    now = state_now(module.params)
    reason = difference(recorded, now)
    if module.params["state"] == "check":
        module.exit_json(changed=False, current=not reason, reason=reason)
    if not reason:
        module.exit_json(changed=False, current=True, reason="")
    if not module.check_mode:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        partial = path + ".part"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(now, handle, indent=1, sort_keys=True)
        os.replace(partial, path)
    module.exit_json(changed=True, current=True, reason=reason)


if __name__ == "__main__":
    main()
