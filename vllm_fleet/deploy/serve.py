"""From a planned instance to the processes the vllm_server role starts, and
from what vLLM printed back to the figures verify compares with the plan.

``launches`` gives, for one node, every ``vllm serve`` it runs: the exact
argument list and environment, the unit/container name, and whether the node
answers HTTP (the head) or runs headless ranks. Three multi-node forms:

The plan chose each instance's executor (``instance["executor"]``):

* ``ray``: only the head runs ``vllm serve --distributed-executor-backend ray``;
  the other nodes are Ray workers (the cluster phase), so they get nothing here.
* ``native``: every node runs ``vllm serve`` with ``--nnodes/--node-rank/
  --master-addr/--master-port``; ranks > 0 add ``--headless``.
* DP (+EP): every node runs its local DP ranks; the head answers HTTP, the
  others add ``--headless --data-parallel-start-rank``.

Pure Python, no vLLM import: unit tests check these lists exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from vllm_fleet.cli_args import secret_flags
from vllm_fleet.errors import PlanError
from vllm_fleet.planning.table import format_table

DEFAULT_MASTER_PORT = 29501
DEFAULT_DP_RPC_PORT = 13345


@dataclass
class ServeOptions:
    """Serving wishes that do not change the memory plan (the inventory's
    ``vllm_fleet_*`` variables of the same names); those the planner models are in the plan's
    arguments already (vllm_fleet/schema.py)."""

    model: str | None = None
    master_port: int = DEFAULT_MASTER_PORT
    dp_rpc_port: int = DEFAULT_DP_RPC_PORT
    enable_chunked_prefill: bool | None = None
    trust_remote_code: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    cpu_cores: int | None = None
    ray_port: int = 6379

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> ServeOptions:
        raw = {k: v for k, v in (raw or {}).items() if v is not None and v not in ("", "None")}
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise PlanError("serve options", f"unknown option(s) {unknown}", f"use one of {sorted(known)}")
        for key in ("enable_chunked_prefill", "trust_remote_code"):
            if isinstance(raw.get(key), str):
                raw[key] = raw[key].strip().lower() in ("1", "true", "yes", "on")
        for key in ("master_port", "dp_rpc_port", "cpu_cores", "ray_port"):
            if key in raw:
                try:
                    raw[key] = int(raw[key])
                except (TypeError, ValueError) as exc:
                    raise PlanError(f"vllm_fleet_{key}", f"{raw[key]!r} is not an integer", "give a number") from exc
        opts = cls(**raw)
        if not isinstance(opts.extra_args, list) or not all(isinstance(a, str) for a in opts.extra_args):
            raise PlanError(
                "vllm_fleet_extra_args", f"must be a list of strings, got {opts.extra_args!r}", 'e.g. ["--seed", "1"]'
            )
        if not isinstance(opts.extra_env, dict):
            raise PlanError(
                "vllm_fleet_extra_env", f"must be a mapping, got {opts.extra_env!r}", "e.g. {VLLM_LOGGING_LEVEL: DEBUG}"
            )
        for flag in ("--api-key", "--hf-token"):
            if flag in secret_flags(opts.extra_args):
                raise PlanError(
                    "vllm_fleet_extra_args",
                    f"holds {flag}: a secret on the command line is visible in ps and in logs",
                    "set vllm_fleet_api_key / vllm_fleet_hf_token (Ansible Vault or the environment) instead",
                )
        return opts


def _common_flags(opts: ServeOptions) -> list[str]:
    args: list[str] = []
    if opts.enable_chunked_prefill is not None:
        args.append("--enable-chunked-prefill" if opts.enable_chunked_prefill else "--no-enable-chunked-prefill")
    if opts.trust_remote_code:
        args.append("--trust-remote-code")
    if opts.tool_call_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", opts.tool_call_parser]
    if opts.reasoning_parser:
        args += ["--reasoning-parser", opts.reasoning_parser]
    return args + list(opts.extra_args)


def _without(args: list[str], flag: str, takes_value: bool = True) -> list[str]:
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = takes_value
            continue
        out.append(a)
    return out


def cpu_binding(ranks: int, cores: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for ``ranks`` local ranks on ``cores`` cores:
    contiguous core ranges, one per rank, separated by ``|`` (vLLM's format).
    Fewer cores than ranks: ranks share cores round-robin."""
    if ranks < 1 or cores < 1:
        raise PlanError("cpu cores", f"{cores} core(s) for {ranks} rank(s)", "give the node at least one core")
    parts = []
    for r in range(ranks):
        if cores >= ranks:
            lo = r * cores // ranks
            hi = (r + 1) * cores // ranks - 1
        else:
            lo = hi = r % cores
        parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
    return "|".join(parts)


