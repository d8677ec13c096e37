"""Parse what a host says about its GPUs, NICs and limits into the planner's node facts.

The gpu_facts role runs the commands on each host and hands their raw output
here (through the ``vllm_fleet_gpu_facts`` filter); nothing in this module
runs a command. A host without an NVIDIA GPU (no ``nvidia-smi``, or one that
fails) reports zero GPUs and never fails.

Inputs (all optional strings):

* ``query_gpu``: ``nvidia-smi --query-gpu=index,name,memory.total,memory.free,
  compute_cap,driver_version,pci.bus_id --format=csv,noheader,nounits``
* ``nvidia_smi_q``: ``nvidia-smi -q`` (for "CUDA Version")
* ``topo``: ``nvidia-smi topo -m``
* ``net``: lines ``NAME SPEED OPERSTATE`` from /sys/class/net/*/{speed,operstate}
* ``ib``: tab-separated ``DEVICE PORT RATE STATE LINK_LAYER`` from
  /sys/class/infiniband/*/ports/*/{rate,state,link_layer}
* ``route``: ``ip -4 -o route get HEAD``; ``addresses``: ``ip -4 -o addr show``
* ``shm``: ``df --block-size=1 --output=size /dev/shm``
* ``cores``: ``nproc`` (the CPUs this node may use; vLLM's CPU build binds one core range per rank)
* ``memlock``: ``ulimit -l`` (KiB or "unlimited")
* ``secure_boot``: ``mokutil --sb-state`` output
* ``runtimes``: names of container runtimes found (docker, podman, nvidia-ctk...)
* ``compute_apps``: ``nvidia-smi --query-compute-apps=gpu_bus_id,pid,process_name,used_memory
  --format=csv,noheader,nounits`` (who holds GPU memory)
* ``meminfo``: the MemTotal, MemFree and MemAvailable lines of /proc/meminfo (an integrated GPU's
  memory is the host's: nvidia-smi prints "[N/A]" for it on a DGX Spark)
"""

from __future__ import annotations

import math
import re
from typing import Any

from vllm_fleet.model.catalog import lookup_gpu

GPU_QUERY_FIELDS = "index,name,memory.total,memory.free,compute_cap,driver_version,pci.bus_id"
# nvidia-smi's compute_cap of NVIDIA's integrated GPUs: Orin, Thor, GB10 (the DGX Spark).
INTEGRATED_CAPABILITIES = frozenset({"8.7", "11.0", "12.1"})
VIRTUAL_NIC = re.compile(r"^(lo|docker\d*|veth.*|br-.*|virbr.*|podman\d*|cni.*|flannel.*|cali.*|tun.*|tap.*)$")


