"""Test hosts: Podman containers with systemd and sshd on a private network.

``up`` starts N hosts (node1..nodeN at <prefix>.11, .12, ...), writes an SSH
config and an Ansible inventory for them and waits until every host's systemd
is up and sshd answers. ``down`` removes the hosts and the network and restores
what the network changed. Both are idempotent and safe to call after a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import yaml

from tests.hosts import netstate
from tests.hosts.common import (
    DEFAULT_NODES,
    GATEWAY,
    HOME,
    HOST_LABEL,
    HOST_SHM_SIZE,
    LANE,
    LANE_LABEL,
    NETWORK,
    SMALL_FS,
    SMALL_FS_SIZE,
    SSH_OPTIONS,
    SUBNET,
    HarnessError,
    Node,
    digest,
    node_list,
    run,
    say,
    wait_until,
)
from tests.hosts.images import host_image, podman, podman_env, podman_ok, wheel_folder

HOSTS_DIR = HOME / ("hosts" if LANE == "a" else f"hosts-{LANE}")
KEY = HOSTS_DIR / "id_ed25519"
SSH_CONFIG = HOSTS_DIR / "ssh_config"
INVENTORY = HOSTS_DIR / "inventory.yml"
STATE = HOSTS_DIR / "hosts.json"


def _ensure_key() -> None:
    HOSTS_DIR.mkdir(parents=True, exist_ok=True)
    if not KEY.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vllm-fleet-test-hosts", "-f", KEY])
    KEY.chmod(0o600)


def _ensure_network() -> None:
    netstate.record(netstate.PODMAN)
    if podman_ok("network", "exists", NETWORK):
        return
    say(f"creating network {NETWORK} ({SUBNET})")
    podman("network", "create", "--disable-dns", "--subnet", SUBNET, "--gateway", GATEWAY, NETWORK)


def our_containers(*, every_lane: bool = False) -> list[str]:
    """This lane's hosts (every lane's: also those of a lane that ran alongside and did not end)."""
    lane = [] if every_lane else ["--filter", f"label={LANE_LABEL}={LANE}"]
    out = podman("ps", "-a", "--filter", f"label={HOST_LABEL}", *lane, "--format", "{{.Names}}", check=False)
    return sorted(out.split())


def active() -> bool:
    """Whether the hosts' network or any host is still there."""
    return podman_ok("network", "exists", NETWORK) or bool(our_containers())


def _config_and_state(name: str) -> tuple[str, bool] | None:
    """The host's definition hash and whether it runs; None when there is no such container."""
    fmt = f'{{{{index .Config.Labels "{HOST_LABEL}"}}}} {{{{.State.Running}}}}'
    out = podman("inspect", "--format", fmt, name, check=False).split()
    if len(out) != 2:
        return None
    return out[0], out[1] == "true"


def engine_dir(node: Node) -> Path:
    """Where an engine-capable host keeps /var/lib/docker: a folder of this machine's disk, so that
    the host's dockerd gets overlay2 (overlay on the host's own overlay root does not mount)."""
    return HOSTS_DIR / "engines" / node.name


def _engine_options(node: Node) -> list[str]:
    """A test host that runs its own Docker Engine (the docker role's dockerd, under its systemd).

    dockerd creates cgroups, mounts overlays and namespaces, and writes /proc/sys: that takes a
    privileged container, and a private cgroup namespace so that the host's systemd and dockerd
    see only the host's own cgroup tree (the machine's stays out of reach and out of their way).
    What dockerd leaves in the machine's cgroup tree goes with the host's own cgroup folder
    (netstate's PODMAN owner removes what podman leaves)."""
    folder = engine_dir(node)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return ["--privileged", "--cgroupns", "private", "--volume", f"{folder}:/var/lib/docker"]


def _start(node: Node, nodes: list[Node], image: str, wheels: Path, config: str, engines: bool) -> None:
    hosts = [f"--add-host={other.name}:{other.address}" for other in nodes]
    podman(
        "run", "--detach", "--name", node.container, "--hostname", node.name,
        "--label", f"{HOST_LABEL}={config}", "--label", f"{LANE_LABEL}={LANE}",
        "--network", NETWORK, "--ip", node.address,
        "--systemd=always", "--shm-size", HOST_SHM_SIZE, "--stop-timeout", "0",
        "--tmpfs", f"{SMALL_FS}:size={SMALL_FS_SIZE},mode=0755",
        # Root on a real host may change its firewall (ray_cluster_firewall); only this host's netns.
        "--cap-add", "NET_ADMIN",
        *(_engine_options(node) if engines else []),
        *hosts,
        "--volume", f"{KEY}.pub:/root/.ssh/authorized_keys:ro",
        "--volume", f"{wheels}:/opt/wheels:ro",
        image,
    )  # fmt: skip


def _write_access_files(nodes: list[Node], engines: bool) -> None:
    lines = [f"# Written by tests/hosts: ssh -F {SSH_CONFIG} node1\n"]
    for node in nodes:
        lines.append(
            f"Host {node.name} {node.address}\n  HostName {node.address}\n  User root\n"
            f"  IdentityFile {KEY}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
            "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  ConnectTimeout 3\n"
        )
    SSH_CONFIG.write_text("".join(lines))
    inventory = {
        "all": {
            "hosts": {
                "localhost": {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                }
            },
            "children": {
                "test_hosts": {"hosts": {n.name: {"ansible_host": n.address} for n in nodes}},
            },
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(KEY),
                "ansible_ssh_common_args": SSH_OPTIONS,
                # A connection that fails (ssh exit 255: the 3 s connect timeout on a machine busy
                # with two lanes) is tried again before the task counts the host unreachable.
                "ansible_ssh_retries": 3,
                "ansible_python_interpreter": "/usr/bin/python3",
            },
        }
    }
    INVENTORY.write_text("# Written by tests/hosts (python -m tests.hosts up).\n" + yaml.safe_dump(inventory))
    STATE.write_text(
        json.dumps(
            {"nodes": [{"name": n.name, "address": n.address} for n in nodes], "key": str(KEY), "engines": engines},
            indent=1,
        )
        + "\n"
    )


