"""``vllm-fleet status``: what every vLLM instance of the plan is doing now.

Each instance's own ``/health`` and ``/metrics`` (the Prometheus text format, read with
:mod:`vllm_fleet.ops.metrics`; no Prometheus server) give one row: health, requests running /
waiting, KV cache usage, generation and prompt tokens/s, prefix-cache hit rate, preemptions,
uptime and the KV block count next to the plan's. Rates are differences between two scrapes.

Metric names are those vLLM 0.32 registers (vllm/v1/metrics/loggers.py, PrometheusStatLogger;
prometheus_client adds ``_total`` to counters). Every vLLM series has ``model_name`` and
``engine`` labels: with data parallelism there is one series per engine, and a row sums them.

Authentication: vLLM's ``--api-key`` / ``VLLM_API_KEY`` guard only the paths under
``/v1``, ``/v2``, ``/inference`` and ``/cohere`` (GUARDED_PREFIX of
vllm/entrypoints/serve/middleware/authenticate.py, vLLM 0.32; registered by
vllm/entrypoints/serve/middleware/register.py); ``/health`` and ``/metrics`` answer without a
key. The key is still sent when ``VLLM_API_KEY`` is set here, for a proxy in front that checks it.
It is read from the environment only, never from the command line (argv is visible to others).
"""

from __future__ import annotations

import argparse
import email.utils
import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vllm_fleet import tools
from vllm_fleet.deploy.serve import unit_name
from vllm_fleet.errors import PlanError
from vllm_fleet.ops import metrics, why
from vllm_fleet.planning.table import format_table

TIMEOUT_S = 3.0  # per instance: /health and /metrics together
MAX_METRICS_BYTES = 32 << 20
CHECKOUT = Path(__file__).resolve().parents[2]

# vLLM 0.32's names (PrometheusStatLogger).
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"  # a fraction: 1 means 100 percent
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
CACHE_CONFIG = "vllm:cache_config_info"
# prometheus_client's process collector: the API server process's start (Unix time). Absent
# in multiprocess mode (--api-server-count > 1, the default under data parallelism).
PROCESS_START = "process_start_time_seconds"


@dataclass(frozen=True)
class Target:
    """One instance of the plan."""

    name: str
    endpoint: str  # host:port
    served_model_name: str | None = None
    planned_blocks: int | None = None
    nodes: tuple[str, ...] = ()  # the inventory names of its nodes, the head's first


@dataclass
class Scrape:
    """One look at an instance: its /health answer and its parsed /metrics."""

    at: float  # time.monotonic() when it was taken
    health: str  # "ok", "HTTP 503", "unreachable: ..."
    healthy: bool
    exposition: metrics.Exposition | None = None
    metrics_error: str | None = None
    server_time: float | None = None  # the server's clock (HTTP Date of /metrics), Unix time


@dataclass
class Row:
    name: str
    endpoint: str
    healthy: bool
    health: str
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage_pct: float | None = None
    generation_tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    prefix_cache_hit_rate: float | None = None  # since start, 0..1
    prefix_cache_hit_rate_interval: float | None = None  # between the two scrapes
    preemptions: float | None = None
    uptime_s: float | None = None
    num_gpu_blocks: list[int] | None = None  # one per engine, as cache_config_info says
    planned_num_gpu_blocks: int | None = None
    interval_s: float | None = None
    engines: int | None = None
    notes: list[str] | None = None


# ---------------------------------------------------------------- where the instances are


def load_plan(path: Path, flag: str) -> dict[str, Any]:
    fix = "pass the plan.json a site.yml run wrote (<artifacts>/plan.json)"
    if flag == "--inventory":
        fix = "run `ansible-playbook site.yml -i INVENTORY` (or --tags plan) first, or pass --plan FILE"
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlanError(flag, f"cannot read {path}: {exc.strerror or exc}", fix) from exc
    try:
        plan = json.loads(text)
    except ValueError as exc:
        raise PlanError(flag, f"{path} is not JSON ({exc})", fix) from exc
    if not isinstance(plan, dict):
        raise PlanError(flag, f"{path} is not a plan (a JSON object with instances)", fix)
    return plan


