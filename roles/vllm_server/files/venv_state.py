#!/usr/bin/env python3
"""What the host of vLLM's venv already holds, read in one call by tasks/venv.yml. Every
task is a round trip to the node: a no-change re-run of the CPU build paid eleven module
runs there (about 10 s of them `vllm --version`), and now pays this one. Run with the
venv's base Python (vllm_server_python), read-only:

    venv_state.py probe VENV LINE [--deb PKG ...] [--rpm PKG ...]

prints one JSON object:
  ensurepip  this Python can create a venv (`import ensurepip, venv`);
  apt        /usr/bin/apt-get exists (Debian, Ubuntu);
  present    of --deb (apt hosts, dpkg's status "installed") or --rpm (other hosts,
             `rpm -q --whatprovides`), the packages that are installed;
  installed  the requirements .vllm-fleet-package records (null: no such file);
  checked    .vllm-fleet-checked holds LINE and the fingerprint of the distributions
             installed in the venv now.

    venv_state.py record VENV LINE

writes .vllm-fleet-checked (LINE and that fingerprint) after `vllm --version` passed,
and prints {"changed": bool}. LINE names what was checked: the requirements and whether
the CPU build's fixes were applied. The fingerprint covers every `*.dist-info` folder of
the venv's site-packages, so any install or removal in the venv (pip, uv, the CPU fixes
themselves) makes the record stale and the next run checks again.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

INSTALLED = ".vllm-fleet-package"
CHECKED = ".vllm-fleet-checked"


def fingerprint(venv: Path) -> str:
    """sha256 of the sorted names of the venv's distributions (name-version.dist-info)."""
    names = sorted(
        f"{site.parent.name}/{entry.name}"
        for site in venv.glob("lib/python*/site-packages")
        for entry in site.glob("*.dist-info")
    )
    return hashlib.sha256("\n".join(names).encode()).hexdigest()


def can_create_venvs() -> bool:
    try:
        importlib.import_module("ensurepip")
        importlib.import_module("venv")
    except Exception:  # any failure: `python3 -m venv` would fail too
        return False
    return True


def deb_present(packages: list[str]) -> list[str]:
    """The packages whose dpkg status is "installed" (one dpkg-query for all)."""
    if not packages:
        return []
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Package} ${db:Status-Status}\n", *packages],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
    except OSError:
        return []
    installed = {line.split()[0] for line in out.splitlines() if line.split()[1:] == ["installed"]}
    return [p for p in packages if p in installed]


def rpm_present(packages: list[str]) -> list[str]:
    present = []
    for package in packages:
        try:
            done = subprocess.run(["rpm", "-q", "--whatprovides", package], capture_output=True, check=False)
        except OSError:
            return []
        if done.returncode == 0:
            present.append(package)
    return present


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def is_checked(venv: Path, line: str) -> bool:
    raw = read_text(venv / CHECKED)
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        return False
    return isinstance(record, dict) and record == {"line": line, "distributions": fingerprint(venv)}


def probe(venv: Path, line: str, deb: list[str], rpm: list[str]) -> dict[str, Any]:
    apt = os.path.exists("/usr/bin/apt-get")
    installed = read_text(venv / INSTALLED)
    return {
        "ensurepip": can_create_venvs(),
        "apt": apt,
        "present": deb_present(deb) if apt else rpm_present(rpm),
        "installed": installed.split() if installed is not None else None,
        "checked": is_checked(venv, line),
    }


def record(venv: Path, line: str) -> bool:
    """Write .vllm-fleet-checked (atomically, 0644); True when its content changed."""
    content = json.dumps({"line": line, "distributions": fingerprint(venv)}, sort_keys=True) + "\n"
    target = venv / CHECKED
    if read_text(target) == content:
        return False
    fd, tmp = tempfile.mkstemp(dir=venv, prefix=f"{CHECKED}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(content)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    return True


def _lists(args: list[str]) -> dict[str, list[str]]:
    lists: dict[str, list[str]] = {"--deb": [], "--rpm": []}
    current = None
    for arg in args:
        if arg in lists:
            current = arg
        elif current is None:
            raise SystemExit(f"venv_state.py: unexpected argument {arg!r}")
        else:
            lists[current].append(arg)
    return lists


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[0] not in ("probe", "record"):
        print(__doc__, file=sys.stderr)
        return 2
    command, venv, line = args[0], Path(args[1]), args[2]
    if command == "record":
        print(json.dumps({"changed": record(venv, line)}))
        return 0
    lists = _lists(args[3:])
    print(json.dumps(probe(venv, line, lists["--deb"], lists["--rpm"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
