"""What a deployment on this machine exposes: the TCP listeners its services hold (from
/proc/net/tcp{,6}, each socket's owner by its inode, and the owner's systemd unit from its
cgroup), and the world-readable files and journal lines that hold a secret."""

from __future__ import annotations

import ipaddress
import os
import re
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Where the roles write on a node (and the serving venvs' own trees, skipped for their size).
WRITTEN = ("/etc/vllm-fleet", "/var/lib/vllm-fleet", "/opt/vllm-fleet", "/etc/systemd/system", "/etc/nginx",
           "/etc/prometheus", "/etc/default", "/var/log", "/tmp", "/run")  # fmt: skip
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "include", "share", "proc"}
BIG = 8 << 20


# A deployment's processes by their command line (where no systemd unit names them: a test
# machine without systemd runs the roles' services as supervised processes).
OURS = (
    "vllm",
    "nginx",
    "ray",
    "gcs_server",
    "raylet",
    "prometheus",
    "exporter",
    "/opt/vllm-fleet",
    "/var/lib/vllm-fleet",
)


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    pid: int | None
    unit: str
    command: str

    @property
    def ours(self) -> bool:
        return any(word in self.unit or word in self.command for word in OURS)

    def started_with(self, entry: bytes) -> bool:
        """Whether this process or one of its ancestors was started with environment ``entry``
        (a process that Ray's raylet starts gets its settings from the raylet, not its own env)."""
        pid = self.pid
        for _ in range(16):
            if not pid or pid <= 1:
                return False
            try:
                if entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    return True
                pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                return False
        return False

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        return ip.is_loopback or bool(mapped and mapped.is_loopback)


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words))


def _owners() -> dict[int, int]:
    owners: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    owners[int(target[8:-1])] = int(proc.name)
        except OSError:
            continue
    return owners


def _unit(pid: int | None) -> tuple[str, str]:
    if pid is None:
        return "", ""
    try:
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "", ""
    units = re.findall(r"/([^/\s]+\.service)", cgroup)
    return (units[-1] if units else cgroup.strip().rsplit("/", 1)[-1]), command


def listeners() -> list[Listener]:
    """Every listening TCP socket in this network namespace, with its owner where readable."""
    owners = _owners()
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            addr, port = fields[1].rsplit(":", 1)
            pid = owners.get(int(fields[9]))
            unit, command = _unit(pid)
            out.append(Listener(_address(addr), int(port, 16), pid, unit, command))
    return out


def world_readable_with(values: dict[str, bytes], roots: tuple[str, ...] = WRITTEN) -> list[str]:
    """Files under ``roots`` that anyone may read and that hold one of ``values``."""
    found = []
    for root in roots:
        for base, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not os.path.islink(os.path.join(base, d))]
            for name in files:
                path = os.path.join(base, name)
                try:
                    info = os.lstat(path)
                    if not stat.S_ISREG(info.st_mode) or not info.st_mode & stat.S_IROTH or info.st_size > BIG:
                        continue
                    data = Path(path).read_bytes()
                except OSError:
                    continue
                found += [f"{what} in {path} (mode {stat.filemode(info.st_mode)})"
                          for what, value in values.items() if value in data]  # fmt: skip
    return found


def journal_with(values: dict[str, bytes], since: str) -> list[str]:
    """Journal lines since ``since`` (journalctl's format) that hold one of ``values``."""
    done = subprocess.run(["journalctl", "--no-pager", "-o", "cat", "--since", since], capture_output=True, check=False)
    return [f"{what} in the journal" for what, value in values.items() if value in done.stdout]
