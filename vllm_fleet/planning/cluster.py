"""The cluster as the planner sees it: nodes with their GPUs and links."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vllm_fleet.accounting.settings import MAX_GPU_MEMORY_GIB, Device
from vllm_fleet.errors import PlanError
from vllm_fleet.model.catalog import ARCH_CAPABILITY, lookup_gpu

_SM = {"volta": 7, "turing": 7, "ampere": 8, "ada": 8, "hopper": 9, "blackwell": 10, "cdna3": 9, "cpu": 0}

# Bounds that keep the planner fast on any input (a typo such as 10**12 GPUs answers in
# milliseconds with the field named): far above real machines.
MAX_NODES = 10_000
MAX_GPUS_PER_NODE = 1024
MAX_NIC_GBPS = 100_000.0
# Every instance becomes a record in the plan: the largest cluster (8,192 nodes of 8 H100, a
# TP=1 model) is not instant: about 2 s in plan_cluster, 13-18 s through `vllm-fleet plan --json`
# (reading the YAML and writing 65,536 instance records).
MAX_CLUSTER_GPUS = 1 << 16
MAX_CLUSTER_BYTES = 16 << 20


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
    capability: int | None = None  # compute capability x 10; None: the architecture's lowest
    unified_memory: bool = False
    p2p: bool = True
    cpu_cores: int | None = None  # cores vLLM's CPU build binds (the performance model's CPU)

    @property
    def gpu_key(self) -> str:
        """GPUs are interchangeable for TP when name and memory match."""
        return f"{self.gpu}/{self.gpu_memory_gib:.2f}"

    def device(self) -> Device:
        capability = self.capability if self.capability is not None else ARCH_CAPABILITY.get(self.arch)
        return Device(
            self.gpu,
            self.gpu_memory_gib,
            self.kind,
            capability // 10 if capability is not None else _SM.get(self.arch, 9),
            self.free_gib,
            capability,
            self.unified_memory,
            self.p2p or self.nvlink,
        )


def _show(raw: Any) -> str:
    text = repr(raw)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(raw: Any, field: str, kind: type, fix: str, maximum: float | None = None) -> Any:
    """A positive number of ``kind`` (int or float), at most ``maximum``. Booleans (YAML
    ``true``), NaN, infinities and fractions where an integer is meant are refused."""
    if isinstance(raw, bool):
        raise PlanError(field, f"{raw!r} is a boolean, not a number", fix)
    if isinstance(raw, list | tuple | dict | set):
        raise PlanError(field, f"{_show(raw)} is not a number", fix)
    try:
        number = float(raw)
    except (TypeError, ValueError) as exc:
        raise PlanError(field, f"{_show(raw)} is not a number", fix) from exc
    except OverflowError as exc:  # an int too large for a float
        raise PlanError(field, f"{_show(raw)} is too large", fix) from exc
    if not math.isfinite(number):
        raise PlanError(field, f"{_show(raw)} is not a finite number", fix)
    if kind is int and not number.is_integer():
        raise PlanError(field, f"{_show(raw)} is not a whole number", fix)
    if number <= 0:
        raise PlanError(field, f"must be positive, got {_show(raw)}", fix)
    if maximum is not None and number > maximum:
        raise PlanError(field, f"{_show(raw)} is above {maximum:g}, the largest the planner accepts", fix)
    if kind is int:
        # int("8") and 8.0 are 8; float() above kept huge integers from reaching int().
        return int(raw) if isinstance(raw, int) else int(number)
    return number


def _bool(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
    raise PlanError(field, f"{_show(value)} is not true or false", "write true or false")


def _text(value: Any, field: str) -> str | None:
    """An optional one-word string (an address, an interface name)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str | int):
        raise PlanError(field, f"must be a string, got {_show(value)}", "write one value, e.g. 10.0.0.11 or eth0")
    text = str(value).strip()
    if not text or any(c.isspace() or not c.isprintable() for c in text):
        raise PlanError(field, f"{_show(value)} holds spaces or control characters", "write one word")
    return text


