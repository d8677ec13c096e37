"""Which transports NCCL used, from a vLLM log run with ``NCCL_DEBUG=INFO``, and whether
that is what the node's facts promise.

NCCL prints, per communicator (formats of NCCL 2.x; the bracketed parts vary):

* ``NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>``: the RDMA
  devices it found (``/IB`` InfiniBand, ``/RoCE`` RDMA over Ethernet, ``/IB/SHARP``);
  ``NET/IB : No device found.`` when there is none;
* ``NET/Socket : Using [0]eth0:10.0.0.1<0>``: printed too where IB is then chosen, so it
  says nothing alone;
* ``Using network IB`` / ``Using network IBext_v8`` / ``Using network Socket``: its choice;
* ``Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA``: one connection to another
  node (``NET/IBext_v8/3/GDRDMA`` through the RDMA/SHARP plugin, ``NET/Socket/0`` over
  TCP); ``/GDRDMA`` is GPUDirect RDMA;
* ``Channel 00/0 : 0[0] -> 1[1] via P2P/IPC`` (``P2P/CUMEM``, ``P2P/direct pointer``,
  ``P2P/IPC/read``) or ``via SHM/direct/direct``: a connection inside the node;
* ``32 coll channels, 0 collnet channels, 16 nvls channels, ...``: NVLink SHARP (NVSwitch
  multicast) in use when the nvls count is above 0.

Pure Python: the same log and facts give the same verdict on a laptop.
"""

from __future__ import annotations

import re
from typing import Any

from vllm_fleet.ops.doctor import FAIL, PASS, SKIP, WARN, Check

_VIA_NET = re.compile(r"\bvia NET/(?P<net>[A-Za-z][A-Za-z0-9_]*)(?P<rest>/\S*)?")
_VIA_LOCAL = re.compile(r"\bvia (?P<kind>P2P|SHM)/")
_USING_NETWORK = re.compile(r"\bUsing network (?P<net>[A-Za-z][A-Za-z0-9_]*)")
_IB_DEVICES = re.compile(r"\bNET/IB\w* : Using (?P<devices>.*?)(?:;|$)")
_IB_DEVICE = re.compile(r"\[\d+\]\S+?:\d+/(?P<link>IB|RoCE)\b")
_NVLS_CHANNELS = re.compile(r"\b(?P<count>\d+) nvls channels\b")
_GDR_RING = re.compile(r"\bGDR 1\b")

CHECK_NAME = "NCCL transport"
SOCKET_FIX = "check NCCL_IB_HCA, /dev/infiniband in the container, memlock"


def _network(name: str) -> str | None:
    """``IB`` for NCCL's IB transports (IB, IBext, IBext_v8...), ``Socket``, else None."""
    if name.startswith("IB"):
        return "IB"
    if name == "Socket":
        return "Socket"
    return None


