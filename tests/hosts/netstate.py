"""Record what Podman's and dockerd's networking change on the machine, and put it back.

Both turn on ``net.ipv4.ip_forward`` and add iptables chains and rules; dockerd
also sets the FORWARD policy to DROP, adds a ``docker0`` bridge and leaves cgroup
folders behind. Before either starts we snapshot the machine (once, shared) and
the iptables rules (per owner). Teardown removes the rules and chains that the
owner added, and restores ip_forward and the FORWARD policy once neither owner
is left running.
"""

from __future__ import annotations

import json
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.hosts.common import HOME, run, say

TABLES = ("filter", "nat")
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
CGROUP_ROOT = Path("/sys/fs/cgroup")
ORIGINAL = HOME / "net-original.json"


@dataclass(frozen=True)
class Owner:
    """Who changes the network: its chain-name prefixes, interfaces and cgroup folders."""

    name: str
    chain_prefixes: tuple[str, ...]
    interfaces: tuple[str, ...]
    cgroup_folders: tuple[str, ...]

    @property
    def state_file(self) -> Path:
        return HOME / f"net-{self.name}.json"


PODMAN = Owner("podman", ("NETAVARK", "CNI-"), (), ("libpod_parent", "machine.slice"))
DOCKER = Owner("docker", ("DOCKER",), ("docker0",), ("docker",))


def _iptables() -> str | None:
    return shutil.which("iptables")


def _rules(table: str) -> list[str]:
    exe = _iptables()
    if exe is None:
        return []
    return run([exe, "-w", "-t", table, "-S"]).stdout.splitlines()


def _forward_policy() -> str:
    for line in _rules("filter"):
        if line.startswith("-P FORWARD "):
            return line.split()[2]
    return "ACCEPT"


def _cgroup_dirs(names: tuple[str, ...]) -> list[str]:
    if not CGROUP_ROOT.is_dir():
        return []
    found = []
    for controller in sorted(CGROUP_ROOT.iterdir()):
        for name in names:
            if (controller / name).is_dir():
                found.append(str(controller / name))
    return found


def record(owner: Owner) -> None:
    """Snapshot the machine before ``owner`` changes it (keeps an earlier snapshot)."""
    HOME.mkdir(parents=True, exist_ok=True)
    if not ORIGINAL.exists():
        ORIGINAL.write_text(
            json.dumps({"ip_forward": IP_FORWARD.read_text().strip(), "forward_policy": _forward_policy()}) + "\n"
        )
    if not owner.state_file.exists():
        state = {
            "rules": {t: _rules(t) for t in TABLES},
            "cgroups": _cgroup_dirs(owner.cgroup_folders),
            "interfaces": [i for i in owner.interfaces if Path("/sys/class/net", i).exists()],
        }
        owner.state_file.write_text(json.dumps(state, indent=1) + "\n")


def owned(owner: Owner, rule: str) -> bool:
    """Whether an ``iptables -S`` line belongs to ``owner`` (its chain, its jump target, its interface)."""
    words = shlex.split(rule)
    if len(words) < 2:
        return False
    chain = words[1]
    target = words[words.index("-j") + 1] if "-j" in words[:-1] else ""
    return (
        chain.startswith(owner.chain_prefixes)
        or target.startswith(owner.chain_prefixes)
        or any(i in words for i in owner.interfaces)
    )


def owned_additions(owner: Owner, before: list[str], now: list[str]) -> list[str]:
    """The ``iptables -S`` lines that ``owner`` added since ``before``."""
    known = set(before)
    return [r for r in now if r not in known and owned(owner, r)]


def undo_commands(table: str, added: list[str]) -> list[list[str]]:
    """iptables arguments that remove ``added``: rules first (-D), then their chains (-F, -X)."""
    commands = [["-t", table, "-D", *shlex.split(r)[1:]] for r in added if r.startswith("-A ")]
    for rule in added:
        if rule.startswith("-N "):
            chain = shlex.split(rule)[1]
            commands += [["-t", table, "-F", chain], ["-t", table, "-X", chain]]
    return commands


def _load(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def restore(owner: Owner, *, others_running: bool) -> list[str]:
    """Undo what ``owner`` added since its snapshot; restore the machine if it is the last.

    Returns what could not be put back (empty: the machine is as it was).
    """
    problems: list[str] = []
    exe = _iptables()
    before = _load(owner.state_file)
    if exe is not None:
        for table in TABLES:
            old = before.get("rules", {}).get(table, [])
            for args in undo_commands(table, owned_additions(owner, old, _rules(table))):
                run([exe, "-w", *args], check=False)
            left = owned_additions(owner, old, _rules(table))
            if left:
                problems.append(f"iptables -t {table} still has {owner.name} rules: {left[:3]}")
    for iface in owner.interfaces:
        if iface not in before.get("interfaces", []) and Path("/sys/class/net", iface).exists():
            run(["ip", "link", "delete", iface], check=False)
            if Path("/sys/class/net", iface).exists():
                problems.append(f"interface {iface} is still there")
    kept = set(before.get("cgroups", []))
    for folder in _cgroup_dirs(owner.cgroup_folders):
        if folder not in kept and not _remove_cgroup_tree(Path(folder)):
            problems.append(f"cgroup folder {folder} is still there (a process still in it?)")
    owner.state_file.unlink(missing_ok=True)
    original = _load(ORIGINAL)
    if not others_running and original:
        if IP_FORWARD.read_text().strip() != original["ip_forward"]:
            IP_FORWARD.write_text(original["ip_forward"] + "\n")
        if exe is not None and _forward_policy() != original["forward_policy"]:
            run([exe, "-w", "-P", "FORWARD", original["forward_policy"]], check=False)
        now = (IP_FORWARD.read_text().strip(), _forward_policy() if exe else original["forward_policy"])
        if now != (original["ip_forward"], original["forward_policy"]):
            problems.append(f"ip_forward/FORWARD policy are {now}, were {original}")
        else:
            ORIGINAL.unlink()
            say(f"network restored: ip_forward={original['ip_forward']}, FORWARD policy {original['forward_policy']}")
    for problem in problems:
        say(f"warning: {problem}")
    return problems


def _remove_cgroup_tree(folder: Path) -> bool:
    """rmdir a cgroup folder bottom-up (cgroup folders cannot be removed with rm -r)."""
    children = sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for path in [*children, folder]:
        try:
            path.rmdir()
        except OSError:
            return False
    return True