_ENDPOINT = re.compile(r"[A-Za-z0-9._-]+:[0-9]{1,5}|\[[0-9a-fA-F:.]+\]:[0-9]{1,5}")


def targets_from_plan(plan: dict[str, Any], flag: str = "--plan") -> list[Target]:
    instances = plan.get("instances")
    if not isinstance(instances, list) or not instances:
        raise PlanError(flag, "the plan has no instances", "re-plan with `ansible-playbook site.yml --tags plan`")
    out = []
    for i, inst in enumerate(instances):
        if not isinstance(inst, dict):
            raise PlanError(f"{flag}: instances[{i}]", "is not an object", "re-plan, or fix the file")
        endpoint = inst.get("endpoint")
        if not isinstance(endpoint, str) or not _ENDPOINT.fullmatch(endpoint):
            raise PlanError(
                f"{flag}: instances[{i}].endpoint", f"{endpoint!r} is not host:port", "re-plan, or fix the file"
            )
        blocks = (inst.get("memory") or {}).get("num_gpu_blocks")
        out.append(
            Target(
                name=str(inst.get("name") or endpoint),
                endpoint=endpoint,
                served_model_name=inst.get("served_model_name"),
                planned_blocks=int(blocks)
                if isinstance(blocks, (int, float)) and not isinstance(blocks, bool)
                else None,
                nodes=tuple(str(n) for n in inst.get("nodes") or []),
            )
        )
    return out


_JINJA_DIR = re.compile(r"\{\{\s*(inventory_dir|playbook_dir)\s*\}\}")


def artifacts_dir(inventory: str, listed: dict[str, Any]) -> Path:
    """Where the plan playbook wrote for this inventory: ``vllm_fleet_artifacts_dir`` as the
    controller (localhost) sees it, else the checkout's ``artifacts/`` (playbooks/plan.yml).

    ``ansible-inventory --list`` merges group vars into every host: localhost's value when the
    inventory names localhost, else the value every host shares (an ``all`` group variable;
    the implicit localhost does not see one set for a group only).
    """
    hostvars: dict[str, Any] = (listed.get("_meta") or {}).get("hostvars") or {}
    if "localhost" in hostvars:
        value = hostvars["localhost"].get("vllm_fleet_artifacts_dir")
    else:
        values = {str(v.get("vllm_fleet_artifacts_dir")) for v in hostvars.values() if isinstance(v, dict)}
        value = values.pop() if len(values) == 1 and "None" not in values else None
    if value is None:
        return CHECKOUT / "artifacts"
    inv = Path(inventory).expanduser()
    inv_dir = inv if inv.is_dir() else inv.parent
    text = _JINJA_DIR.sub(
        lambda m: str(inv_dir.resolve() if m.group(1) == "inventory_dir" else CHECKOUT / "playbooks"), str(value)
    )
    if "{{" in text or "{%" in text:
        raise PlanError(
            "vllm_fleet_artifacts_dir",
            f"{value!r} is a template this command cannot render",
            "pass the plan with --plan <artifacts>/plan.json",
        )
    return Path(text).expanduser()