def parse_query_gpu(text: str) -> list[dict[str, Any]]:
    """One dict per GPU from ``--query-gpu ... --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 6 or not fields[0].isdigit():
            continue
        gpus.append(
            {
                "index": int(fields[0]),
                "name": fields[1],
                "memory_total_mib": _number(fields[2]),
                "memory_free_mib": _number(fields[3]),
                "compute_capability": fields[4] if fields[4] not in ("[N/A]", "N/A") else None,
                "driver_version": fields[5],
                "pci_bus_id": fields[6] if len(fields) > 6 else None,
            }
        )
    return gpus


# vLLM's processes name themselves VLLM::EngineCore, VLLM::Worker_TP0... (setproctitle) or run
# as "vllm serve": the fleet's own instances, which a changed plan restarts.
VLLM_PROCESS = re.compile(r"vllm", re.IGNORECASE)


def parse_compute_apps(text: str) -> list[dict[str, Any]]:
    """One dict per GPU process from ``--query-compute-apps=gpu_bus_id,pid,process_name,used_memory``."""
    apps = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4 or not fields[1].isdigit():
            continue
        apps.append({"pci_bus_id": fields[0], "pid": int(fields[1]), "name": fields[2], "used_mib": _number(fields[3])})
    return apps


def free_gib(gpus: list[dict[str, Any]], apps: list[dict[str, Any]]) -> float | None:
    """The smallest free memory of the host's GPUs, in GiB, counting what vLLM's own processes
    hold as free (a re-run of the plan against a serving fleet must not refuse the memory its
    instances use). vLLM refuses to start when a GPU's free memory is below total x
    gpu_memory_utilization (``request_memory``, v1/worker/utils.py), so the fullest GPU decides.
    None when the driver does not report free memory."""
    free: list[float] = []
    for gpu in gpus:
        if gpu["memory_free_mib"] is None:
            return None
        held = sum(
            a["used_mib"] or 0.0
            for a in apps
            if a["pci_bus_id"]
            and gpu["pci_bus_id"]
            and _bus(a["pci_bus_id"]) == _bus(gpu["pci_bus_id"])
            and VLLM_PROCESS.search(a["name"])
        )
        free.append(gpu["memory_free_mib"] + held)
    # At least 0.01 GiB: a GPU another process fills is "nothing free", not a bad value.
    return max(math.floor(min(free) / 1024 * 100) / 100, 0.01) if free else None


def _bus(bus_id: str) -> str:
    """PCI bus ids compare without the domain's leading zeros and case (00000000:18:00.0 = 0000:18:00.0)."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{domain.lstrip('0')}:{rest}"


