"""``vllm-fleet doctor``: the known failure modes of these deployments that can be seen before serving.

The doctor playbook (playbooks/doctor.yml) gathers one JSON *bundle* from every node (facts from
the gpu_facts role, the NVSwitches and their fabric manager, Docker, the serving image, the model
files, Ray/vLLM versions, and which ports each node reaches on the others); :func:`evaluate` turns
it into one line per check.
Pure Python: the same bundle gives the same verdict on a laptop.

Bundle (every key optional unless said)::

    {"head": "node1",                      # required
     "runtime": "container" | "systemd",
     "image": "vllm-fleet/serving:...",     # the planned serving image
     "model_path": "/srv/models/x",
     "nodes": {"node1": {                   # required
         "device": "cuda" | "cpu",
         "address": "10.0.0.1", "interface": "eth0",   # what the inventory/plan uses
         "facts": {...},                    # gpu_facts_found (vllm_fleet.inventory.facts.host_facts)
         "fabric": {"nvswitches": 4, "service": "active", "version": "570.124.06"},  # NVSwitch nodes only
         "docker": {"runtimes": ["nvidia", "runc"], "default_ulimits": {"memlock": {"Hard": -1}}},
         "image": {"id": "sha256:...", "cuda_version": "12.8.1"},
         "model": {"files": 4, "bytes": 123, "problems": []},
         "versions": {"ray": "2.60.0", "vllm": "0.11.0", "python": "3.12.3"},
         "reach": {"node2:6379": true}}}}    # TCP connects from this node
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass
from typing import Any

from vllm_fleet.deploy.deployment import overlay

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
MIN_SHM_BYTES = 1 << 30  # Docker's 64 MB default breaks vLLM's shared-memory broadcast


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


class BundleError(ValueError):
    """The bundle is not what the doctor playbook writes (exit code 2)."""


def inputs_of(
    settings: dict[str, Any], role_vars: dict[str, Any], ansible_host: str | None, name: str
) -> dict[str, Any]:
    """What the doctor play checks on a node, from its resolved vllm_fleet_* settings and the
    role variables the inventory sets (playbooks/doctor.yml decides nothing): the runtime site.yml
    deploys with, the serving image (ray_cluster_image; empty: not checked), the model folder
    (model_cache_dir; empty: not checked), the Python of Ray's venv (systemd runtime), the address
    the other nodes reach it at and its interface, and whether it serves on a GPU."""
    venv = overlay("ray_cluster", ("venv",), role_vars)["venv"]
    return {
        "runtime": str(settings.get("runtime") or "container"),
        "image": str(role_vars.get("ray_cluster_image") or ""),
        "model_path": str(role_vars.get("model_cache_dir") or ""),
        "ray_python": f"{venv}/bin/python",
        "address": str(settings.get("address") or ansible_host or name),
        "interface": settings.get("interface"),
        "device": "cpu" if str(settings.get("gpu") or "").lower() == "cpu" else "cuda",
    }


def _ran(results: dict[str, Any], key: str) -> dict[str, Any]:
    """A registered result, or {} where its task was skipped or did not run."""
    result = results.get(key)
    return dict(result) if isinstance(result, dict) and not result.get("skipped") else {}


def _json(text: Any) -> Any:
    body = str(text or "").strip()
    return json.loads(body) if body[:1] in ("{", "[") else None


def gathered(results: dict[str, Any], inputs: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """One node's part of the bundle from what the doctor play's tasks registered (``results``:
    ``pci``, ``fabric``, ``docker``, ``daemon``, ``image``, ``model``, ``versions``, ``reach``;
    a skipped or failed one leaves its part None or empty), :func:`inputs_of` and gpu_facts."""
    pci, fabric = _json(_ran(results, "pci").get("stdout")), _json(_ran(results, "fabric").get("stdout"))
    docker, daemon = _ran(results, "docker"), _ran(results, "daemon")
    image, versions = _ran(results, "image"), _ran(results, "versions")
    runtimes = _json(docker.get("stdout")) if docker.get("rc") == 0 else None
    config = json.loads(base64.b64decode(daemon["content"])) if daemon.get("content") else {}
    inspected = _json(image.get("stdout")) if image.get("rc") == 0 else None
    if isinstance(inspected, list):
        inspected = inspected[0] if inspected else None
    env = [str(e) for e in ((inspected or {}).get("Config") or {}).get("Env") or []]
    return {
        "device": inputs["device"],
        "address": inputs["address"],
        "interface": inputs["interface"],
        "facts": facts,
        "fabric": {"nvswitches": (pci or {}).get("nvswitches"), **fabric} if isinstance(fabric, dict) else None,
        "docker": (
            {"runtimes": list(runtimes or {}), "default_ulimits": config.get("default-ulimits") or {}}
            if docker.get("rc") == 0
            else None
        ),
        "image": (
            {
                "id": inspected.get("Id"),
                "cuda_version": next((e.split("=", 1)[1] for e in env if e.startswith("CUDA_VERSION=")), None),
            }
            if isinstance(inspected, dict)
            else None
        ),
        "model": _json(_ran(results, "model").get("stdout")),
        "versions": (_json(versions.get("stdout")) or {}) if versions.get("rc") == 0 else {},
        "reach": _json(_ran(results, "reach").get("stdout")) or {},
    }


def _version_tuple(text: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (text or "").split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def _gpu_nodes(nodes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: node for name, node in nodes.items() if node.get("device", "cuda") == "cuda"}


def check_driver(nodes: dict[str, dict[str, Any]]) -> Check:
    gpu_nodes = _gpu_nodes(nodes)
    if not gpu_nodes:
        return Check("gpu driver", SKIP, "no node serves on NVIDIA GPUs")
    missing = [n for n, node in gpu_nodes.items() if not (node.get("facts") or {}).get("gpu_count")]
    if missing:
        return Check(
            "gpu driver",
            FAIL,
            f"nvidia-smi lists no GPU on {', '.join(missing)}",
            "install the driver (playbooks/prepare.yml, nvidia_driver role) and reboot; "
            "with Secure Boot on, the module must be signed",
        )
    drivers = {n: node["facts"].get("driver_version") for n, node in gpu_nodes.items()}
    detail = ", ".join(f"{n} {node['facts']['gpu_count']}x {node['facts'].get('gpu')}" for n, node in gpu_nodes.items())
    if len(set(drivers.values())) > 1:
        return Check(
            "gpu driver",
            WARN,
            f"drivers differ: {', '.join(f'{n} {v}' for n, v in drivers.items())}",
            "pin one nvidia_driver_branch for every node",
        )
    return Check("gpu driver", PASS, f"driver {next(iter(drivers.values()))}: {detail}")


def check_driver_cuda(nodes: dict[str, dict[str, Any]]) -> Check:
    """The image's CUDA must not be newer than what the driver supports (nvidia-smi's "CUDA Version")."""
    too_old, compared = [], 0
    for name, node in _gpu_nodes(nodes).items():
        image_cuda = (node.get("image") or {}).get("cuda_version")
        driver_cuda = (node.get("facts") or {}).get("cuda_version")
        if not image_cuda or not driver_cuda:
            continue
        compared += 1
        if _version_tuple(image_cuda)[:2] > _version_tuple(driver_cuda)[:2]:
            too_old.append(f"{name} (driver supports CUDA {driver_cuda}, image has {image_cuda})")
    if too_old:
        return Check(
            "driver vs image CUDA",
            FAIL,
            "the driver is older than the image's CUDA on " + ", ".join(too_old),
            "raise nvidia_driver_branch, or choose an image built for an older CUDA",
        )
    if not compared:
        return Check("driver vs image CUDA", SKIP, "no node reported both its driver's and its image's CUDA version")
    return Check("driver vs image CUDA", PASS, f"the driver supports the image's CUDA on {compared} node(s)")


def check_fabric_manager(nodes: dict[str, dict[str, Any]]) -> Check:
    """NVSwitch boards (HGX/DGX) initialise CUDA only while nvidia-fabricmanager of the loaded driver's
    exact version runs (NVML's "system not yet initialized" otherwise)."""
    switched = {n: node for n, node in _gpu_nodes(nodes).items() if (node.get("fabric") or {}).get("nvswitches")}
    if not switched:
        return Check("fabric manager", SKIP, "no node has NVSwitches: no fabric manager needed")
    problems = []
    for name, node in switched.items():
        fabric = node["fabric"]
        state, version = fabric.get("service") or "unknown", fabric.get("version")
        driver = (node.get("facts") or {}).get("driver_version")
        if not version:
            problems.append(f"{name} ({fabric['nvswitches']} NVSwitches): no nvidia-fabricmanager installed")
        elif state != "active":
            problems.append(f"{name} ({fabric['nvswitches']} NVSwitches): nvidia-fabricmanager {version} is {state}")
        elif driver and version != driver:
            problems.append(
                f"{name}: nvidia-fabricmanager {version} beside driver {driver} (it stops at its next start)"
            )
    if problems:
        return Check(
            "fabric manager",
            FAIL,
            "; ".join(problems) + " (CUDA: 'system not yet initialized')",
            "run playbooks/prepare.yml: nvidia_driver installs nvidia-fabricmanager of the driver's exact version "
            "and starts it (reboot first if it says so); see `journalctl -u nvidia-fabricmanager -b`",
        )
    return Check(
        "fabric manager",
        PASS,
        f"nvidia-fabricmanager active and of the driver's version on {len(switched)} NVSwitch node(s)",
    )


def check_toolkit(bundle: dict[str, Any]) -> Check:
    if bundle.get("runtime", "container") != "container":
        return Check("container toolkit", SKIP, "Ray and vLLM run on the hosts (systemd), not in containers")
    gpu_nodes = _gpu_nodes(bundle["nodes"])
    if not gpu_nodes:
        return Check("container toolkit", SKIP, "no node serves on NVIDIA GPUs")
    no_docker = [n for n, node in gpu_nodes.items() if not node.get("docker")]
    lacking = [
        n for n, node in gpu_nodes.items() if node.get("docker") and "nvidia" not in node["docker"].get("runtimes", [])
    ]
    if no_docker:
        return Check(
            "container toolkit",
            FAIL,
            f"Docker does not answer on {', '.join(no_docker)}",
            "run playbooks/prepare.yml (docker role); see `journalctl -u docker`",
        )
    if lacking:
        return Check(
            "container toolkit",
            FAIL,
            f'Docker has no nvidia runtime on {", ".join(lacking)} ("could not select device driver" at start)',
            "run playbooks/prepare.yml (nvidia_container_toolkit role), which runs nvidia-ctk runtime configure",
        )
    return Check("container toolkit", PASS, f"Docker has the nvidia runtime on {len(gpu_nodes)} node(s)")


def check_shm(bundle: dict[str, Any]) -> Check:
    if bundle.get("runtime", "container") == "container":
        return Check("/dev/shm", PASS, "containers get their own large /dev/shm (--shm-size from the plan)")
    small = {
        n: shm
        for n, node in bundle["nodes"].items()
        if (shm := (node.get("facts") or {}).get("shm_bytes")) is not None and shm < MIN_SHM_BYTES
    }
    if small:
        sizes = ", ".join(f"{n} {shm / 2**20:.0f} MiB" for n, shm in small.items())
        return Check(
            "/dev/shm",
            FAIL,
            f"/dev/shm below 1 GiB on {sizes} (vLLM: 'No available shared memory broadcast block')",
            "mount a larger /dev/shm (tmpfs size=) on those hosts",
        )
    return Check("/dev/shm", PASS, "at least 1 GiB on every node")


def check_memlock(bundle: dict[str, Any]) -> Check:
    """RDMA needs unlimited locked memory: on the host (systemd) or as Docker's default ulimit."""
    with_ib = {
        n: node
        for n, node in bundle["nodes"].items()
        if any(p.get("state", "").upper() == "ACTIVE" for p in (node.get("facts") or {}).get("infiniband", []))
    }
    if not with_ib:
        return Check("memlock / IPC_LOCK", PASS, "no active InfiniBand port: locked memory is not needed")
    limited = []
    for name, node in with_ib.items():
        if bundle.get("runtime", "container") == "container":
            hard = ((node.get("docker") or {}).get("default_ulimits") or {}).get("memlock", {}).get("Hard")
            if hard != -1:
                limited.append(f"{name} (Docker's default memlock {hard})")
        elif (node.get("facts") or {}).get("memlock_bytes") != -1:
            limited.append(f"{name} (ulimit -l {node['facts'].get('memlock_bytes')})")
    if limited:
        return Check(
            "memlock / IPC_LOCK",
            FAIL,
            "InfiniBand is up but locked memory is limited on "
            + ", ".join(limited)
            + " (NCCL: 'unhandled system error')",
            "docker role default-ulimits memlock -1 (its default) or ray_cluster_memlock: -1",
        )
    return Check("memlock / IPC_LOCK", PASS, f"unlimited on the {len(with_ib)} node(s) with InfiniBand")


def check_image(bundle: dict[str, Any]) -> Check:
    if bundle.get("runtime", "container") != "container" or not bundle.get("image"):
        return Check("one image digest", SKIP, "no serving image in this deployment")
    ids = {n: (node.get("image") or {}).get("id") for n, node in bundle["nodes"].items()}
    missing = [n for n, i in ids.items() if not i]
    if missing:
        return Check(
            "one image digest",
            FAIL,
            f"{bundle['image']} is not on {', '.join(missing)}",
            "run playbooks/prepare.yml (serving_image role)",
        )
    if len(set(ids.values())) > 1:
        groups: dict[str, list[str]] = {}
        for n, i in ids.items():
            groups.setdefault(str(i)[:19], []).append(n)
        listing = "; ".join(f"{i}: {', '.join(ns)}" for i, ns in groups.items())
        return Check(
            "one image digest",
            FAIL,
            f"{bundle['image']} differs between nodes ({listing}): 'Version mismatch' at start",
            "run playbooks/prepare.yml so every node gets the same image",
        )
    return Check("one image digest", PASS, f"{bundle['image']} is {str(next(iter(ids.values())))[:19]} on every node")


def check_model(bundle: dict[str, Any]) -> Check:
    path = bundle.get("model_path")
    if not path:
        return Check(
            "model files", SKIP, "no model path to check: set vllm_fleet_doctor_model_path (or model_cache_dir)"
        )
    models = {n: node.get("model") for n, node in bundle["nodes"].items()}
    absent = [n for n, m in models.items() if not m or not m.get("files")]
    broken = {n: m["problems"] for n, m in models.items() if m and m.get("problems")}
    if absent or broken:
        parts = [f"{path} missing on {', '.join(absent)}"] if absent else []
        parts += [f"{n}: {'; '.join(p[:3])}" for n, p in broken.items()]
        return Check("model files", FAIL, "; ".join(parts), "run playbooks/prepare.yml (model_cache role) to copy them")
    shapes = {(m["files"], m["bytes"]) for m in models.values() if m}
    if len(shapes) > 1:
        listing = ", ".join(f"{n} {m['files']} files/{m['bytes']} B" for n, m in models.items() if m)
        return Check(
            "model files", FAIL, f"{path} differs between nodes: {listing}", "copy the model again (model_cache)"
        )
    files, size = next(iter(shapes))
    return Check(
        "model files", PASS, f"{path}: {files} files, {size / 2**30:.2f} GiB, whole and the same on every node"
    )


def check_addresses(bundle: dict[str, Any]) -> Check:
    """Ray's node IP and VLLM_HOST_IP must be the address that routes to the head (else
    NCCL and Gloo connect over the wrong interface, or Ray registers an unreachable node)."""
    wrong = []
    for name, node in bundle["nodes"].items():
        route = (node.get("facts") or {}).get("route_to_head") or {}
        address, interface = node.get("address"), node.get("interface")
        if route.get("address") and address and route["address"] != address:
            wrong.append(
                f"{name} uses {address} but reaches the head from {route['address']} ({route.get('interface')})"
            )
        elif route.get("interface") and interface and route["interface"] != interface:
            wrong.append(f"{name} names interface {interface} but the route to the head leaves by {route['interface']}")
    if wrong:
        return Check(
            "address = route to head",
            FAIL,
            "; ".join(wrong),
            "remove vllm_fleet_address/_interface from those hosts (detected from the route) or fix them",
        )
    return Check("address = route to head", PASS, "every node's address is the source of its route to the head")


def check_reach(bundle: dict[str, Any]) -> Check:
    tried = {(n, target): ok for n, node in bundle["nodes"].items() for target, ok in (node.get("reach") or {}).items()}
    if not tried:
        return Check("ports between members", SKIP, "a single node: nothing to reach")
    blocked = [f"{n} -> {target}" for (n, target), ok in tried.items() if not ok]
    if blocked:
        return Check(
            "ports between members",
            FAIL,
            "blocked: " + ", ".join(blocked) + " (NCCL/Gloo 'connection refused')",
            "open TCP between members (ray_cluster_firewall opens it for them only)",
        )
    return Check("ports between members", PASS, f"{len(tried)} connections between members succeed")


def check_versions(bundle: dict[str, Any]) -> Check:
    reported = {n: node["versions"] for n, node in bundle["nodes"].items() if node.get("versions")}
    if not reported:
        return Check("same Ray/vLLM/Python", SKIP, "no node reported its versions")
    differ = []
    for key in sorted({k for v in reported.values() for k in v}):
        values = {n: v.get(key) for n, v in reported.items()}
        if len(set(values.values())) > 1:
            differ.append(f"{key}: " + ", ".join(f"{n} {v}" for n, v in values.items()))
    if differ:
        return Check(
            "same Ray/vLLM/Python",
            FAIL,
            "; ".join(differ) + " (Ray: 'Version mismatch')",
            "one serving image (container) or one pinned Ray (systemd) on every node",
        )
    sample = next(iter(reported.values()))
    return Check("same Ray/vLLM/Python", PASS, ", ".join(f"{k} {v}" for k, v in sorted(sample.items())) + " everywhere")


def evaluate(bundle: dict[str, Any]) -> list[Check]:
    if not isinstance(bundle, dict) or not isinstance(bundle.get("nodes"), dict) or not bundle["nodes"]:
        raise BundleError("the bundle has no 'nodes' mapping: write it with playbooks/doctor.yml")
    if bundle.get("head") not in bundle["nodes"]:
        raise BundleError(f"the bundle's 'head' ({bundle.get('head')}) is not one of its nodes")
    odd = [name for name, node in bundle["nodes"].items() if not isinstance(node, dict)]
    if odd:
        raise BundleError(
            f"nodes {', '.join(map(str, odd))} are not mappings: write the bundle with playbooks/doctor.yml"
        )
    nodes = bundle["nodes"]
    return [
        check_driver(nodes),
        check_driver_cuda(nodes),
        check_fabric_manager(nodes),
        check_toolkit(bundle),
        check_shm(bundle),
        check_memlock(bundle),
        check_image(bundle),
        check_model(bundle),
        check_addresses(bundle),
        check_reach(bundle),
        check_versions(bundle),
    ]


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0


def render(checks: list[Check]) -> str:
    """One line per check; a failing check's fix on the line below it."""
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c.status:<4}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status in (FAIL, WARN):
            lines.append(f"{'':<4}  {'':<{width}}  fix: {c.fix}")
    failed = sum(c.status == FAIL for c in checks)
    lines.append(f"{len(checks)} checks: {failed} failed" if failed else f"{len(checks)} checks: no failure")
    return "\n".join(lines)


def to_json(checks: list[Check]) -> str:
    return json.dumps({"ok": exit_code(checks) == 0, "checks": [asdict(c) for c in checks]}, indent=1)