def plan_from_inventory(inventory: str) -> Path:
    # A missing inventory is an error, not the checkout's artifacts (another deployment's status).
    argv = [tools.tool("ansible-inventory", "--inventory"), "-i", tools.inventory(inventory), "--list"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    except subprocess.TimeoutExpired as exc:
        raise PlanError("--inventory", "ansible-inventory took over 120 s", "pass --plan FILE") from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PlanError("--inventory", f"ansible-inventory failed (exit {done.returncode}): {last}", "check the path")
    try:
        listed = json.loads(done.stdout)
    except ValueError as exc:
        raise PlanError("--inventory", f"ansible-inventory printed no JSON ({exc})", "pass --plan FILE") from exc
    return artifacts_dir(inventory, listed) / "plan.json"


# ---------------------------------------------------------------- scraping


# No proxy: instances are reached directly (an http_proxy meant for the internet must not
# carry, or fail, the scrapes of cluster-internal addresses).
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"User-Agent": "vllm-fleet-status", "Accept": "text/plain"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _why(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        exc = exc.reason if isinstance(exc.reason, BaseException) else exc
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def scrape(target: Target, api_key: str | None = None, timeout: float = TIMEOUT_S) -> Scrape:
    """GET /health then /metrics of ``target`` within ``timeout`` seconds; never raises for the network."""
    deadline = time.monotonic() + timeout
    base = f"http://{target.endpoint}"
    headers = _headers(api_key)

    def left() -> float:
        return max(0.05, deadline - time.monotonic())

    try:
        with _OPENER.open(urllib.request.Request(base + "/health", headers=headers), timeout=left()) as resp:
            resp.read(1 << 16)
            health, healthy = ("ok", True) if resp.status == 200 else (f"HTTP {resp.status}", False)
    except urllib.error.HTTPError as exc:
        health, healthy = f"HTTP {exc.code}", False
        exc.close()
    except (OSError, ValueError) as exc:  # URLError, timeouts, resets, a bad status line
        return Scrape(time.monotonic(), f"unreachable: {_why(exc)}", False)
    at = time.monotonic()
    try:
        with _OPENER.open(urllib.request.Request(base + "/metrics", headers=headers), timeout=left()) as resp:
            body = resp.read(MAX_METRICS_BYTES + 1)
            date = resp.headers.get("Date")
        at = time.monotonic()
        if len(body) > MAX_METRICS_BYTES:
            return Scrape(at, health, healthy, metrics_error=f"/metrics is over {MAX_METRICS_BYTES >> 20} MiB")
        exposition = metrics.parse(body.decode("utf-8"))
    except urllib.error.HTTPError as exc:
        exc.close()
        return Scrape(at, health, healthy, metrics_error=f"/metrics: HTTP {exc.code}")
    except (OSError, ValueError) as exc:  # includes MetricsParseError and UnicodeDecodeError
        return Scrape(at, health, healthy, metrics_error=f"/metrics: {_why(exc)}")
    server_time = None
    if date:
        try:
            server_time = email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            server_time = None
    return Scrape(at, health, healthy, exposition, server_time=server_time)


def scrape_all(targets: Sequence[Target], api_key: str | None = None, timeout: float = TIMEOUT_S) -> list[Scrape]:
    """Every target at once (threads): a slow instance costs ``timeout``, not n times it."""
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(targets)))) as pool:
        return list(pool.map(lambda t: scrape(t, api_key, timeout), targets))


# ---------------------------------------------------------------- numbers


def _rate(now: metrics.Exposition, before: metrics.Exposition, name: str, seconds: float) -> float | None:
    a, b = metrics.total(before, name), metrics.total(now, name)
    if a is None or b is None or seconds <= 0 or b < a:  # b < a: the server restarted between
        return None
    return (b - a) / seconds


def _ratio(hits: float | None, queries: float | None) -> float | None:
    if hits is None or queries is None or queries <= 0:
        return None
    return hits / queries


