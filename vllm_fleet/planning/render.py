"""Turn a chosen layout into what the roles run: ``vllm serve`` arguments,
environment, Ray placement bundles and the gateway's upstreams."""

from __future__ import annotations

from typing import Any

from vllm_fleet.accounting.memory import Estimate, default_partition
from vllm_fleet.planning.cluster import Node

DEFAULT_PORT = 8000


def placement(tp: int, pp: int, nodes: list[str]) -> dict[str, Any]:
    """One ``{"GPU": TP}`` bundle per PP stage; spread when stages are on
    distinct nodes, packed when they share one."""
    strategy = "STRICT_SPREAD" if len(set(nodes)) > 1 and len(set(nodes)) == len(nodes) else "PACK"
    return {"bundles": [{"GPU": tp} for _ in range(pp)], "strategy": strategy}


def vllm_args(
    model_ref: str,
    served_name: str,
    est: Estimate,
    *,
    port: int,
    host: str,
    executor: str,
    device_kind: str,
    dp_local: int | None = None,
    asked_dtype: str = "auto",
) -> list[str]:
    """The exact ``vllm serve`` argument list for one instance. ``host``: the
    head's cluster address, never 0.0.0.0 (``--api-key`` guards only the
    OpenAI routes, so vLLM listens only where its gateway and verify reach it)."""
    args = [
        "serve",
        model_ref,
        "--host",
        host,
        "--port",
        str(port),
        "--served-model-name",
        served_name,
        "--tensor-parallel-size",
        str(est.tensor_parallel_size),
        "--pipeline-parallel-size",
        str(est.pipeline_parallel_size),
        "--max-model-len",
        str(est.max_model_len),
        "--max-num-seqs",
        str(est.max_num_seqs),
    ]
    if device_kind == "cpu":
        kv_bytes = int(min(r.kv_cache_gib for r in est.ranks) * (1 << 30))
        args += ["--kv-cache-memory-bytes", str(kv_bytes)]
    else:
        args += ["--gpu-memory-utilization", f"{est.gpu_memory_utilization:g}"]
    if est.data_parallel_size > 1:
        args += ["--data-parallel-size", str(est.data_parallel_size)]
        if dp_local is not None:
            args += ["--data-parallel-size-local", str(dp_local)]
    if est.enable_expert_parallel:
        args.append("--enable-expert-parallel")
    if executor == "ray":
        args += ["--distributed-executor-backend", "ray"]
    # The dtype the operator asked for, whatever it is (a bfloat16 asked of a float16 checkpoint
    # is not vLLM's auto); under auto, the checkpoint's own where it is not bfloat16.
    if asked_dtype != "auto" or est.dtype not in ("auto", "bfloat16"):
        args += ["--dtype", asked_dtype if asked_dtype != "auto" else est.dtype]
    # The declared options the estimate was made with (vllm_fleet/schema.py serve_args).
    return args + est.option_args


def instance_env(est: Estimate, partition_is_custom: bool) -> dict[str, str]:
    # What the estimate's accounting needs (unified.launch_env: no CUDA graph estimate on unified
    # memory); the operator's vllm_fleet_extra_env, applied after it, was read by the estimate.
    env: dict[str, str] = dict(est.launch_env)
    if est.pipeline_parallel_size > 1 and partition_is_custom:
        env["VLLM_PP_LAYER_PARTITION"] = ",".join(str(n) for n in est.layer_partition)
    # Never VLLM_CPU_KVCACHE_SPACE for CPU nodes: vLLM's CPU platform lets that legacy
    # variable (whole GiB) override the exact --kv-cache-memory-bytes.
    return env


def node_env(node: Node) -> dict[str, str]:
    """Per-node variables that must be set when the containers are created."""
    env: dict[str, str] = {}
    if node.address:
        env["VLLM_HOST_IP"] = node.address
    if node.interface:
        env["NCCL_SOCKET_IFNAME"] = node.interface
        env["GLOO_SOCKET_IFNAME"] = node.interface
    return env


def is_custom_partition(partition: list[int], num_layers: int) -> bool:
    return partition != default_partition(num_layers, len(partition))
