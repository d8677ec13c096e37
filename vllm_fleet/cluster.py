"""The cluster as the planner sees it: nodes with their GPUs and links."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vllm_fleet.catalog import lookup_gpu
from vllm_fleet.errors import PlanError
from vllm_fleet.memory import Device

_SM = {"volta": 7, "turing": 7, "ampere": 8, "ada": 8, "hopper": 9, "blackwell": 10, "cdna3": 9, "cpu": 0}


@dataclass(frozen=True)
class Node:
    """One machine: ``gpu_count`` GPUs of one type."""

    name: str
    gpu: str
    gpu_count: int
    gpu_memory_gib: float
    nvlink: bool
    nic_gbps: float
    kind: str = "cuda"
    arch: str = "hopper"
    address: str | None = None
    interface: str | None = None
    free_gib: float | None = None

    @property
    def gpu_key(self) -> str:
        """GPUs are interchangeable for TP when name and memory match."""
        return f"{self.gpu}/{self.gpu_memory_gib:.2f}"

    def device(self) -> Device:
        return Device(self.gpu, self.gpu_memory_gib, self.kind, _SM.get(self.arch, 9), self.free_gib)


def _number(raw: Any, field: str, kind: type, fix: str) -> Any:
    try:
        value = kind(raw)
    except (TypeError, ValueError) as exc:
        raise PlanError(field, f"'{raw}' is not a number", fix) from exc
    if value <= 0:
        raise PlanError(field, f"must be positive, got {raw}", fix)
    return value


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def node_from_dict(data: dict[str, Any], index: int) -> Node:
    where = f"nodes[{index}]"
    if not isinstance(data, dict):
        raise PlanError(where, "must be a mapping with name, gpu and gpu_count", "see inventories/example")
    name = str(data.get("name") or "").strip()
    if not name:
        raise PlanError(f"{where}.name", "is missing", "give every node a unique name")
    where = f"nodes[{index}] ({name})"
    gpu_name = str(data.get("gpu") or "").strip()
    if not gpu_name:
        raise PlanError(f"{where}.gpu", "is missing", "name the GPU model (e.g. H100-SXM, A800, L20) or 'cpu'")
    if "gpu_count" not in data:
        raise PlanError(f"{where}.gpu_count", "is missing", "state how many GPUs the node has")
    count = _number(data["gpu_count"], f"{where}.gpu_count", int, "use the number of GPUs on the node")
    gpu = lookup_gpu(gpu_name)
    memory = data.get("gpu_memory_gib")
    if memory is not None:
        memory = _number(memory, f"{where}.gpu_memory_gib", float, "give the total memory per GPU in GiB")
    elif gpu is not None and gpu.device != "cpu":
        memory = gpu.memory_gib
    else:
        fix = "add gpu_memory_gib (memory per GPU, or the KV space for a CPU node)"
        if gpu is None:
            raise PlanError(f"{where}.gpu", f"unknown GPU '{gpu_name}'", fix + ", or use a name from 'vllm-fleet gpus'")
        raise PlanError(f"{where}.gpu_memory_gib", "is required for a CPU node", fix)
    nvlink_raw = data.get("nvlink")
    nvlink = (gpu.nvlink if gpu else False) if nvlink_raw is None else _bool(nvlink_raw)
    nic = _number(data.get("nic_gbps") or 100, f"{where}.nic_gbps", float, "give the NIC speed in Gb/s")
    free = data.get("gpu_free_gib")
    return Node(
        name=name,
        gpu=gpu.name if gpu else gpu_name,
        gpu_count=count,
        gpu_memory_gib=float(memory),
        nvlink=nvlink,
        nic_gbps=nic,
        kind=gpu.device if gpu else "cuda",
        arch=gpu.arch if gpu else "hopper",
        address=data.get("address") or None,
        interface=data.get("interface") or None,
        free_gib=_number(free, f"{where}.gpu_free_gib", float, "give free memory per GPU in GiB")
        if free is not None
        else None,
    )


def cluster_from_data(data: Any) -> list[Node]:
    """Nodes from ``{"nodes": [...]}`` or a bare list."""
    nodes_raw = data.get("nodes") if isinstance(data, dict) else data
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise PlanError("nodes", "the cluster has no nodes", "list nodes: [{name, gpu, gpu_count}, ...]")
    nodes = [node_from_dict(item, i) for i, item in enumerate(nodes_raw)]
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise PlanError("nodes", f"node name '{node.name}' appears twice", "give every node a unique name")
        seen.add(node.name)
    return nodes


def load_cluster(path: Path) -> list[Node]:
    if not path.is_file():
        raise PlanError("--cluster", f"{path} does not exist", "pass a YAML file with a nodes: list")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise PlanError(
            "--cluster", f"{path} is not valid YAML ({exc})".replace("\n", " "), "fix the YAML syntax"
        ) from exc
    return cluster_from_data(data)
