"""The Grafana dashboards and Prometheus rules of the monitoring role: their queries and the metric names they may use.

:func:`panel_queries` reads a dashboard JSON and returns every target's PromQL with Grafana's
template variables replaced by values Prometheus accepts (a query variable by the ``.*`` regex,
``$__rate_interval`` by ``1m``...), so the queries can be checked by ``promtool`` or run against a
live Prometheus. :data:`VLLM_METRICS` lists what vLLM 0.32 registers, so a test can refuse a
dashboard or a rule that names a metric vLLM does not expose.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from vllm_fleet.errors import PlanError

MetricKind = Literal["counter", "gauge", "histogram"]

# Every metric vLLM 0.32 registers in vllm/v1/metrics/loggers.py (PrometheusStatLogger), by the
# name given to prometheus_client, with its kind; all carry the labels model_name and engine
# (vllm:admission_rejections: model_name and reason; vllm:lora_requests_info: none of them).
# prometheus_client exposes a counter as NAME_total (and NAME_created), a histogram as
# NAME_bucket/_sum/_count (and _created): :func:`exposed_series` spells them out. Some exist only
# with an option: corrupted_requests (VLLM_COMPUTE_NANS_IN_LOGITS), watermark_requests
# (watermark_config), num_requests_kv_fetch_by_stage (a KV consumer), kv_block_* (--kv-cache-metrics),
# lora_requests_info (LoRA). vLLM 0.32 has no vllm:time_per_output_token_seconds: the inter-token
# latency is vllm:inter_token_latency_seconds, the per-request mean vllm:request_time_per_output_token_seconds.
VLLM_METRICS: dict[str, MetricKind] = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_waiting_by_reason": "gauge",
    "vllm:num_requests_kv_fetch_by_stage": "gauge",
    "vllm:engine_sleep_state": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:corrupted_requests": "counter",
    "vllm:watermark_requests": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:external_prefix_cache_queries": "counter",
    "vllm:external_prefix_cache_hits": "counter",
    "vllm:mm_cache_queries": "counter",
    "vllm:mm_cache_hits": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:prompt_tokens_cached": "counter",
    "vllm:prompt_tokens_cached_by_source": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:admission_rejections": "counter",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:iteration_tokens_total": "histogram",  # a histogram despite its name
    "vllm:request_max_num_generation_tokens": "histogram",
    "vllm:request_params_n": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_num_preemptions": "histogram",
    "vllm:request_prefill_kv_computed_tokens": "histogram",
    "vllm:kv_block_lifetime_seconds": "histogram",
    "vllm:kv_block_idle_before_evict_seconds": "histogram",
    "vllm:kv_block_reuse_gap_seconds": "histogram",
    "vllm:lora_requests_info": "gauge",
    "vllm:cache_config_info": "gauge",  # log_metrics_info("cache_config", ...): an info gauge set to 1
}

# The scrape jobs the monitoring role renders.
SCRAPE_JOBS = ("vllm", "ray", "gateway", "router", "node", "dcgm", "prometheus")

# Grafana's built-in variables, by values Prometheus accepts.
BUILTIN_VALUES = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__interval_ms": "60000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}

_VARIABLE_RE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\[\[(\w+)(?::[^\]]*)?\]\]|\$(\w+)")
_VLLM_NAME_RE = re.compile(r"vllm:[A-Za-z0-9_:]+")
_RANGE_FUNCTION_RE = re.compile(r"\b(?:rate|irate|increase)\(\s*$")


def exposed_series(name: str, kind: MetricKind) -> tuple[str, ...]:
    """The series names prometheus_client exposes for a metric registered as ``name``."""
    if kind == "counter":
        return (f"{name}_total", f"{name}_created")
    if kind == "histogram":
        return (f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created")
    return (name,)


def vllm_series() -> dict[str, MetricKind]:
    """Every series name vLLM 0.32 exposes, with the kind of the metric behind it."""
    return {series: kind for name, kind in VLLM_METRICS.items() for series in exposed_series(name, kind)}


def vllm_name_problems(expr: str) -> list[str]:
    """What is wrong with the vLLM metric names in a PromQL expression: names vLLM does not expose,
    counter series read without rate()/irate()/increase(), gauges given to them."""
    series = vllm_series()
    problems = []
    for match in _VLLM_NAME_RE.finditer(expr):
        name = match.group(0)
        in_range_function = _RANGE_FUNCTION_RE.search(expr[: match.start()]) is not None
        kind = series.get(name)
        if kind is None:
            problems.append(f"{name} is not a series vLLM 0.32 exposes")
        elif name.endswith("_created"):
            problems.append(f"{name} is a creation timestamp, not a measurement")
        elif kind != "gauge" and not in_range_function:
            problems.append(f"{name} is a {kind} series: read it through rate(), irate() or increase()")
        elif kind == "gauge" and in_range_function:
            problems.append(f"{name} is a gauge: rate()/irate()/increase() are for counters")
    return problems


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' collapsed panels included."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def load(path: str | Path) -> dict[str, Any]:
    """A dashboard JSON file as a dict."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise PlanError(str(path), f"cannot read the dashboard: {err}", "give a Grafana dashboard JSON file") from err
    if not isinstance(data, dict):
        raise PlanError(str(path), "is not a JSON object", "give a Grafana dashboard JSON file")
    return data


def panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's panels, flattened (a collapsed row's panels follow the row)."""
    return list(_panels(list(dashboard.get("panels", []))))


def variable_values(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """A value for each template variable that Prometheus accepts in the dashboard's queries.

    Query and custom variables are matched with ``=~`` in the queries and become ``.*``; an
    interval variable becomes its first option, a constant or textbox its value.
    """
    values = dict(BUILTIN_VALUES)
    for var in dashboard.get("templating", {}).get("list", []):
        name, kind = var.get("name", ""), var.get("type", "")
        if kind in ("constant", "textbox"):
            values[name] = str(var.get("query", ""))
        elif kind == "interval":
            values[name] = str(var.get("query", "1m")).split(",")[0].strip() or "1m"
        elif kind == "datasource":
            values[name] = str(var.get("query", ""))
        else:
            values[name] = ".*"
    return values


def substitute(expr: str, values: Mapping[str, str], where: str = "expr") -> str:
    """``expr`` with every ``$var``, ``${var}``, ``${var:format}`` and ``[[var]]`` replaced from ``values``."""

    def repl(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group is not None)
        if name not in values:
            raise PlanError(
                where,
                f"uses ${name}, which is neither a template variable of the dashboard nor a Grafana built-in",
                f"add {name} to templating.list or use one of {', '.join('$' + v for v in sorted(values))}",
            )
        return values[name]

    return _VARIABLE_RE.sub(repl, expr)


def panel_queries(path: str | Path) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target with an ``expr`` in the dashboard at ``path``, in panel
    order, with the template variables substituted (see :func:`variable_values`)."""
    dashboard = load(path)
    values = variable_values(dashboard)
    out = []
    for panel in panels(dashboard):
        title = str(panel.get("title", ""))
        for target in panel.get("targets", []):
            expr = target.get("expr")
            if not expr:
                continue
            where = f"{Path(path).name}: panel {title!r} target {target.get('refId', '?')}"
            out.append((title, substitute(str(expr), values, where)))
    return out
