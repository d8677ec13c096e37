"""RDMA for NCCL from the nodes' facts: which InfiniBand or RoCE devices a node's NCCL
uses, the environment that says so, and what a container needs to reach them.

What NCCL does with its environment, as NCCL 2.30's source reads it (github.com/NVIDIA/nccl;
the variables are listed at https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html):

* ``NCCL_IB_HCA`` (src/transport/net_ib/init.cc ``ncclIbInitDevices``, src/misc/utils.cc
  ``parseStringList``/``matchIfList``): comma-separated ``device[:port]`` entries. Each
  entry is a name *prefix* unless the list starts with ``=`` (exact names; ``^`` excludes):
  ``mlx5_1`` alone also selects mlx5_10 to mlx5_17. Without a port every port of the
  device counts. The record therefore writes ``=mlx5_0:1,mlx5_1:1``: exactly the ports
  gpu_facts found active.
* NCCL uses only ports in state ACTIVE whose link layer is InfiniBand or Ethernet (RoCE),
  and refuses to merge or connect ports of different link layers, on one node and between
  nodes ("Try selecting NICs of only one link type using NCCL_IB_HCA": init.cc,
  connect.cc). A node with both gets its InfiniBand ports only (the compute fabric; the
  Ethernet ports of such nodes carry storage or the front-end network).
* ``NCCL_IB_GID_INDEX`` (src/transport/net_ib/connect.cc ``ncclIbGetGidIndex``) is read for
  RoCE ports only; its default -1 lets NCCL pick a RoCE v2 GID of the port's address
  family. InfiniBand ports ignore it. The right value is site-specific (``show_gids``):
  ``vllm_fleet_roce_gid_index`` sets it on RoCE nodes, nothing sets it elsewhere.
* ``NCCL_IB_DISABLE=1``: no IB transport at all; NCCL talks over sockets (NET/Socket).
  Each rank's communicator takes the first network that initialises, IB before Socket
  (src/plugin/net.cc ``ncclNetInit``), and hands its peers that network's connection
  handles; nothing checks that the peers took the same one. So a multi-node group whose
  nodes do not all have RDMA of one link layer runs every member on sockets
  (:func:`group_env`).

RDMA in a container needs the capability IPC_LOCK (NCCL registers, i.e. pins, its buffers),
the device folder /dev/infiniband (the verbs devices) and unlimited locked memory
("ncclCommInitRank unhandled system error" otherwise). Only nodes with
RDMA get them: elsewhere the containers keep the Docker daemon's default ulimits (the
docker role's default-ulimits), which machines that cannot raise memlock rely on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_fleet.errors import PlanError

KINDS = ("infiniband", "roce")
_LABEL = {"infiniband": "InfiniBand", "roce": "RoCE"}
# What a container needs for RDMA (community.docker.docker_container's capabilities, devices
# and ulimits, "type:soft:hard"; -1 is unlimited).
CONTAINER = {
    "capabilities": ["IPC_LOCK"],
    "devices": ["/dev/infiniband:/dev/infiniband"],
    "ulimits": ["memlock:-1:-1"],
}
NO_CONTAINER: dict[str, list[str]] = {"capabilities": [], "devices": [], "ulimits": []}
SOCKETS = {"NCCL_IB_DISABLE": "1"}


def node_rdma(node: str, ports: list[dict[str, Any]] | None, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The RDMA of ``node``: ``{kind, source, ports, devices, reason, env, container}``.

    ``ports``: gpu_facts' ``infiniband`` list (vllm_fleet.inventory.facts.parse_ib), None where the
    facts were not gathered. ``settings``: the node's ``rdma``, ``rdma_devices`` and
    ``roce_gid_index`` (vllm_fleet/inventory/interface.py). ``kind`` is ``infiniband``, ``roce`` or
    ``none``; ``ports`` the ``device[:port]`` entries NCCL_IB_HCA lists; ``env`` the
    node's NCCL variables; ``container`` the capabilities, devices and ulimits its
    containers get (all empty without RDMA)."""
    mode = str(settings.get("rdma") or "auto")
    stated = settings.get("rdma_devices")
    if mode == "off":
        return _none("inventory", "vllm_fleet_rdma: off")
    active = [p for p in ports or [] if str(p.get("state", "")).upper() == "ACTIVE"]
    # A port without a link layer (facts written before gpu_facts read it) counts as InfiniBand.
    found = {k: _entries([p for p in active if (p.get("link_layer") or "infiniband") == k]) for k in KINDS}
    if mode in KINDS:
        entries = [str(d) for d in stated] if stated is not None else found[mode]
        if not entries:
            seen = "were not gathered" if ports is None else f"list no active {_LABEL[mode]} port"
            raise PlanError(
                "vllm_fleet_rdma",
                f"is {mode} on {node}, but its gpu_facts {seen}",
                "list the devices in vllm_fleet_rdma_devices, or set vllm_fleet_rdma: auto (or off)",
            )
        source = "inventory" if stated is not None else "detected"
        reason = f"vllm_fleet_rdma: {mode}, " + ("devices stated" if stated is not None else "the detected ports")
        return _rdma(mode, entries, source, reason, settings)
    if ports is None:
        return _none("not detected", "no gpu_facts for this node (vllm_fleet_rdma: infiniband or roce states it)")
    kind = next((k for k in KINDS if found[k]), None)
    if kind is None:
        return _none("detected", "gpu_facts found no active InfiniBand or RoCE port")
    reason = f"{len(found[kind])} active {_LABEL[kind]} port(s) found by gpu_facts"
    if kind == "infiniband" and found["roce"]:
        reason += f"; the RoCE port(s) {', '.join(found['roce'])} left out (NCCL does not mix link layers)"
    return _rdma(kind, found[kind], "detected", reason, settings)


