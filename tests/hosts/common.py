"""Paths, settings and command helpers shared by the test-host harness.

Everything the harness makes lives under one work folder (``VLLM_FLEET_TEST_HOME``,
default ``/var/tmp/vllm-fleet-test``) so that it survives a fresh clone of the
repository and is reused by the next run on the same machine:

    cache/            debootstrap rootfs tarballs and wheel folders, named by their hash
    podman/           containers.conf, storage.conf, image storage, network definitions
    hosts/            throwaway SSH key, ssh_config, inventory.yml, hosts.json
    docker/           dockerd's data root, exec root, socket, pid file and log
    net-*.json        what the machine's network looked like before we changed it
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).resolve().parent
HOME = Path(os.environ.get("VLLM_FLEET_TEST_HOME", "/var/tmp/vllm-fleet-test"))
CACHE = HOME / "cache"

# The hosts' private network. Only these addresses and loopback are ever targets.
NETWORK = os.environ.get("VLLM_FLEET_TEST_NETWORK", "vllm-fleet-test")
SUBNET_PREFIX = os.environ.get("VLLM_FLEET_TEST_SUBNET_PREFIX", "10.77.0")
SUBNET = f"{SUBNET_PREFIX}.0/24"
GATEWAY = f"{SUBNET_PREFIX}.1"
HOST_LABEL = "io.vllm-fleet.test-host"
# A set of hosts of its own on the same network: CI runs the Molecule scenarios that touch only
# their hosts, then the container test, on lane "b" while lane "a" (the default, the only one a
# developer uses) runs the rest.
LANE = os.environ.get("VLLM_FLEET_TEST_LANE", "a")
LANE_LABEL = "io.vllm-fleet.test-lane"
LANES = "abcd"
DEFAULT_NODES = int(os.environ.get("VLLM_FLEET_TEST_NODES", "3"))
HOST_SHM_SIZE = os.environ.get("VLLM_FLEET_TEST_SHM_SIZE", "2g")
# A small filesystem on every host (tmpfs, memory used only as it fills): the disk-full checks
# (model_cache's molecule scenario, bench-faults' disk row) fill it to a known room.
SMALL_FS, SMALL_FS_SIZE = "/mnt/small", "16m"

SSH_OPTIONS = (
    "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "
    "-o IdentitiesOnly=yes -o ConnectTimeout=3 -o ServerAliveInterval=10"
)


class HarnessError(RuntimeError):
    """A harness step failed; the message says which and what to do."""


@dataclass(frozen=True)
class Node:
    name: str
    address: str

    @property
    def container(self) -> str:
        return f"vf-{self.name}" if LANE == "a" else f"vf-{LANE}-{self.name}"


def node_list(count: int) -> list[Node]:
    """node1..nodeN: lane "a" at <prefix>.11, .12, ...; lane "b" at .21, ...: each lane up to 9 hosts."""
    if LANE not in LANES or len(LANE) != 1:
        raise HarnessError(f"VLLM_FLEET_TEST_LANE must be one of {', '.join(LANES)}, got {LANE!r}")
    if not 1 <= count <= 9:
        raise HarnessError(f"--nodes must be between 1 and 9, got {count}")
    base = 10 * (LANES.index(LANE) + 1)
    return [Node(f"node{i}", f"{SUBNET_PREFIX}.{base + i}") for i in range(1, count + 1)]


def say(message: str) -> None:
    print(f"[hosts] {message}", flush=True)


def run(
    argv: Sequence[str | Path],
    *,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    capture: bool = True,
    timeout: float | None = None,
    input_text: str | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise with the command and its stderr."""
    args = [str(a) for a in argv]
    full_env = dict(os.environ, **env) if env else None
    try:
        result = subprocess.run(
            args,
            env=full_env,
            capture_output=capture,
            text=True,
            timeout=timeout,
            input=input_text,
            cwd=cwd,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"timed out after {timeout} s: {shlex.join(args)}") from exc
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout or "").strip()[-2000:] if capture else "(output above)"
        raise HarnessError(f"command failed (exit {result.returncode}): {shlex.join(args)}\n{detail}")
    return result


def wait_until(what: str, probe: Callable[[], bool], *, timeout: float, every: float = 1.0) -> None:
    """Poll ``probe`` until it is true, printing progress; raise after ``timeout``."""
    start = time.monotonic()
    last_note = start
    while True:
        if probe():
            say(f"{what}: ready after {time.monotonic() - start:.1f} s")
            return
        now = time.monotonic()
        if now - start > timeout:
            raise HarnessError(f"{what}: not ready after {timeout:.0f} s")
        if now - last_note >= 10:
            say(f"{what}: still waiting ({now - start:.0f}/{timeout:.0f} s)")
            last_note = now
        time.sleep(every)


def digest(parts: Iterable[str | bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:12]


def tree_digest(folder: Path, *extra: str) -> str:
    """Hash of every file's relative path and contents under ``folder`` (plus ``extra``)."""
    parts: list[str | bytes] = list(extra)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        parts += [str(path.relative_to(folder)), path.read_bytes()]
    return digest(parts)


# Debian packages the harness needs on the machine itself.
MACHINE_PACKAGES = {
    "podman": "podman",
    "runc": "runc",
    "debootstrap": "debootstrap",
    "newuidmap": "uidmap",
    "dockerd": "docker.io",
    "iptables": "iptables",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "gpg": "gnupg",  # signs the test apt repository (nvidia_container_toolkit scenario)
    "dpkg-deb": "dpkg",
    "promtool": "prometheus",  # the alert rules' unit tests (promtool test rules), dashboards' PromQL
    # The gateway's routing by model with real nginx and njs (tests/integration/test_gateway_routing.py).
    "nginx": "nginx",
    "/usr/lib/nginx/modules/ngx_http_js_module.so": "libnginx-mod-http-js",
    "pkill": "procps",  # Molecule cleanups stop the stand-in Hub and Podman's API service
}


def which(tool: str) -> str | None:
    """``shutil.which`` that also looks in the sbin folders (nginx is /usr/sbin/nginx)."""
    return shutil.which(
        tool, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
    )


def ensure_machine_packages() -> None:
    """Install what is missing with apt (the CI machine may be fresh)."""
    # A tool on PATH (root's PATH holds the sbin folders), or a file by its absolute path (a module).
    missing = sorted(
        {
            pkg
            for tool, pkg in MACHINE_PACKAGES.items()
            if not (Path(tool).exists() if tool.startswith("/") else which(tool))
        }
    )
    if not missing:
        return
    if os.geteuid() != 0:
        raise HarnessError(f"missing tools; as root run: apt-get install -y {' '.join(missing)}")
    say(f"installing {' '.join(missing)} with apt")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env, timeout=600)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env, timeout=1200)


def require_root() -> None:
    if os.geteuid() != 0:
        raise HarnessError("the test hosts need root (rootful Podman, dockerd, iptables); run as root")
