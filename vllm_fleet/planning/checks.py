"""The wishes' refusals before any layout is searched, what vLLM refuses on each node, and the
TP sizes a model shards into."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from vllm_fleet import coerce
from vllm_fleet.accounting.base import CURRENT_VLLM, OLDEST_KNOWN_VLLM, known_release, parse_version
from vllm_fleet.accounting.memory import kv_heads_shard
from vllm_fleet.accounting.refusal import vllm_refusal
from vllm_fleet.errors import NothingFitsError, PlanError
from vllm_fleet.model.length import check_max_model_len
from vllm_fleet.model.quantization import check_quantization_flag
from vllm_fleet.model.spec import ModelSpec
from vllm_fleet.planning.cluster import Node
from vllm_fleet.planning.wishes import ALL_STRATEGIES, Wishes


def valid_tps(spec: ModelSpec, max_tp: int) -> list[int]:
    heads = spec.num_attention_heads
    out = []
    for tp in range(1, max_tp + 1):
        if heads % tp:
            continue
        if not kv_heads_shard(spec, tp):
            continue
        if tp & (tp - 1) and tp not in (3, 6, 12):  # keep powers of two and a few common others
            continue
        out.append(tp)
    return out


# A vLLM release as PyPI and the image tags write it: 0.32.0, v0.32.0, 0.32, 0.32.0rc1, 0.32.0.post1.
_RELEASE = re.compile(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:rc\d+|\.post\d+|\.dev\d+)?")


def check_release(text: Any, field: str = "--vllm-version") -> str | None:
    """A release the planner knows: refused (PlanError) when ``text`` is no release (garbage,
    empty, a version followed by a word) or older than the oldest accounting the planner has; a
    newer one is planned with the newest accounting, and the warning saying so is returned."""
    raw = text.strip() if isinstance(text, str) else ""
    match = _RELEASE.fullmatch(raw)
    if match is None:
        raise PlanError(field, f"{text!r} is not a vLLM release", f"a release such as {CURRENT_VLLM}")
    if (int(match[1]), int(match[2])) < parse_version(OLDEST_KNOWN_VLLM):
        raise PlanError(
            field,
            f"vLLM {raw} is older than the oldest release the planner has accounting for ({OLDEST_KNOWN_VLLM})",
            f"plan a release from {OLDEST_KNOWN_VLLM} to {CURRENT_VLLM}",
        )
    return known_release(raw)


# vLLM 0.32's attention backends and the block sizes they take (read in its
# v1/attention/backends: get_supported_kernel_block_sizes): on CUDA every backend a dense or MLA
# model selects takes multiples of 16 (none left: "No valid attention backend found"), sparse MLA
# (DeepSeek V3.2's indexer) multiples of 64; the CPU build's CPU_ATTN multiples of 32 ("No common
# block size for 16 (CPU_ATTN: [MultipleOf(32)])", at the KV cache's initialisation; its MLA
# backend overrides the value instead). Checked for the release they were read in and later.
BLOCK_SIZE_RULES_FROM = (0, 32)


def block_size_multiple(spec: ModelSpec, device_kind: str) -> int | None:
    """The multiple vLLM's attention backends need ``--block-size`` to be on ``device_kind``
    for ``spec``; None where vLLM adjusts the value itself (the CPU build's MLA)."""
    if device_kind == "cpu":
        return None if spec.kv_lora_rank else 32
    return 64 if spec.index_topk else 16


def check_block_size(spec: ModelSpec, kinds: set[str], block_size: int | None, version: str) -> None:
    if block_size is None or parse_version(version) < BLOCK_SIZE_RULES_FROM:
        return
    for kind in sorted(kinds):
        multiple = block_size_multiple(spec, kind)
        if multiple and block_size % multiple:
            where = "vLLM's CPU build" if kind == "cpu" else f"{kind.upper()} GPUs"
            raise PlanError(
                "--block-size",
                f"{block_size} is refused by vLLM {version}'s attention backends on {where}, which take "
                f"multiples of {multiple}" + (" for sparse MLA" if spec.index_topk and kind != "cpu" else ""),
                f"use {max(multiple, block_size // multiple * multiple)} or leave it unset (vLLM's default)",
            )


def check_wishes(spec: ModelSpec, nodes: list[Node], wishes: Wishes) -> None:
    """The wishes' types and ranges, and the requests vLLM itself would refuse."""
    # Every declared option within its declaration (vllm_fleet/schema.py), named as the wish it is.
    coerce.check_typed(wishes, lambda name: name)
    port = wishes.port
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise PlanError("vllm_fleet_port", f"must be a port (1 to 65535), got {port!r}", "e.g. 8000")
    unknown = sorted(set(wishes.strategies or ()) - set(ALL_STRATEGIES))
    if unknown:
        raise PlanError("--strategy", f"unknown strategy {unknown[0]!r}", f"use some of {list(ALL_STRATEGIES)}")
    check_release(wishes.vllm_version)
    check_block_size(spec, {n.kind for n in nodes}, wishes.block_size, wishes.vllm_version)
    if not isinstance(wishes.extra_env, Mapping):
        raise PlanError("vllm_fleet_extra_env", f"must be a mapping, got {wishes.extra_env!r}", "e.g. {A: '1'}")
    tp = wishes.tensor_parallel_size
    dp = wishes.data_parallel_size
    if dp and dp > 1 and ((tp and tp > 1) or (wishes.pipeline_parallel_size or 1) > 1):
        # The DP layouts the planner builds are TP=1 PP=1 per rank: a forced TP or PP beside a
        # forced DP would otherwise be dropped without a word.
        forced = f"TP={tp}" if tp and tp > 1 else f"PP={wishes.pipeline_parallel_size}"
        raise PlanError(
            "--data-parallel-size",
            f"DP={dp} with {forced}: the planner lays DP out as one GPU per rank (TP=1, PP=1), so it "
            f"cannot honour {forced} beside it",
            "drop --data-parallel-size (the planner then chooses TP/PP), or drop the TP/PP size",
        )
    if tp:
        check_forced_tp(spec, nodes, wishes, tp)
    if tp and spec.num_attention_heads % tp:
        divisors = [d for d in range(1, 17) if spec.num_attention_heads % d == 0]
        raise PlanError(
            "--tensor-parallel-size",
            f"TP={tp} does not divide the {spec.num_attention_heads} attention heads of {spec.name}",
            f"use one of {divisors}",
        )
    pp = wishes.pipeline_parallel_size
    if pp and pp > spec.num_layers:
        raise PlanError(
            "--pipeline-parallel-size",
            f"{pp} stages for {spec.num_layers} layers",
            f"use at most {spec.num_layers}",
        )
    total = sum(n.gpu_count for n in nodes)
    if (tp or 1) * (pp or 1) > total:
        raise PlanError(
            "--pipeline-parallel-size" if pp else "--tensor-parallel-size",
            f"TP={tp or 1} x PP={pp or 1} needs {(tp or 1) * (pp or 1)} GPUs, the cluster has {total}",
            "ask for fewer, or unset them and let the planner choose",
        )
    if not isinstance(wishes.extra_args, list | tuple) or not all(isinstance(a, str) for a in wishes.extra_args):
        raise PlanError("vllm_fleet_extra_args", f"must be a list of strings, got {wishes.extra_args!r}", "e.g. []")
    check_quantization_flag(
        spec, wishes.quantization, rendered=True, vllm_version=wishes.vllm_version, extra_args=wishes.extra_args
    )
    if wishes.max_model_len:
        check_max_model_len(spec, wishes.max_model_len, wishes.extra_env)


def check_forced_tp(spec: ModelSpec, nodes: list[Node], wishes: Wishes, tp: int) -> None:
    """A forced TP larger than every node: say so (not a max_model_len or fp8 hint)."""
    largest = max(n.gpu_count for n in nodes)
    if tp <= largest:
        return
    if wishes.allow_cross_node_tp:
        # Cross-node TP spans two nodes of one GPU type (strategy tp_cross_node).
        spans = sorted({2 * min(n.gpu_count for n in group) for group in groups_of(nodes).values() if len(group) >= 2})
        if tp in spans:
            return
        across = f"; across two nodes TP={' or '.join(str(s) for s in spans)}" if spans else ""
    else:
        across = ", or pass --allow-cross-node-tp to span two nodes with TP (slower than PP across nodes)"
    valid = valid_tps(spec, largest)
    raise NothingFitsError(
        "--tensor-parallel-size",
        f"TP={tp} needs {tp} GPUs in one node, the largest has {largest}",
        f"use TP of at most {largest} (valid for {spec.name}: {', '.join(map(str, valid))}) with PP across nodes"
        + across,
    )


def groups_of(nodes: list[Node]) -> dict[str, list[Node]]:
    groups: dict[str, list[Node]] = {}
    for node in nodes:
        groups.setdefault(node.gpu_key, []).append(node)
    return groups


def nodes_vllm_runs_on(spec: ModelSpec, nodes: list[Node], wishes: Wishes) -> tuple[list[Node], dict[str, str]]:
    """The nodes whose GPUs vLLM can run the request on, and why the others are left out
    (bf16 on a V100, fp8 or mxfp4 weights below their compute capability...). When none can,
    the first node's reason is the error."""
    usable: list[Node] = []
    refused: dict[str, str] = {}
    first: PlanError | None = None
    for node in nodes:
        err = vllm_refusal(
            spec, node.device(), wishes.dtype, wishes.quantization, wishes.kv_cache_dtype, wishes.vllm_version
        )
        if err is None:
            usable.append(node)
            continue
        first = first or err
        refused[node.name] = err.problem
    if first is not None and not usable:
        raise first
    return usable, refused