def summarize(target: Target, now: Scrape, before: Scrape | None = None) -> Row:
    """One row from the latest scrape and, for rates, the one before it."""
    row = Row(target.name, target.endpoint, now.healthy, now.health, planned_num_gpu_blocks=target.planned_blocks)
    notes: list[str] = []
    if now.metrics_error:
        notes.append(now.metrics_error)
    exp = now.exposition
    if exp is not None:
        row.running = metrics.total(exp, RUNNING)
        row.waiting = metrics.total(exp, WAITING)
        usage = metrics.by_label(exp, KV_USAGE, "engine")
        if usage:
            # Each engine has its own pool: the mean of their fractions is the instance's.
            row.kv_cache_usage_pct = 100 * math.fsum(usage.values()) / len(usage)
        row.engines = len(usage) or len(metrics.by_label(exp, RUNNING, "engine")) or None
        row.preemptions = metrics.total(exp, PREEMPTIONS)
        row.prefix_cache_hit_rate = _ratio(metrics.total(exp, PREFIX_HITS), metrics.total(exp, PREFIX_QUERIES))
        start = metrics.total(exp, PROCESS_START)
        if start is not None and start > 0:
            row.uptime_s = max(0.0, (now.server_time or time.time()) - start)
        blocks = metrics.label_values(exp, CACHE_CONFIG, "num_gpu_blocks")
        if blocks and all(b.isdigit() for b in blocks):
            row.num_gpu_blocks = [int(b) for b in blocks]
        served = sorted(set(metrics.label_values(exp, RUNNING, "model_name")))
        if target.served_model_name and served and served != [target.served_model_name]:
            notes.append(f"serves {', '.join(served)}, the plan says {target.served_model_name}")
        if row.running is None and not now.metrics_error:
            notes.append("no vllm:* metrics in /metrics (not a vLLM server?)")
    if exp is not None and before is not None and before.exposition is not None:
        seconds = now.at - before.at
        row.interval_s = round(seconds, 3)
        row.generation_tokens_per_s = _rate(exp, before.exposition, GENERATION_TOKENS, seconds)
        row.prompt_tokens_per_s = _rate(exp, before.exposition, PROMPT_TOKENS, seconds)
        dh = _rate(exp, before.exposition, PREFIX_HITS, 1.0)
        dq = _rate(exp, before.exposition, PREFIX_QUERIES, 1.0)
        row.prefix_cache_hit_rate_interval = _ratio(dh, dq)
    row.notes = notes or None
    return row


# ---------------------------------------------------------------- output


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def uptime_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{s:02d}s"
    return f"{s}s"


def _blocks(row: Row) -> str:
    if not row.num_gpu_blocks:
        return "-"
    distinct = sorted(set(row.num_gpu_blocks))
    text = "/".join(f"{b:,}" for b in distinct)
    return text + (f" x{len(row.num_gpu_blocks)}" if len(row.num_gpu_blocks) > 1 else "")


HEADERS = [
    "instance",
    "endpoint",
    "health",
    "run",
    "wait",
    "KV use",
    "gen tok/s",
    "prompt tok/s",
    "hit (total)",
    "hit (interval)",
    "preempt",
    "uptime",
    "KV blocks",
    "plan",
]


def render(rows: Sequence[Row]) -> str:
    table = format_table(
        HEADERS,
        [
            [
                r.name,
                r.endpoint,
                r.health,
                _num(r.running),
                _num(r.waiting),
                _num(r.kv_cache_usage_pct, "{:.1f}%"),
                _num(r.generation_tokens_per_s, "{:.1f}"),
                _num(r.prompt_tokens_per_s, "{:.1f}"),
                _pct(r.prefix_cache_hit_rate),
                _pct(r.prefix_cache_hit_rate_interval),
                _num(r.preemptions),
                uptime_text(r.uptime_s),
                _blocks(r),
                "-" if r.planned_num_gpu_blocks is None else f"{r.planned_num_gpu_blocks:,}",
            ]
            for r in rows
        ],
    )
    lines = [table]
    intervals = sorted({r.interval_s for r in rows if r.interval_s is not None})
    if intervals:
        span = f"{intervals[0]:.1f}" + (
            f"-{intervals[-1]:.1f}" if f"{intervals[-1]:.1f}" != f"{intervals[0]:.1f}" else ""
        )
        lines.append(f"rates and hit (interval): over {span} s between two scrapes of /metrics; hit: prefix cache")
    else:
        lines.append("rates: '-' (no two scrapes of /metrics to compare)")
    for r in rows:
        lines += [f"{r.name}: {note}" for note in r.notes or []]
        planned, seen = r.planned_num_gpu_blocks, r.num_gpu_blocks
        if planned and seen and any(b != planned for b in seen):
            lines.append(f"{r.name}: vLLM has {_blocks(r)} KV blocks, the plan expected {planned:,}")
    healthy = sum(r.healthy for r in rows)
    lines.append(f"{healthy}/{len(rows)} healthy")
    return "\n".join(lines)


def to_json(rows: Sequence[Row]) -> dict[str, Any]:
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "healthy": all(r.healthy for r in rows),
        "instances": [asdict(r) for r in rows],
    }