def ssh_argv(node: str, *command: str) -> list[str]:
    return ["ssh", "-F", str(SSH_CONFIG), "-o", "BatchMode=yes", node, *command]


def _booted(node: Node) -> bool:
    result = subprocess.run(
        ssh_argv(node.name, "systemctl", "is-system-running"),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    return result.stdout.strip() in {"running", "degraded"}


def engines_enabled() -> bool:
    """Whether the running hosts were started engine-capable (``up(engines=True)``)."""
    if not STATE.exists():
        return False
    return bool(json.loads(STATE.read_text()).get("engines", False))


def up(count: int = DEFAULT_NODES, *, engines: bool = False) -> list[Node]:
    """Start (or keep) ``count`` hosts; return them once SSH and systemd answer. With ``engines``
    each host can run its own Docker Engine (privileged, private cgroup namespace, /var/lib/docker
    on this machine's disk): the container-runtime tests install and start it with the docker role."""
    nodes = node_list(count)
    image = host_image()
    wheels = wheel_folder()
    _ensure_key()
    _ensure_network()
    wanted = {n.container for n in nodes}
    for extra in set(our_containers()) - wanted:
        podman("rm", "--force", "--time", "0", extra, check=False)
    start = time.monotonic()
    # A running host is kept only if it was started from exactly this definition.
    where = [f"{n.name}={n.address}" for n in nodes]
    small = f"{SMALL_FS}:{SMALL_FS_SIZE}"
    engine = f"engines={engines}"
    config = digest([image, str(wheels), HOST_SHM_SIZE, small, "NET_ADMIN", engine, f"lane={LANE}", *where])
    for node in nodes:
        found = _config_and_state(node.container)
        if found == (config, True):
            continue
        if found is not None:
            podman("rm", "--force", "--time", "0", node.container, check=False)
        _start(node, nodes, image, wheels, config, engines)
    _write_access_files(nodes, engines)
    say(f"{count} host(s) started in {time.monotonic() - start:.1f} s; waiting for systemd and sshd")
    for node in nodes:
        wait_until(f"{node.name} ({node.address})", lambda node=node: _booted(node), timeout=120)  # type: ignore[misc]
    return nodes


def down() -> None:
    """Remove every test host and the network, and restore the machine's network. On a lane other
    than "a": only that lane's hosts and files (the network is lane "a"'s)."""
    if LANE != "a":
        for name in our_containers():
            podman("rm", "--force", "--time", "0", name, check=False)
        for path in (INVENTORY, SSH_CONFIG, STATE):
            path.unlink(missing_ok=True)
        _remove_engine_dirs()
        if our_containers():
            raise HarnessError(f"lane {LANE}: hosts still there: {our_containers()}")
        say(f"lane {LANE}: hosts removed")
        return
    for name in our_containers(every_lane=True):
        podman("rm", "--force", "--time", "0", name, check=False)
    if podman_ok("network", "exists", NETWORK):
        podman("network", "rm", "--force", NETWORK, check=False)
    from tests.hosts import engine

    problems = netstate.restore(netstate.PODMAN, others_running=engine.running())
    for path in (INVENTORY, SSH_CONFIG, STATE):
        path.unlink(missing_ok=True)
    _remove_engine_dirs()
    left = our_containers(every_lane=True)
    if left:
        problems.append(f"containers still there: {left}")
    if problems:
        raise HarnessError("hosts removed, but the machine is not as before: " + "; ".join(problems))
    say("hosts removed")


def _remove_engine_dirs() -> None:
    """The engine-capable hosts' /var/lib/docker folders (images, containers' layers)."""
    folder = HOSTS_DIR / "engines"
    if folder.exists():
        # Overlay mounts of a host's dockerd end with the host's mount namespace; a lazy unmount
        # covers one that a dying dockerd left visible here.
        for line in Path("/proc/mounts").read_text().splitlines():
            target = line.split()[1]
            if target.startswith(str(folder) + "/"):
                run(["umount", "--lazy", target], check=False)
        shutil.rmtree(folder, ignore_errors=True)


def reset(count: int = DEFAULT_NODES, *, engines: bool = False) -> list[Node]:
    """Fresh hosts (same network): each scenario starts from a clean machine."""
    for name in our_containers():
        podman("rm", "--force", "--time", "0", name, check=False)
    _remove_engine_dirs()
    return up(count, engines=engines)


def status() -> str:
    return podman(
        "ps", "-a", "--filter", f"label={HOST_LABEL}", "--format", "{{.Names}}\t{{.Status}}\t{{.Image}}", check=False
    )


def ssh(node: str, command: list[str]) -> None:
    if not SSH_CONFIG.exists():
        raise HarnessError("no hosts are up: run `make up` (python -m tests.hosts up) first")
    os.execvp("ssh", ["ssh", "-F", str(SSH_CONFIG), node, *command])


def environment() -> dict[str, str]:
    """What a developer exports to use the hosts and the engine by hand."""
    from tests.hosts import engine

    return {
        **podman_env(),
        "VLLM_FLEET_TEST_INVENTORY": str(INVENTORY),
        "VLLM_FLEET_TEST_GATEWAY": GATEWAY,
        "VLLM_FLEET_TEST_RAY_IMAGE": engine.ray_image_name(),
        "DOCKER_HOST": engine.DOCKER_HOST,
    }