def _local_ranks(inst: dict[str, Any], node: str) -> int:
    """The worker ranks ``inst`` runs on ``node`` (DP: its local DP ranks; else TP x PP over its nodes)."""
    stages = [s for s in inst["stages"] if s["node"] == node]
    nodes = list(dict.fromkeys(s["node"] for s in inst["stages"]))
    if int(inst.get("data_parallel_size", 1)) > 1:
        return max(1, sum(int(s["gpu_count"]) for s in stages))
    return max(1, int(inst["tensor_parallel_size"]) * int(inst["pipeline_parallel_size"]) // len(nodes))


def core_blocks(ranks: list[int], cores: int) -> list[tuple[int, int]] | None:
    """Disjoint ``(first core, count)`` blocks of ``cores`` for CPU launches on one node with
    ``ranks`` worker ranks each, in proportion to their ranks: several CPU instances on one
    node would otherwise all bind from core 0 and share it. None when there are fewer cores
    than ranks (the launches then share cores, as one launch's ranks do)."""
    total = sum(ranks)
    if len(ranks) < 2 or cores < total:
        return None
    blocks, start = [], 0
    for i, r in enumerate(ranks):
        size = cores - start if i == len(ranks) - 1 else max(r, cores * r // total)
        blocks.append((start, size))
        start += size
    return blocks


def _shifted(binding: str, first: int) -> str:
    """A VLLM_CPU_OMP_THREADS_BIND value with every core number moved up by ``first``."""
    return "|".join("-".join(str(int(core) + first) for core in part.split("-")) for part in binding.split("|"))


def _address(instance: dict[str, Any]) -> str:
    return str(instance["endpoint"]).rsplit(":", 1)[0]


def _stage_address(stage: dict[str, Any]) -> str:
    return str(stage.get("env", {}).get("VLLM_HOST_IP") or stage["node"])


def unit_name(instance: dict[str, Any]) -> str:
    """``vllm-<instance>``: the systemd unit / container name (letters, digits, - . _)."""
    return "vllm-" + re.sub(r"[^A-Za-z0-9_.-]", "-", str(instance["name"]))


def _replace(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    if flag in out:
        out[out.index(flag) + 1] = value
    return out


def launches(instances: list[dict[str, Any]], node: str, options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """What ``node`` runs for the plan's ``instances``: a list of
    ``{name, instance, executor, argv, env, port, serves, role, node_rank, gpu_ids, ...}``.
    The executor is the plan's (``instance["executor"]``): nothing here re-decides it."""
    opts = ServeOptions.from_dict(options)
    out = []
    # CPU launches here (a Ray worker rank runs no launch of its own): each its own cores.
    cpu_here = [
        i for i in instances
        if i.get("device") == "cpu" and any(s["node"] == node for s in i["stages"])
        and not (str(i.get("executor")) == "ray" and i["stages"][0]["node"] != node)
    ]  # fmt: skip
    blocks = core_blocks([_local_ranks(i, node) for i in cpu_here], opts.cpu_cores) if opts.cpu_cores else None
    block_of = {str(i["name"]): b for i, b in zip(cpu_here, blocks or [], strict=False)}
    for inst in instances:
        stages = [s for s in inst["stages"] if s["node"] == node]
        if not stages:
            continue
        nodes = list(dict.fromkeys(s["node"] for s in inst["stages"]))
        rank = nodes.index(node)
        executor = str(inst.get("executor") or ("mp" if len(nodes) == 1 else "ray"))
        local_gpus = sum(s["gpu_count"] for s in stages)
        gpu_ids = [g for s in stages for g in s["gpu_ids"]]
        args = list(inst["vllm_args"])
        if opts.model and len(args) > 1 and args[0] == "serve":
            args[1] = opts.model  # the model's path on the nodes (prepare's model_cache_path)
        env: dict[str, str] = dict(inst.get("env", {}))
        env.update(stages[0].get("env", {}))
        serves = rank == 0
        role = "single" if len(nodes) == 1 else "head" if rank == 0 else "headless"
        if executor in ("native", "dp") and inst.get("device") == "cpu" and "kv_cache_memory_bytes" in stages[0]:
            # Each node's own vllm serve hands its workers this node's planned KV bytes.
            args = _replace(args, "--kv-cache-memory-bytes", str(stages[0]["kv_cache_memory_bytes"]))
        if executor == "dp":
            args = _without(args, "--data-parallel-size-local")
            args += ["--data-parallel-size-local", str(local_gpus)]
            args += ["--data-parallel-address", _address(inst), "--data-parallel-rpc-port", str(opts.dp_rpc_port)]
            if rank > 0:
                start = sum(
                    s["gpu_count"] for s in inst["stages"] if nodes.index(s["node"]) < rank
                )  # DP ranks held by the nodes before this one
                args += ["--headless", "--data-parallel-start-rank", str(start)]
        elif executor == "ray":
            if rank > 0:
                continue  # a Ray worker: the head's vllm serve places its ranks here
            if "--distributed-executor-backend" not in args:
                args += ["--distributed-executor-backend", "ray"]
            # The GCS on this head, at the address the plan gave it.
            env["RAY_ADDRESS"] = f"{_stage_address(stages[0])}:{opts.ray_port}"
        elif executor == "native":
            args = _without(args, "--distributed-executor-backend")
            args += [
                "--nnodes",
                str(len(nodes)),
                "--node-rank",
                str(rank),
                "--master-addr",
                _stage_address(next(s for s in inst["stages"] if s["node"] == nodes[0])),
                "--master-port",
                str(opts.master_port),
            ]
            if rank > 0:
                args.append("--headless")
        args += _common_flags(opts)
        if inst.get("device") == "cpu":
            env.setdefault("VLLM_TARGET_DEVICE", "cpu")
            if opts.cpu_cores and "VLLM_CPU_OMP_THREADS_BIND" not in opts.extra_env:
                first, count = block_of.get(str(inst["name"]), (0, opts.cpu_cores))
                env["VLLM_CPU_OMP_THREADS_BIND"] = _shifted(cpu_binding(_local_ranks(inst, node), count), first)
        else:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_ids)
        env.update({k: str(v) for k, v in opts.extra_env.items()})
        out.append(
            {
                "name": unit_name(inst),
                "instance": inst["name"],
                "executor": executor,
                "argv": ["vllm", *args],
                "env": dict(sorted(env.items())),
                "port": int(inst["port"]),
                "host": _stage_address(stages[0]),
                "serves": serves,
                "role": role,
                "node_rank": rank,
                "nnodes": len(nodes),
                "gpu_ids": gpu_ids,
                "predicted_kv_tokens": int(inst.get("memory", {}).get("kv_cache_tokens", 0)),
                "max_model_len": int(inst.get("max_model_len", 0)),
            }
        )
    return out


_KV_LINE = re.compile(
    r"(?P<pool>[A-Za-z+ ]*?)\s*KV cache size: (?P<tokens>[\d,]+) tokens, "
    r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<conc>[\d.]+)x"
)


def kv_report(log: str) -> dict[str, Any] | None:
    """The last "KV cache size: N tokens, Maximum concurrency ..." line vLLM
    printed (a restarted server prints it again), or None."""
    found = None
    for m in _KV_LINE.finditer(log):
        found = m
    if found is None:
        return None
    pool = found.group("pool").strip().split()[-1] if found.group("pool").strip() else "GPU"
    return {
        "pool": pool,
        "kv_tokens": int(found.group("tokens").replace(",", "")),
        "max_model_len": int(found.group("len").replace(",", "")),
        "max_concurrency": float(found.group("conc")),
    }


def compare(predicted: int, reported: int | None) -> dict[str, Any]:
    """Reported / predicted KV tokens, and a verdict: vLLM rounds to whole blocks
    and the planner models its profile pass, so within 5 % is a match."""
    if reported is None or predicted <= 0:
        return {"predicted": predicted, "reported": reported, "ratio": None, "verdict": "unknown"}
    ratio = reported / predicted
    verdict = "match" if abs(ratio - 1) <= 0.05 else "over" if ratio > 1 else "under"
    return {"predicted": predicted, "reported": reported, "ratio": round(ratio, 4), "verdict": verdict}


NOT_REPORTED = "not reported"


def compare_blocks(predicted: int, reported: int | None) -> dict[str, Any]:
    """:func:`compare` on KV blocks; no figure from vLLM is "not reported" (an older
    release, metrics off), which verify shows but never fails on."""
    out = compare(predicted, reported)
    if reported is None and predicted > 0:
        out["verdict"] = NOT_REPORTED
    return out


def predicted_blocks(instance: dict[str, Any]) -> int:
    """The KV blocks the plan predicts vLLM reports for ``instance``: the estimate's
    ``num_gpu_blocks`` (one engine; with PP already the smallest stage's, as
    get_kv_cache_configs gives every worker the minimum over workers) times its DP
    engines, as the front end sums the engines' blocks into its own cache config
    (core_client ``_apply_ready_response``), which is what /metrics shows."""
    blocks = int((instance.get("memory") or {}).get("num_gpu_blocks") or 0)
    return blocks * max(1, int(instance.get("data_parallel_size") or 1))


def reported_blocks(per_engine: dict[str, int] | None) -> int | None:
    """The blocks one front end reports from the probe's ``{engine: num_gpu_blocks}``.
    Every engine's ``vllm:cache_config_info`` sample carries the front end's one cache
    config, whose num_gpu_blocks is already the sum over its DP engines: the samples
    agree, so adding them would count the engines again. The largest is taken."""
    if not per_engine:
        return None
    return max(int(v) for v in per_engine.values())


def _blocks_cell(blocks: dict[str, Any] | None) -> str:
    if not blocks or not blocks.get("predicted"):
        return "-"
    if blocks.get("reported") is None:
        return NOT_REPORTED
    return f"{blocks['reported']:,}/{blocks['predicted']:,} {blocks['verdict']}"


def verify_table(rows: list[dict[str, Any]]) -> str:
    """The summary verify prints: one line per endpoint checked."""
    headers = [
        "endpoint",
        "via",
        "layout",
        "health",
        "models",
        "completion",
        "stream",
        "first token",
        "KV predicted",
        "KV reported",
        "ratio",
        "blocks (vLLM/plan)",
    ]
    body = []
    for r in rows:
        kv = r.get("kv") or {}
        ttft = r.get("first_token_s")
        body.append(
            [
                str(r["endpoint"]),
                str(r.get("via", "direct")),
                str(r.get("layout", "")),
                "ok" if r.get("health") else "FAIL",
                "ok" if r.get("models") else "FAIL",
                "ok" if r.get("completion") else "FAIL",
                "ok" if r.get("stream") else "FAIL",
                "-" if ttft is None else f"{ttft * 1000:.0f} ms",
                f"{kv['predicted']:,}" if kv.get("predicted") else "-",
                f"{kv['reported']:,}" if kv.get("reported") else "-",
                f"{kv['ratio']:.3f}" if kv.get("ratio") is not None else "-",
                _blocks_cell(r.get("blocks")),
            ]
        )
    table = format_table(headers, body)
    loads = [r for r in rows if r.get("load")]
    if not loads:
        return table
    lines = []
    for r in loads:
        load = r["load"]

        def cell(key: str, unit: str, load: dict[str, Any] = load) -> str:
            c = load[key]
            if c["measured"] is None:
                return f"- / {c['predicted']:,.1f}{unit}"
            return f"{c['measured']:,.1f} / {c['predicted']:,.1f}{unit} ({c['ratio']:.2f})"

        lines.append(
            [
                str(r["endpoint"]),
                f"{load['requests']} ({load['failed']} failed)",
                cell("output_token_throughput", ""),
                cell("ttft_ms", " ms"),
                cell("tpot_ms", " ms"),
                "ok" if load["within_band"] else f"outside {LOAD_BAND[0]}-{LOAD_BAND[1]}",
            ]
        )
    heads = ["load through", "requests", "output tok/s measured / predicted (ratio)", "TTFT median", "TPOT median",
             "vs plan"]  # fmt: skip
    return table + "\n\n" + format_table(heads, lines)


def layout(instance: dict[str, Any]) -> str:
    """``TP2 PP1 on node1`` / ``DP8 EP TP1 on node1+node2``."""
    parts = []
    dp = int(instance.get("data_parallel_size", 1))
    if dp > 1:
        parts.append(f"DP{dp}")
        if instance.get("enable_expert_parallel"):
            parts.append("EP")
    parts.append(f"TP{instance['tensor_parallel_size']} PP{instance['pipeline_parallel_size']}")
    return " ".join(parts) + " on " + "+".join(instance["nodes"])


def verify_target(instance: dict[str, Any], model: str, with_load: bool = False) -> dict[str, Any]:
    """What verify probes for one instance: its head's endpoint, directly, the KV blocks the
    plan predicts its /metrics reports, and (``with_load``: no gateway in front) the bounded load
    shaped like the workload."""
    target = {
        "endpoint": instance["endpoint"],
        "via": "direct",
        "name": instance["name"],
        "layout": layout(instance),
        "model": model,
        "predicted_blocks": predicted_blocks(instance),
    }
    load = verify_load([instance]) if with_load else None
    if load:
        target["load"] = load
    return target


def verify_load(instances: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The load verify sends through one endpoint to ``instances`` (each instance's planned
    share summed), with the plan's prediction for it: throughput summed, latencies the slowest
    member's. None when the plan predicted none (a plan from before the performance model)."""
    found = [(i.get("performance") or {}).get("verify") for i in instances]
    shares = [s for s in found if s is not None]
    if not shares or len(shares) != len(found):
        return None
    return {
        "requests": sum(s["requests"] for s in shares),
        "concurrency": sum(s["concurrency"] for s in shares),
        "budget_s": max(float(s.get("budget_s") or 0) for s in shares) or None,
        "input_len": min(s["input_len"] for s in shares),
        "output_len": min(s["output_len"] for s in shares),
        "predicted": {
            "output_token_throughput": round(sum(s["output_token_throughput"] for s in shares), 2),
            "ttft_ms": {q: max(s["ttft_ms"][q] for s in shares) for q in ("median", "p90")},
            "tpot_ms": {q: max(s["tpot_ms"][q] for s in shares) for q in ("median", "p90")},
        },
        "calibration": shares[0].get("calibration"),
    }


# measured / predicted outside this band is flagged in verify's summary (the target for
# the local default: 0.67-1.5).
LOAD_BAND = (0.67, 1.5)


def compare_load(load: dict[str, Any] | None, measured: dict[str, Any] | None) -> dict[str, Any] | None:
    """Measured against predicted for verify's load: output tok/s, TTFT and TPOT medians, each
    as {predicted, measured, ratio}, and whether every ratio lies in :data:`LOAD_BAND`."""
    if not load or not measured or not load.get("predicted"):
        return None
    pred = load["predicted"]
    out: dict[str, Any] = {"requests": measured.get("requests"), "failed": measured.get("failed"),
                           "calibration": load.get("calibration")}  # fmt: skip
    within = True
    for key, p, m in (
        ("output_token_throughput", pred["output_token_throughput"], measured.get("output_token_throughput")),
        ("ttft_ms", pred["ttft_ms"]["median"], (measured.get("ttft_ms") or {}).get("median")),
        ("tpot_ms", pred["tpot_ms"]["median"], (measured.get("tpot_ms") or {}).get("median")),
    ):
        ratio = round(m / p, 3) if m and p else None
        out[key] = {"predicted": p, "measured": m, "ratio": ratio}
        if key != "ttft_ms" and (ratio is None or not LOAD_BAND[0] <= ratio <= LOAD_BAND[1]):
            within = False
    out["within_band"] = within
    return out


def verify_rows(probes: list[dict[str, Any]], reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The probe's results with each instance's KV report (by instance name) and KV
    blocks (``blocks``: the plan's against /metrics') attached; the gateway row gets the
    sums over its instances."""
    by_instance = {r["instance"]: r for r in reports}
    rows = []
    for probe in probes:
        row = dict(probe)
        row["load"] = compare_load(probe.get("load"), probe.get("load_measured"))
        if probe.get("via") == "gateway":
            members = probe.get("instances")  # several models: the route's own instances
            kvs = [r["kv"] for r in reports if members is None or r["instance"] in members]
            # No instance's report read (a run limited to other hosts): no "kv" key, as on an
            # instance row without one (a None there broke the summary's warnings).
            if kvs:
                reported = sum(k["reported"] for k in kvs) if all(k["reported"] for k in kvs) else None
                row["kv"] = compare(sum(k["predicted"] for k in kvs), reported)
        else:
            if probe.get("name") in by_instance:
                row["kv"] = by_instance[probe["name"]]["kv"]
            if probe.get("predicted_blocks"):
                row["blocks"] = compare_blocks(int(probe["predicted_blocks"]), reported_blocks(probe.get("gpu_blocks")))
        rows.append(row)
    direct = [r["blocks"] for r in rows if r.get("via") != "gateway" and r.get("blocks")]
    for row in rows:
        if row.get("via") == "gateway" and direct:
            known = all(b["reported"] is not None for b in direct)
            row["blocks"] = compare_blocks(
                sum(b["predicted"] for b in direct), sum(b["reported"] for b in direct) if known else None
            )
    return rows