def exit_code(rows: Sequence[Row]) -> int:
    return 0 if all(r.healthy for r in rows) else 1


# ---------------------------------------------------------------- one shot and --watch


Scraper = Callable[[Sequence[Target]], list[Scrape]]


def refreshes(
    targets: Sequence[Target],
    scraper: Scraper,
    first_gap: float = 1.0,
    every: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[list[Row]]:
    """Rows after two scrapes ``first_gap`` seconds apart (rates need two); with ``every``, then
    a new set every ``every`` seconds, rates since the scrape before. ``first_gap`` 0: one scrape."""
    before = scraper(targets) if first_gap > 0 else None
    if before is not None:
        sleep(first_gap)
    while True:
        now = scraper(targets)
        previous: Sequence[Scrape | None] = before if before is not None else [None] * len(now)
        yield [summarize(t, n, b) for t, n, b in zip(targets, now, previous, strict=True)]
        if every is None:
            return
        before = now
        sleep(every)


CLEAR = "\x1b[H\x1b[2J"


def run(
    targets: Sequence[Target],
    *,
    watch: float | None = None,
    as_json: bool = False,
    out: Any = None,
    first_gap: float = 1.0,
    api_key: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
    explain: Callable[[list[Row]], None] | None = None,
) -> int:
    """Print the table (or JSON) once, or every ``watch`` seconds until Ctrl-C; the exit code.
    ``explain``: adds to the unhealthy rows' notes what their nodes say (once, without --watch)."""
    stream = out or sys.stdout
    key = api_key if api_key is not None else os.environ.get("VLLM_API_KEY") or None
    tty = bool(getattr(stream, "isatty", lambda: False)())
    code = 0
    try:
        for rows in refreshes(targets, lambda ts: scrape_all(ts, key), first_gap, watch, sleep):
            code = exit_code(rows)
            if explain is not None and watch is None and code != 0:
                explain(rows)
            if as_json:
                doc = to_json(rows)
                stream.write((json.dumps(doc) if watch is not None else json.dumps(doc, indent=2)) + "\n")
            elif watch is None:
                stream.write(render(rows) + "\n")
            elif tty:
                stream.write(CLEAR + time.strftime("%Y-%m-%d %H:%M:%S") + f"  (every {watch:g} s, Ctrl-C ends)\n")
                stream.write(render(rows) + "\n")
            else:
                stream.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} ---\n" + render(rows) + "\n")
            stream.flush()
    except KeyboardInterrupt:
        return 0
    return code


def run_args(args: argparse.Namespace) -> int:
    """``vllm-fleet status`` (its flags parsed by vllm_fleet/cli.py): the plan's instances, once
    or every ``--watch`` seconds."""
    if not args.inventory and not args.plan:
        raise PlanError("--inventory", "is missing", "pass -i INVENTORY (or --plan FILE)")
    if args.plan:
        targets = targets_from_plan(load_plan(args.plan, "--plan"), "--plan")
    else:
        targets = targets_from_plan(load_plan(plan_from_inventory(args.inventory), "--inventory"), "--inventory")
    if not args.inventory:
        return run(targets, watch=args.watch, as_json=args.json)
    inventory: str = args.inventory
    return run(targets, watch=args.watch, as_json=args.json, explain=lambda rows: explain(rows, targets, inventory))


def explain(rows: Sequence[Row], targets: Sequence[Target], inventory: str) -> None:
    """Add to each unhealthy row what its nodes say (unit or container state, restarts,
    backoff, the last lines of its log): one ad hoc Ansible call for all of them."""
    down = [(r, t) for r, t in zip(rows, targets, strict=True) if not r.healthy and t.nodes]
    wanted: dict[str, list[str]] = {}
    for _, target in down:
        for node in target.nodes:
            wanted.setdefault(node, []).append(unit_name({"name": target.name}))
    answers = why.ask(inventory, wanted)
    for row, target in down:
        row.notes = (row.notes or []) + why.notes(target.nodes, unit_name({"name": target.name}), answers)