def _entries(ports: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for p in ports:
        entry = str(p.get("device")) + (f":{p['port']}" if p.get("port") is not None else "")
        if entry not in out:
            out.append(entry)
    return out


def _rdma(kind: str, entries: list[str], source: str, reason: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    env = {"NCCL_IB_HCA": "=" + ",".join(entries)}
    gid = settings.get("roce_gid_index")
    if gid is not None:
        if kind == "roce":
            env["NCCL_IB_GID_INDEX"] = str(int(gid))
        else:
            reason += "; vllm_fleet_roce_gid_index not set (InfiniBand ports ignore it)"
    return {
        "kind": kind,
        "source": source,
        "ports": entries,
        "devices": list(dict.fromkeys(e.split(":")[0] for e in entries)),
        "reason": reason,
        "env": env,
        "container": {k: list(v) for k, v in CONTAINER.items()},
    }


def _none(source: str, reason: str) -> dict[str, Any]:
    return {
        "kind": "none",
        "source": source,
        "ports": [],
        "devices": [],
        "reason": reason,
        "env": dict(SOCKETS),
        "container": {k: list(v) for k, v in NO_CONTAINER.items()},
    }


def group_env(node: str, members: list[str], fabric: Mapping[str, dict[str, Any]]) -> tuple[dict[str, str], str]:
    """The NCCL environment of ``node`` in a group of ``members`` (a multi-node instance, a
    Ray cluster), and why, in a few words. ``fabric``: :func:`node_rdma` of the nodes
    known (a node whose facts were not gathered, e.g. outside ``--limit``, does not veto).
    The node's own environment when every known member has RDMA of its link layer;
    otherwise sockets (NCCL_IB_DISABLE=1) on every member: NCCL's ranks cannot mix the IB
    transport with sockets, nor InfiniBand with RoCE."""
    mine = fabric[node]
    if mine["kind"] == "none":
        return dict(mine["env"]), mine["reason"]
    others = [m for m in members if m != node and m in fabric and fabric[m]["source"] != "not detected"]
    odd = [m for m in others if fabric[m]["kind"] != mine["kind"]]
    if not odd:
        return dict(mine["env"]), mine["reason"]
    kinds = ", ".join(f"{m}: {fabric[m]['kind']}" for m in odd)
    return dict(SOCKETS), f"sockets: {node} has {mine['kind']} but {kinds} (NCCL cannot mix them in one group)"