def node_from_dict(data: dict[str, Any], index: int) -> Node:
    where = f"nodes[{index}]"
    if not isinstance(data, dict):
        raise PlanError(where, "must be a mapping with name, gpu and gpu_count", "see inventories/example")
    raw_name = data.get("name")
    if isinstance(raw_name, list | dict | bool):
        raise PlanError(f"{where}.name", f"must be a string, got {_show(raw_name)}", "give every node a unique name")
    name = str(raw_name or "").strip()
    if not name:
        raise PlanError(f"{where}.name", "is missing", "give every node a unique name")
    if any(c.isspace() or not c.isprintable() for c in name) or len(name) > 253:
        raise PlanError(f"{where}.name", f"{_show(name)} is not a host name", "use the inventory name of the machine")
    where = f"nodes[{index}] ({name})"
    raw_gpu = data.get("gpu")
    if isinstance(raw_gpu, list | dict | bool):
        raise PlanError(f"{where}.gpu", f"must be a GPU name, got {_show(raw_gpu)}", "e.g. H100-SXM, A800, L20 or cpu")
    gpu_name = str(raw_gpu or "").strip()
    if not gpu_name:
        raise PlanError(f"{where}.gpu", "is missing", "name the GPU model (e.g. H100-SXM, A800, L20) or 'cpu'")
    if "gpu_count" not in data:
        raise PlanError(f"{where}.gpu_count", "is missing", "state how many GPUs the node has")
    count = _number(
        data["gpu_count"],
        f"{where}.gpu_count",
        int,
        f"use the number of GPUs on the node (1 to {MAX_GPUS_PER_NODE})",
        MAX_GPUS_PER_NODE,
    )
    gpu = lookup_gpu(gpu_name)
    memory = data.get("gpu_memory_gib")
    memory_fix = f"give the total memory per GPU in GiB (at most {MAX_GPU_MEMORY_GIB:g})"
    if memory is not None:
        memory = _number(memory, f"{where}.gpu_memory_gib", float, memory_fix, MAX_GPU_MEMORY_GIB)
    elif gpu is not None and gpu.device != "cpu":
        memory = gpu.memory_gib
    else:
        fix = "add gpu_memory_gib (memory per GPU, or the KV space for a CPU node)"
        if gpu is None:
            raise PlanError(
                f"{where}.gpu", f"unknown GPU {_show(gpu_name)}", fix + ", or use a name from 'vllm-fleet gpus'"
            )
        raise PlanError(f"{where}.gpu_memory_gib", "is required for a CPU node", fix)
    unified_raw = data.get("unified_memory")
    unified = bool(gpu and gpu.unified_memory)
    if unified_raw is not None:
        unified = _bool(unified_raw, f"{where}.unified_memory")
    nvlink_raw = data.get("nvlink")
    nvlink = (gpu.nvlink if gpu else False) if nvlink_raw is None else _bool(nvlink_raw, f"{where}.nvlink")
    nic_raw = data.get("nic_gbps")
    nic = (
        100.0
        if nic_raw is None or nic_raw == ""
        else _number(nic_raw, f"{where}.nic_gbps", float, "give the NIC speed in Gb/s", MAX_NIC_GBPS)
    )
    free = data.get("gpu_free_gib")
    cores = data.get("cpu_cores")
    return Node(
        name=name,
        gpu=gpu.name if gpu else gpu_name,
        gpu_count=count,
        gpu_memory_gib=float(memory),
        nvlink=nvlink,
        nic_gbps=nic,
        kind=gpu.device if gpu else "cuda",
        arch=gpu.arch if gpu else "hopper",
        capability=(gpu.capability or None) if gpu else None,
        unified_memory=unified,
        p2p=gpu.p2p if gpu else True,
        address=_text(data.get("address"), f"{where}.address"),
        interface=_text(data.get("interface"), f"{where}.interface"),
        free_gib=_number(free, f"{where}.gpu_free_gib", float, "give free memory per GPU in GiB", MAX_GPU_MEMORY_GIB)
        if free is not None
        else None,
        cpu_cores=_number(cores, f"{where}.cpu_cores", int, "give the cores vLLM may use", 1 << 16)
        if cores not in (None, "")
        else None,
    )


def cluster_from_data(data: Any) -> list[Node]:
    """Nodes from ``{"nodes": [...]}`` or a bare list."""
    nodes_raw = data.get("nodes") if isinstance(data, dict) else data
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise PlanError("nodes", "the cluster has no nodes", "list nodes: [{name, gpu, gpu_count}, ...]")
    if len(nodes_raw) > MAX_NODES:
        raise PlanError(
            "nodes",
            f"{len(nodes_raw):,} nodes is above {MAX_NODES:,}, the most the planner accepts",
            "plan the cluster in parts",
        )
    nodes = [node_from_dict(item, i) for i, item in enumerate(nodes_raw)]
    total = sum(n.gpu_count for n in nodes)
    if total > MAX_CLUSTER_GPUS:
        raise PlanError(
            "nodes",
            f"{total:,} GPUs in all is above {MAX_CLUSTER_GPUS:,}, the most the planner accepts",
            "plan the cluster in parts (one inventory per group of nodes)",
        )
    seen: set[str] = set()
    addresses: dict[str, str] = {}
    for i, node in enumerate(nodes):
        if node.name in seen:
            raise PlanError("nodes", f"node name '{node.name}' appears twice", "give every node a unique name")
        seen.add(node.name)
        # As the inventory's check (interface.check_nodes): one address is one machine.
        key = (node.address or "").strip().lower()
        if key and key in addresses:
            raise PlanError(
                f"nodes[{i}].address",
                f"{addresses[key]} and {node.name} are one machine ({node.address})",
                "list each machine once (its GPUs in one gpu_count), or fix the address",
            )
        if key:
            addresses[key] = node.name
    return nodes


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice in one mapping (PyYAML keeps the
    last silently; Ansible is told to refuse them too, see ansible.cfg)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the constructor below names it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {_show(key)} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_cluster(path: Path) -> list[Node]:
    if not path.is_file():
        problem = f"{path} is a folder" if path.is_dir() else f"{path} does not exist"
        raise PlanError("--cluster", problem, "pass a YAML file with a nodes: list")
    try:
        size = path.stat().st_size
        if size > MAX_CLUSTER_BYTES:
            raise PlanError("--cluster", f"{path} is {size:,} bytes", "pass a YAML file with a nodes: list")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError("--cluster", f"{path} is not UTF-8 text", "pass a YAML file with a nodes: list") from exc
    except OSError as exc:
        raise PlanError("--cluster", f"cannot read {path}: {exc.strerror}", "check the file's permissions") from exc
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PlanError(
            "--cluster", " ".join(f"{path}{where} is not valid YAML ({problem})".split()), "fix the YAML syntax"
        ) from exc
    except RecursionError as exc:
        raise PlanError("--cluster", f"{path} nests too deeply", "pass a YAML file with a nodes: list") from exc
    return cluster_from_data(data)
