"""Plain-text tables for people: the estimate with per-GPU bars, and the plan."""

from __future__ import annotations

from typing import Any

from vllm_fleet.accounting.memory import Estimate
from vllm_fleet.performance.serving import Prediction

BAR_WIDTH = 40


def _bar(parts: list[tuple[str, float]], total: float) -> str:
    """A bar of ``BAR_WIDTH`` cells: W weights, O overheads, K KV cache, . unused."""
    if total <= 0:
        return "." * BAR_WIDTH
    cells = ""
    for char, value in parts:
        cells += char * max(0, round(value / total * BAR_WIDTH))
    cells = cells[:BAR_WIDTH]
    return cells + "." * (BAR_WIDTH - len(cells))


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    line = "  ".join(h.ljust(widths[i]) for i, h in enumerate(headers))
    out = [line, "  ".join("-" * w for w in widths)]
    for row in rows:
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)))
    return "\n".join(out)


def render_estimate(est: Estimate) -> str:
    head = (
        f"{est.model} on {est.device}: TP={est.tensor_parallel_size} PP={est.pipeline_parallel_size}"
        f" util={est.gpu_memory_utilization} max_model_len={est.max_model_len}"
        f" max_num_seqs={est.max_num_seqs} max_num_batched_tokens={est.max_num_batched_tokens}"
        f" dtype={est.dtype} kv={est.kv_cache_dtype}"
        + (f" quant={est.quantization}" if est.quantization else "")
        + (" eager" if est.enforce_eager else "")
    )
    rows = []
    seen: set[int] = set()
    for r in est.ranks:
        # TP ranks of one stage are identical; show one line per stage.
        if r.pp_stage in seen:
            continue
        seen.add(r.pp_stage)
        over = r.activation_gib + r.non_torch_gib + r.cuda_graph_gib
        bar = _bar([("W", r.weights_gib), ("O", over), ("K", r.kv_cache_gib)], r.total_gib)
        ranks = f"{r.rank}-{r.rank + est.tensor_parallel_size - 1}" if est.tensor_parallel_size > 1 else str(r.rank)
        rows.append(
            [
                ranks,
                f"{r.layers[0]}-{r.layers[1] - 1}",
                f"{r.weights_gib:.2f}",
                f"{r.activation_gib:.2f}",
                f"{r.non_torch_gib:.2f}",
                f"{r.cuda_graph_gib:.2f}",
                f"{r.kv_cache_gib:.2f}",
                f"{r.total_gib:.2f}",
                bar,
            ]
        )
    table = format_table(
        ["ranks", "layers", "weights", "activ.", "non-torch", "graphs", "KV", "total", "W=weights O=overheads K=KV"],
        rows,
    )
    verdict = "FITS" if est.fits else "DOES NOT FIT"
    lines = [
        head,
        "",
        table,
        "",
        f"KV cache: {est.kv_cache_tokens:,} tokens per instance ({est.kv_bytes_per_token:,} bytes/token/GPU, "
        f"{est.num_gpu_blocks:,} blocks of {est.block_size}); "
        f"max concurrency at {est.max_model_len:,} tokens: {est.max_concurrency:.2f}x; "
        f"largest max_model_len that fits: {est.max_model_len_fit:,}",
        f"{verdict}: {est.reason}",
    ]
    for stage, r in enumerate(r for r in est.ranks if r.tp_rank == 0):
        if r.parts:
            shown = ", ".join(f"{k} {_part(k, v)}" for k, v in sorted(r.parts.items()))
            lines.append(f"stage {stage} parts: {shown}")
    lines += [f"assumed: {a}" for a in est.assumptions]
    lines += [f"note: {n}" for n in est.notes]
    if est.launch_env:
        # What these figures need vLLM started with (the plan renders it into every launch).
        lines.append("start vLLM with: " + " ".join(f"{k}={v}" for k, v in sorted(est.launch_env.items())))
    return "\n".join(lines)


def _part(key: str, value: float) -> str:
    if key.endswith("_gib"):
        return f"{value:.2f} GiB"
    return f"{int(value):,}"


def render_performance(pred: Prediction) -> str:
    """What the instance serves under its workload, with the band (estimate's text)."""
    d = pred.to_dict()
    band = d["band"]
    lines = [
        f"Predicted for {pred.workload.describe().replace('load: as much as the SLO allows', 'every request at once')}"
        f" ({pred.workload.num_prompts:,} requests):",
        format_table(
            ["", "mean", "median", "p90", "p99"],
            [
                [name, *(f"{d[key][q]:,.1f}" for q in ("mean", "median", "p90", "p99"))]
                for name, key in (("TTFT ms", "ttft_ms"), ("TPOT ms", "tpot_ms"), ("ITL ms", "itl_ms"))
            ],
        ),
        f"throughput: {pred.request_throughput:,.2f} requests/s, {pred.output_token_throughput:,.0f} output tok/s "
        f"(band {band['output_token_throughput'][0]:,.0f}-{band['output_token_throughput'][1]:,.0f}), "
        f"{pred.total_token_throughput:,.0f} total tok/s",
        f"batch: {pred.batch:,.1f} running on average, at most {pred.max_batch:,.0f} (bound by {pred.bound}); "
        f"prefill steps {pred.prefill_bound}-bound, decode steps {pred.decode_bound}-bound; "
        f"saturates at {pred.saturation_rate:,.2f} requests/s",
    ]
    lines += [f"note: {n}" for n in pred.notes]
    return "\n".join(lines)


