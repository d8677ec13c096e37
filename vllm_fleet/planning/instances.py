"""A candidate layout, and one planned instance as the plan prints it: its stages, GPUs, port, executor and argv."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_fleet.accounting.base import GIB
from vllm_fleet.accounting.memory import Estimate
from vllm_fleet.model.spec import ModelSpec
from vllm_fleet.names import check_served_name
from vllm_fleet.planning.cluster import Node
from vllm_fleet.planning.executor import choose_executor
from vllm_fleet.planning.render import instance_env, is_custom_partition, node_env, placement, vllm_args
from vllm_fleet.planning.wishes import Wishes


@dataclass
class Candidate:
    kind: str
    tp: int
    pp: int
    dp: int
    ep: bool
    # one entry per instance: list of (node, gpus used on it, stage index)
    instances: list[list[tuple[Node, int]]]
    estimates: list[Estimate]
    hops: int
    partition: list[int] | None = None
    label: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def layout(self) -> str:
        if self.label:
            return self.label
        text = f"{self.kind}: TP={self.tp} PP={self.pp}"
        if self.dp > 1:
            text += f" DP={self.dp}"
        if self.ep:
            text += " EP"
        text += f" x{len(self.instances)} instance(s)"
        return text

    def score(self, target: int | None) -> tuple[int, int, int, int, int, int]:
        fits = all(e.fits for e in self.estimates)
        conc = sum(e.max_concurrency * max(e.data_parallel_size, 1) for e in self.estimates)
        meets = 1 if target is None or conc >= target else 0
        units = sum(max(e.data_parallel_size, 1) for e in self.estimates)
        kv = sum(e.kv_cache_tokens * max(e.data_parallel_size, 1) for e in self.estimates)
        return (int(fits), meets, -self.hops, units, -self.pp, kv)


def instance_dict(
    spec: ModelSpec,
    wishes: Wishes,
    cand: Candidate,
    index: int,
    est: Estimate,
    inst: list[tuple[Node, int]],
    used: dict[str, int],
    ports: dict[str, int],
    memory: dict[int, dict[str, Any]],
) -> dict[str, Any]:
    model_ref = wishes.model_ref or spec.name
    # Checked: the name lands in env files, unit descriptions and vLLM's argv.
    served = check_served_name(wishes.served_model_name or spec.name.rstrip("/").split("/")[-1])
    nodes = [n for n, _ in inst]
    node_names = list(dict.fromkeys(n.name for n in nodes))
    port = wishes.port + ports.get(nodes[0].name, 0)
    ports[nodes[0].name] = ports.get(nodes[0].name, 0) + 1
    stages = []
    partition = est.layer_partition
    start = 0

    # ``used``: GPUs already taken on each node by earlier instances and stages.
    def gpu_ids(node: Node, gpus: int) -> list[int]:
        first = used.get(node.name, 0)
        used[node.name] = first + gpus
        return list(range(first, first + gpus))

    if cand.dp > 1:
        for node, gpus in inst:
            stages.append(
                {
                    "node": node.name,
                    "gpu_count": gpus,
                    "gpu_ids": gpu_ids(node, gpus),
                    "layers": [0, spec.num_layers],
                    "env": node_env(node),
                }
            )
    else:
        for stage, (node, gpus) in enumerate(inst):
            count = partition[stage] if stage < len(partition) else 0
            stages.append(
                {
                    "node": node.name,
                    "gpu_count": gpus,
                    "gpu_ids": gpu_ids(node, gpus),
                    "layers": [start, start + count],
                    "env": node_env(node),
                }
            )
            start += count
    custom = cand.pp > 1 and is_custom_partition(partition, spec.num_layers)
    kind = nodes[0].kind
    name = f"{served}-{index}"
    gpus_per_node: dict[str, int] = {}
    for node, gpus in inst:
        gpus_per_node[node.name] = gpus_per_node.get(node.name, 0) + gpus
    executor, why = choose_executor(name, gpus_per_node, cand.dp, wishes)
    head = nodes[0]
    args = vllm_args(
        model_ref,
        served,
        est,
        port=port,
        host=head.address or head.name,
        executor=executor,
        device_kind=kind,
        dp_local=inst[0][1] if cand.dp > 1 else None,
        asked_dtype=wishes.dtype,
    )
    if kind == "cpu":
        # vLLM's CPU build takes the KV pool in bytes; each node's `vllm serve` passes its
        # own to its workers (native, DP), so every stage gets the bytes planned for it.
        for stage_dict, rank in zip(stages, _stage_ranks(est, len(stages), cand.dp > 1), strict=True):
            stage_dict["kv_cache_memory_bytes"] = int(rank.kv_cache_gib * GIB)
    return {
        "name": name,
        "executor": executor,
        "executor_reason": why,
        "strategy": cand.kind,
        "nodes": node_names,
        "head_node": head.name,
        "gpu": head.gpu,
        "device": kind,
        "tensor_parallel_size": est.tensor_parallel_size,
        "pipeline_parallel_size": est.pipeline_parallel_size,
        "data_parallel_size": est.data_parallel_size,
        "enable_expert_parallel": est.enable_expert_parallel,
        "stages": stages,
        "layer_partition": partition if custom else None,
        "placement": placement(est.tensor_parallel_size, est.pipeline_parallel_size, [n.name for n in nodes])
        if cand.dp == 1
        else {"bundles": [{"GPU": 1} for _ in range(est.data_parallel_size)], "strategy": "SPREAD"},
        "max_model_len": est.max_model_len,
        "max_num_seqs": est.max_num_seqs,
        "port": port,
        "endpoint": f"{head.address or head.name}:{port}",
        "served_model_name": served,
        "vllm_version": wishes.vllm_version,
        "vllm_args": args,
        "env": instance_env(est, custom),
        "memory": memory[id(est)] if id(est) in memory else memory.setdefault(id(est), est.to_dict()),
        "notes": est.notes,
    }


def _stage_ranks(est: Estimate, count: int, dp: bool) -> list[Any]:
    """The first rank of each stage (DP stages all hold the whole model)."""
    if dp:
        return [est.ranks[0]] * count
    return [next(r for r in est.ranks if r.pp_stage == s) for s in range(count)]
