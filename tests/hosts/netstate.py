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


def _owned(owner: Owner, rule: str) -> bool:
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


def restore(owner: Owner, *, others_running: bool) -> None:
    """Undo what ``owner`` added since its snapshot; restore the machine if it is the last."""
    exe = _iptables()
    before: dict[str, object] = {}
    if owner.state_file.exists():
        before = json.loads(owner.state_file.read_text())
    old_rules: dict[str, list[str]] = before.get("rules", {t: [] for t in TABLES})  # type: ignore[assignment]
    if exe is not None:
        for table in TABLES:
            now = _rules(table)
            known = set(old_rules.get(table, []))
            added = [r for r in now if r not in known and _owned(owner, r)]
            for rule in added:
                if rule.startswith("-A "):
                    run([exe, "-w", "-t", table, "-D", *shlex.split(rule)[1:]], check=False)
            for rule in added:
                if rule.startswith("-N "):
                    chain = shlex.split(rule)[1]
                    run([exe, "-w", "-t", table, "-F", chain], check=False)
                    run([exe, "-w", "-t", table, "-X", chain], check=False)
            left = [r for r in _rules(table) if r not in known and _owned(owner, r)]
            if left:
                say(f"warning: iptables -t {table} still has {len(left)} {owner.name} rule(s): {left[:3]}")
    for iface in owner.interfaces:
        if iface not in before.get("interfaces", []) and Path("/sys/class/net", iface).exists():  # type: ignore[operator]
            run(["ip", "link", "delete", iface], check=False)
    kept = {str(c) for c in before.get("cgroups", [])}  # type: ignore[attr-defined]
    for folder in _cgroup_dirs(owner.cgroup_folders):
        if folder not in kept:
            _remove_cgroup_tree(Path(folder))
    owner.state_file.unlink(missing_ok=True)
    if not others_running and ORIGINAL.exists():
        original = json.loads(ORIGINAL.read_text())
        if IP_FORWARD.read_text().strip() != original["ip_forward"]:
            IP_FORWARD.write_text(original["ip_forward"] + "\n")
        if exe is not None and _forward_policy() != original["forward_policy"]:
            run([exe, "-w", "-P", "FORWARD", original["forward_policy"]], check=False)
        ORIGINAL.unlink()
        say(f"network restored: ip_forward={original['ip_forward']}, FORWARD policy {original['forward_policy']}")


def _remove_cgroup_tree(folder: Path) -> None:
    """rmdir a cgroup folder bottom-up (cgroup folders cannot be removed with rm -r)."""
    children = sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for path in [*children, folder]:
        try:
            path.rmdir()
        except OSError as exc:
            say(f"warning: cgroup {path} left in place ({exc.strerror})")
            return