def _perf_cells(perf: dict[str, Any] | None) -> list[str]:
    if not perf:
        return ["", "", "", ""]
    band = perf["band"]
    return [
        f"{perf['output_token_throughput']:,.0f}",
        f"{perf['ttft_ms']['p90']:,.0f} ({band['ttft_ms'][0]:,.0f}-{band['ttft_ms'][1]:,.0f})",
        f"{perf['tpot_ms']['p90']:,.1f} ({band['tpot_ms'][0]:,.1f}-{band['tpot_ms'][1]:,.1f})",
        perf["bound"],
    ]


def render_plan(plan: dict[str, Any], gateway: dict[str, Any] | None = None) -> str:
    """The plan as a table; with the deployment's ``gateway``, the gateway line names the
    balancer that deployment chose and why (gateway_balancer auto)."""
    rows = []
    for inst in plan["instances"]:
        mem = inst["memory"]
        stages = ", ".join(
            f"{s['node']}x{s['gpu_count']}[{s['layers'][0]}-{s['layers'][1] - 1}]" for s in inst["stages"]
        )
        rows.append(
            [
                inst["name"],
                f"TP{inst['tensor_parallel_size']} PP{inst['pipeline_parallel_size']}"
                + (f" DP{inst['data_parallel_size']}" if inst["data_parallel_size"] > 1 else "")
                + (" EP" if inst["enable_expert_parallel"] else ""),
                stages,
                f"{mem['weights_gib']:.1f}",
                f"{mem['kv_cache_gib']:.1f}",
                f"{mem['kv_cache_tokens']:,}",
                f"{mem['max_concurrency']:.1f}x",
                str(inst["max_model_len"]),
                str(inst.get("executor", "")),
                *_perf_cells(inst.get("performance")),
            ]
        )
    # Several models (allocate.combined_plan): who got which GPU comes first.
    lines = [plan["allocation_table"], ""] if plan.get("allocation_table") else []
    lines += [
        f"Plan for {plan['model']} on {plan['cluster']['nodes']} node(s), {plan['cluster']['gpus']} GPU(s): "
        f"{plan['summary']}",
        "",
        format_table(
            [
                "instance",
                "layout",
                "stages (node x GPUs [layers])",
                "W GiB/GPU",
                "KV GiB/GPU",
                "KV tokens",
                "conc.",
                "max_len",
                "executor",
                "tok/s",
                "TTFT p90 ms (band)",
                "TPOT p90 ms (band)",
                "batch bound",
            ],
            rows,
        ),
    ]
    perf = plan.get("performance")
    if perf:
        slo = perf["slo"]
        bounds = " and ".join(
            f"{name} p90 <= {slo[key]:,.0f} ms" for name, key in (("TTFT", "ttft_p90_ms"), ("TPOT", "tpot_p90_ms"))
            if slo.get(key) is not None
        )  # fmt: skip
        asked = "" if perf["slo_asked"] else " (the default interactivity bound; set vllm_fleet_slo)"
        lines.append(
            f"predicted for {perf['workload_text']}: {perf['output_token_throughput']:,.0f} output tok/s, "
            f"{perf['request_throughput']:,.2f} requests/s, {perf['goodput']:,.2f} of them within {bounds}{asked}; "
            f"ranked by {perf['ranked_by']}"
        )
    for inst in plan["instances"]:
        if len(inst["nodes"]) > 1 and inst.get("executor_reason"):
            lines.append(f"{inst['name']} executor {inst['executor']}: {inst['executor_reason']}")
    if plan.get("vllm_version"):
        lines.append(f"vLLM {plan['vllm_version']} (memory accounting of that release)")
    chosen = gateway if gateway and gateway.get("enabled") else None
    strategy = chosen["strategy"] if chosen else plan["gateway"]["strategy"]
    if plan["gateway"].get("routes"):
        lines += ["", f"gateway: by the request's model, then {strategy}:"]
        lines += [f"  {r['model']}: {', '.join(r['upstreams'])}" for r in plan["gateway"]["routes"]]
    elif plan["gateway"]["upstreams"]:
        lines += ["", f"gateway: {strategy} over " + ", ".join(plan["gateway"]["upstreams"])]
    if chosen and chosen.get("balancer_reason") and (plan["gateway"].get("routes") or plan["gateway"]["upstreams"]):
        lines.append(f"  balancer {chosen['balancer']}: {chosen['balancer_reason']}")
    for warn in plan.get("warnings", []):
        lines.append(f"warning: {warn}")
    if plan["rejected"]:
        lines += ["", "Rejected layouts:"]
        for rej in plan["rejected"][:12]:
            lines.append(f"  - {rej['layout']}: {rej['reason']}")
        if len(plan["rejected"]) > 12:
            lines.append(f"  ... {len(plan['rejected']) - 12} more (see --json)")
    return "\n".join(lines)
