"""What the commands that read an inventory need before they start: the inventory itself
(a path that exists and can be read, or Ansible's comma list of hosts) and the Ansible tool
they run, found beside this Python (the same virtual environment) or on PATH."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from vllm_fleet.errors import PlanError

# The package that brings each tool, for the fix of a missing one.
PACKAGES = {"ansible-playbook": "ansible-core", "ansible-inventory": "ansible-core", "ansible-vault": "ansible-core"}


def inventory(value: str, field: str = "--inventory") -> str:
    """``value`` when Ansible can read it; else one line naming the problem and the fix. A
    value with a comma and no such path is Ansible's host list (``host1,host2,``)."""
    path = Path(value).expanduser()
    if not path.exists():
        if "," in value:
            return value
        raise PlanError(field, f"{value} does not exist", "pass an inventory folder or file (inventories/<name>)")
    wanted = os.R_OK | os.X_OK if path.is_dir() else os.R_OK
    if not os.access(path, wanted):
        raise PlanError(field, f"{value} cannot be read by this user", "fix its permissions, or run as its owner")
    if path.is_dir() and not any(path.iterdir()):
        raise PlanError(field, f"{value} is an empty folder", "pass the folder that holds hosts.yml")
    return value


def tool(name: str, field: str) -> str:
    """The path of Ansible tool ``name``: beside this Python, else on PATH; else one line
    saying what to install."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found:
        return found
    raise PlanError(
        field,
        f"{name} is not installed",
        f"install {PACKAGES.get(name, name)} (pip install {PACKAGES.get(name, name)}, or make setup in a checkout)",
    )