def parse(log: str) -> dict[str, Any]:
    """The transports of an ``NCCL_DEBUG=INFO`` log:
    ``{"inter_node": IB|RoCE|Socket|None, "gdrdma": bool, "intra_node": P2P|SHM|NVLS|None,
    "inter_node_channels": int, "rdma_devices": [...]}``.

    ``inter_node`` is what the connections to other nodes used (``via NET/...``); a log
    without such a line falls back on NCCL's ``Using network`` choice. One socket
    connection among RDMA ones makes it ``Socket``: part of the traffic fell back. IB is
    reported as ``RoCE`` when every RDMA device NCCL listed is RoCE. ``intra_node`` is
    the fastest seen: NVLS, then P2P, then SHM."""
    via_net: list[tuple[str, bool]] = []
    chosen: str | None = None
    links: list[str] = []
    devices: list[str] = []
    local: set[str] = set()
    nvls = False
    gdr_ring = False
    for line in log.splitlines():
        if "NCCL" not in line:
            continue
        for m in _VIA_NET.finditer(line):
            net = _network(m.group("net"))
            if net:
                via_net.append((net, "/GDRDMA" in (m.group("rest") or "")))
        for m in _VIA_LOCAL.finditer(line):
            local.add(m.group("kind"))
        m_net = _USING_NETWORK.search(line)
        if m_net:
            chosen = _network(m_net.group("net")) or chosen
        m_dev = _IB_DEVICES.search(line)
        if m_dev:
            for dev in _IB_DEVICE.finditer(m_dev.group("devices")):
                links.append(dev.group("link"))
                name = dev.group(0).split("]", 1)[1].rsplit("/", 1)[0]
                if name not in devices:
                    devices.append(name)
        m_nvls = _NVLS_CHANNELS.search(line)
        if m_nvls and int(m_nvls.group("count")) > 0:
            nvls = True
        if _GDR_RING.search(line):
            gdr_ring = True
    nets = {n for n, _ in via_net}
    inter: str | None = ("Socket" if "Socket" in nets else "IB") if nets else chosen
    if inter == "IB" and links and all(link == "RoCE" for link in links):
        inter = "RoCE"
    intra = "NVLS" if nvls else "P2P" if "P2P" in local else "SHM" if "SHM" in local else None
    return {
        "inter_node": inter,
        "gdrdma": any(g for _, g in via_net) or (gdr_ring and inter in ("IB", "RoCE")),
        "intra_node": intra,
        "inter_node_channels": len(via_net),
        "rdma_devices": devices,
    }


def rdma_ports(facts: dict[str, Any]) -> list[str]:
    """The node's active InfiniBand/RoCE ports (``device:port``) from gpu_facts'
    ``infiniband`` list (vllm_fleet.inventory.facts.parse_ib); the doctor's memlock check counts
    the same ports."""
    return [
        f"{p.get('device')}:{p.get('port')}"
        for p in facts.get("infiniband") or []
        if str(p.get("state", "")).upper() == "ACTIVE"
    ]


def check(transport: dict[str, Any], facts: dict[str, Any], node: str = "") -> Check:
    """``transport`` (:func:`parse`) against what ``facts`` (host_facts) promise: a node
    with an active IB/RoCE port promises NCCL's IB transport between nodes; one without
    promises nothing beyond sockets."""
    where = f"{node}: " if node else ""
    ports = rdma_ports(facts)
    inter = transport.get("inter_node")
    if inter is None:
        return Check(CHECK_NAME, SKIP, f"{where}no inter-node NCCL connection in the log")
    if inter == "Socket":
        if ports:
            return Check(
                CHECK_NAME,
                FAIL,
                f"{where}NCCL fell back to sockets (NET/Socket) though the node has active RDMA port(s) "
                f"{', '.join(ports)}",
                SOCKET_FIX,
            )
        return Check(CHECK_NAME, PASS, f"{where}NET/Socket between nodes; the node has no active IB/RoCE port")
    used = ", ".join(transport.get("rdma_devices") or []) or "RDMA"
    if not ports:
        # The facts saw no port NCCL found anyway: the gpu_facts run predates the NICs, or
        # /sys/class/infiniband was not readable where it ran.
        return Check(
            CHECK_NAME,
            WARN,
            f"{where}NET/{inter} ({used}) though the facts list no active IB/RoCE port",
            "gather the facts again (gpu_facts role) to plan with the RDMA NICs",
        )
    if not transport.get("gdrdma"):
        return Check(
            CHECK_NAME,
            WARN,
            f"{where}NET/{inter} over {used} without GPUDirect RDMA (traffic staged through host memory)",
            "load nvidia_peermem (or use a DMA-BUF capable driver and kernel); see NCCL_NET_GDR_LEVEL",
        )
    return Check(CHECK_NAME, PASS, f"{where}NET/{inter}/GDRDMA over {used}")


def verdict(log: str, facts: dict[str, Any], node: str = "") -> dict[str, Any]:
    """:func:`parse` and :func:`check` together, as the Ansible filter returns them:
    ``{"ok", "transport", "check": {name, status, detail, fix}}``."""
    transport = parse(log)
    result = check(transport, facts, node)
    return {"ok": result.status != FAIL, "transport": transport, "check": vars(result)}