def _number(field: str) -> float | None:
    try:
        return float(field)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse_meminfo(text: str) -> dict[str, int]:
    """``{"MemTotal": bytes, ...}`` from /proc/meminfo lines (``MemTotal:  131072000 kB``)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"^(\w+):\s+(\d+)\s*kB\s*$", line.strip())
        if match:
            out[match.group(1)] = int(match.group(2)) * 1024
    return out


def parse_cuda_version(text: str) -> str | None:
    """ "CUDA Version : 12.4" from ``nvidia-smi -q`` (or the banner's "CUDA Version: 12.4")."""
    match = re.search(r"CUDA Version\s*:\s*([0-9.]+)", text)
    return match.group(1) if match else None


def parse_topo(text: str) -> dict[str, Any]:
    """The GPU/NIC link matrix of ``nvidia-smi topo -m``.

    Returns ``{"gpus": ["GPU0", ...], "nics": ["NIC0", ...], "links": {"GPU0-GPU1": "NV12", ...},
    "nvlink_pairs": [[0, 1], ...], "all_nvlink": bool, "nic_names": {"NIC0": "mlx5_0"}}``.
    """
    lines = [line.rstrip() for line in text.splitlines()]
    header_index = next((i for i, line in enumerate(lines) if re.match(r"^\s+GPU0\b", line)), None)
    result: dict[str, Any] = {"gpus": [], "nics": [], "links": {}, "nvlink_pairs": [], "nic_names": {}}
    if header_index is None:
        result["all_nvlink"] = False
        return result
    columns = [c for c in re.split(r"\s+", lines[header_index].strip()) if c]
    devices = [c for c in columns if re.match(r"^(GPU\d+|NIC\d+|mlx\d+_\d+|mlx\d+)$", c)]
    for line in lines[header_index + 1 :]:
        cells = [c for c in re.split(r"\s+", line.strip()) if c]
        if not cells or cells[0] not in devices:
            if cells and cells[0].startswith("NIC") and cells[0].endswith(":") and len(cells) > 1:
                result["nic_names"][cells[0].rstrip(":")] = cells[1]
            continue
        row = cells[0]
        for column, value in zip(devices, cells[1 : 1 + len(devices)], strict=False):
            if column != row:
                result["links"][f"{row}-{column}"] = value
    gpus = [d for d in devices if d.startswith("GPU")]
    result["gpus"] = gpus
    result["nics"] = [d for d in devices if not d.startswith("GPU")]
    pairs = []
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            if result["links"].get(f"{a}-{b}", "").startswith("NV"):
                pairs.append([int(a[3:]), int(b[3:])])
    result["nvlink_pairs"] = pairs
    total_pairs = len(gpus) * (len(gpus) - 1) // 2
    result["all_nvlink"] = bool(gpus) and len(gpus) > 1 and len(pairs) == total_pairs
    # The legend below the matrix names the NICs ("NIC0: mlx5_0").
    for line in lines:
        match = re.match(r"^\s*(NIC\d+):\s*(\S+)", line)
        if match:
            result["nic_names"][match.group(1)] = match.group(2)
    return result


def parse_net(text: str) -> list[dict[str, Any]]:
    """Physical NICs with their speed from ``NAME SPEED OPERSTATE`` lines (virtual ones are left out)."""
    nics = []
    for line in text.splitlines():
        parts = line.split()
        if not parts or VIRTUAL_NIC.match(parts[0]):
            continue
        speed = int(parts[1]) if len(parts) > 1 and parts[1].lstrip("-").isdigit() else -1
        state = parts[2] if len(parts) > 2 else "unknown"
        nics.append({"name": parts[0], "speed_mbps": speed if speed > 0 else None, "state": state})
    return nics


def parse_ib(text: str) -> list[dict[str, Any]]:
    """InfiniBand/RoCE ports from tab-separated ``DEVICE PORT RATE STATE LINK_LAYER`` lines, as the
    role reads /sys/class/infiniband/*/ports/*/{rate,state,link_layer}: rate "400 Gb/sec (4X NDR)",
    state "4: ACTIVE", link layer "InfiniBand" or "Ethernet" (RoCE). ``link_layer`` is
    ``infiniband``, ``roce`` or None where the line has no fifth field (facts recorded before
    gpu_facts read it) or the kernel reports something else."""
    ports = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 4:
            continue
        rate = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", parts[2])
        layer = parts[4].strip().lower() if len(parts) > 4 else ""
        ports.append(
            {
                "device": parts[0].strip(),
                "port": int(parts[1]) if parts[1].strip().isdigit() else None,
                "gbps": float(rate.group(1)) if rate else None,
                "state": parts[3].split(":")[-1].strip(),
                "link_layer": _LINK_LAYERS.get(layer),
            }
        )
    return ports


# /sys/class/infiniband/<dev>/ports/<n>/link_layer: "InfiniBand", or "Ethernet" for RDMA over
# Converged Ethernet (RoCE) ports.
_LINK_LAYERS = {"infiniband": "infiniband", "ethernet": "roce"}


def parse_route(text: str, addresses: str = "") -> dict[str, str | None]:
    """Interface and source address of ``ip -4 -o route get HEAD``.

    On the head itself the route is "local ... dev lo": the interface is then the one
    that holds the address, from ``ip -4 -o addr show`` (``addresses``).
    """
    dev = re.search(r"\bdev (\S+)", text)
    src = re.search(r"\bsrc (\S+)", text)
    interface, address = (dev.group(1) if dev else None), (src.group(1) if src else None)
    if interface == "lo" and address:
        for line in addresses.splitlines():
            match = re.match(r"^\d+:\s+(\S+)\s+inet\s+([0-9.]+)/", line)
            if match and match.group(2) == address and match.group(1) != "lo":
                interface = match.group(1)
    return {"interface": interface, "address": address}


def parse_memlock(text: str) -> int | None:
    """``ulimit -l`` in bytes; -1 for unlimited."""
    value = text.strip().splitlines()[-1].strip() if text.strip() else ""
    if value == "unlimited":
        return -1
    return int(value) * 1024 if value.isdigit() else None


def parse_secure_boot(text: str) -> bool | None:
    lowered = text.lower()
    if "secureboot enabled" in lowered:
        return True
    if "secureboot disabled" in lowered or "not supported" in lowered:
        return False
    return None


def host_facts(raw: dict[str, Any]) -> dict[str, Any]:
    """Everything the planner and the later roles need about one host."""
    gpus = parse_query_gpu(str(raw.get("query_gpu") or ""))
    topo = parse_topo(str(raw.get("topo") or ""))
    nics = parse_net(str(raw.get("net") or ""))
    ib = parse_ib(str(raw.get("ib") or ""))
    shm_lines = str(raw.get("shm") or "").split()
    shm = int(shm_lines[-1]) if shm_lines and shm_lines[-1].isdigit() else None
    cores = str(raw.get("cores") or "").strip()
    names = sorted({g["name"] for g in gpus})
    gpu_type = lookup_gpu(names[0]) if len(names) == 1 else None
    meminfo = parse_meminfo(str(raw.get("meminfo") or ""))
    # An integrated GPU: CUDA's total is the host's MemTotal, and vLLM reads MemAvailable as its free
    # memory (unified.py). The catalog decides for a GPU it knows; an unknown one counts only when the
    # driver reports no memory of its own and its compute capability is an integrated part's (a
    # discrete GPU answering "[N/A]" or "[Insufficient Permissions]", under MIG or in a container,
    # keeps the 0 GiB the planner refuses).
    if gpu_type is not None:
        unified = gpu_type.unified_memory
    else:
        unified = bool(gpus) and all(
            g["memory_total_mib"] is None and g["compute_capability"] in INTEGRATED_CAPABILITIES for g in gpus
        )
    apps = parse_compute_apps(str(raw.get("compute_apps") or ""))
    if unified:
        total = meminfo.get("MemTotal")
        memory = total / (1 << 30) if total else (gpu_type.memory_gib if gpu_type else None)
        # The host's MemAvailable now says nothing of a fresh start's once the fleet's vLLM runs
        # there (its memory is not the GPU's to count back): the planner's reserve stands in.
        available = meminfo.get("MemAvailable")
        free = None
    else:
        memory = min((g["memory_total_mib"] or 0.0) for g in gpus) / 1024 if gpus else None
        available = None
        free = free_gib(gpus, apps)
    up_speeds = [n["speed_mbps"] / 1000 for n in nics if n["speed_mbps"] and n["state"] == "up"]
    ib_active = [p["gbps"] for p in ib if p["state"].upper() == "ACTIVE" and p["gbps"]]
    facts: dict[str, Any] = {
        "gpus": gpus,
        "gpu_count": len(gpus),
        # The catalog's name when it knows the product, otherwise what the driver says.
        "gpu": (gpu_type.name if gpu_type else names[0]) if len(names) == 1 else ("mixed" if names else None),
        "gpu_names": names,
        "gpu_memory_gib": round(memory, 2) if memory is not None else None,
        "gpu_free_gib": free,
        "unified_memory": unified,
        "host_memory_available_gib": round(available / (1 << 30), 2) if available else None,
        "gpu_processes": apps,
        "driver_version": gpus[0]["driver_version"] if gpus else None,
        "cuda_version": parse_cuda_version(str(raw.get("nvidia_smi_q") or "")),
        "compute_capability": gpus[0]["compute_capability"] if gpus else None,
        "nvlink": topo["all_nvlink"],
        "nvlink_pairs": topo["nvlink_pairs"],
        "nics": nics,
        "infiniband": ib,
        "nic_gbps": max(ib_active + up_speeds) if ib_active or up_speeds else None,
        "route_to_head": parse_route(str(raw.get("route") or ""), str(raw.get("addresses") or "")),
        "shm_bytes": shm,
        "cpu_cores": int(cores) if cores.isdigit() and int(cores) > 0 else None,
        "memlock_bytes": parse_memlock(str(raw.get("memlock") or "")),
        "secure_boot": parse_secure_boot(str(raw.get("secure_boot") or "")),
        "container_runtimes": sorted(set(raw.get("runtimes") or [])),
    }
    return facts
