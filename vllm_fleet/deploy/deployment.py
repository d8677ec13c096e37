"""What the whole deployment shares, computed once on the controller.

``deployment_of(plan, settings, context)``: the gateway with its upstreams and routes, what
verify probes and from where, Prometheus's host and scrape targets, and how replicas restart.
Each node's record (vllm_fleet/deploy/records.py) holds only its own part and takes these parts from
here, so a record does not grow with the cluster. Also the roles' own defaults that records
and the deployment read (one place: the role's defaults/main.yml).

Pure Python, no Ansible import.
"""

from __future__ import annotations

import copy
import functools
import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from vllm_fleet.deploy import serve
from vllm_fleet.errors import PlanError

# The roles beside the package (a checkout, the collection), else the copy of what the package
# reads of them that the wheel carries (pyproject.toml: vllm_fleet_roles).
_BESIDE = Path(__file__).resolve().parents[2]
ROLES = _BESIDE / "roles" if (_BESIDE / "roles" / "vllm_server").is_dir() else _BESIDE / "vllm_fleet_roles"
# The roles' own defaults for what the record needs of them (one place: the role).
RAY_KEYS = ("gcs_port", "config_dir", "auth", "version", "name", "venv", "volumes", "metrics_export_port")
LOOPBACK = "127.0.0.1"
ANY_ADDRESS = "0.0.0.0"  # only with an API key, or as the operator's explicit choice


@functools.lru_cache(maxsize=16)
def _defaults_file(role: str) -> dict[str, Any]:
    """A role's defaults/main.yml, read once per process (it was parsed four times per record:
    30 of 33 s for 1,000 records)."""
    data: dict[str, Any] = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}
    return data


def role_defaults(role: str, keys: tuple[str, ...]) -> dict[str, Any]:
    data = _defaults_file(role)
    return {k: copy.deepcopy(data[f"{role}_{k}"]) for k in keys}


def overlay(role: str, keys: tuple[str, ...], given: dict[str, Any] | None) -> dict[str, Any]:
    out = role_defaults(role, keys)
    for key in keys:
        value = (given or {}).get(f"{role}_{key}")
        if value not in (None, ""):
            out[key] = value
    return out


def served_name(plan: dict[str, Any], here: list[dict[str, Any]] | None = None) -> str:
    """The API name of ``here``'s first instance (else the plan's first)."""
    return instance_served_name((here or plan["instances"])[0])


def instance_served_name(inst: dict[str, Any]) -> str:
    return str(inst.get("served_model_name") or inst["name"].rsplit("-", 1)[0])


# What `make bench-prefix` measured (2026-12-06, two vLLM CPU replicas, mean of 3 runs): the
# prefix-cache hit rate of each balancer on each workload, least_conn first. The plan's reason
# for an automatic choice quotes them (docs/benchmarks.md, "bench-prefix").
MEASURED_HIT_RATES = {
    "shared_prefixes": "cache_aware 45.5 % against nginx least_conn's 23.2 % (24 documents, four times a replica's "
    "KV pool), 88.0 % against 64.0 % (8 documents)",
    "sessions": "consistent_hash 59.4 % against nginx least_conn's 47.8 % (16 chat sessions with x-session-id)",
}
WORKLOAD_POLICY = {"shared_prefixes": "cache_aware", "sessions": "consistent_hash"}


def balancer_of(plan: dict[str, Any], settings: dict[str, Any]) -> tuple[str, str, str]:
    """(balancer, vllm-router policy, reason): gateway_balancer auto takes vllm-router where a
    model has several replicas and gateway_workload says its requests share prefixes (cache_aware)
    or sessions (consistent_hash), as bench-prefix measured; nginx's least_conn otherwise (no
    extra service, 2-3 ms less per request, and the same hit rate on requests that share nothing).
    An explicit balancer or policy is kept."""
    wish = str(settings.get("gateway_balancer") or "auto")
    workload = str(settings.get("gateway_workload") or "independent")
    asked_policy = str(settings.get("gateway_router_policy") or "auto")
    policy = asked_policy if asked_policy != "auto" else WORKLOAD_POLICY.get(workload, "cache_aware")
    if wish != "auto":
        return wish, policy, f"gateway_balancer {wish}"
    routes = plan["gateway"].get("routes") or []
    replicas = max((len(r["upstreams"]) for r in routes), default=len(plan["gateway"]["upstreams"]))
    if replicas < 2:
        return "nginx", policy, "one replica per model: no routing choice to make"
    if workload not in WORKLOAD_POLICY:
        return (
            "nginx",
            policy,
            (
                "gateway_workload independent: requests share no prefixes to keep together, and least_conn needs "
                "no router (set gateway_workload to shared_prefixes or sessions where they do)"
            ),
        )
    return "vllm-router", policy, f"gateway_workload {workload}, {replicas} replicas: {MEASURED_HIT_RATES[workload]}"


def gateway_of(plan: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Whether nginx runs, where, on which port, in front of which upstreams, and who spreads
    the requests over them (nginx itself, or a vllm-router per model behind it)."""
    wish = str(settings.get("gateway") or "auto")
    enabled = bool(plan["gateway"]["enabled"]) if wish == "auto" else wish == "true"
    nodes = [n["name"] for n in plan.get("nodes") or []] or [plan["instances"][0]["head_node"]]
    balancer, policy, reason = balancer_of(plan, settings)
    keyed = bool(settings.get("api_key"))
    # Loopback unless a key guards it: an open model endpoint on every interface is opt-in.
    listen = str(settings.get("gateway_listen") or (ANY_ADDRESS if keyed else LOOPBACK))
    return {
        "enabled": enabled,
        "host": settings.get("gateway_host") or nodes[0],
        "port": int(settings.get("gateway_port") or 8080),
        "listen": listen,
        "api_key": keyed,
        "upstreams": list(plan["gateway"]["upstreams"]),
        # nginx's least_conn, or one vllm-router per model behind nginx with its policy.
        "balancer": balancer,
        "router_policy": policy,
        "balancer_reason": reason,
        "strategy": plan["gateway"].get("strategy", "least_conn") if balancer == "nginx" else f"vllm-router {policy}",
        # Several models: each one's served name and upstreams; the gateway routes a request
        # by the model its body names (empty: one model, every upstream serves it).
        "routes": [dict(r) for r in plan["gateway"].get("routes") or []],
    }


DEPLOYMENT_FORMAT = 1


def deployment_of(
    plan: dict[str, Any], settings: dict[str, Any], context: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What the whole deployment shares, computed once on the controller (node records hold
    only each node's part): the gateway with its upstreams and routes, what verify probes and
    from where, Prometheus's host and scrape targets, and how replicas restart. ``settings``:
    the deployment-wide values (any node's); ``context``: ``addresses`` of hosts outside the
    plan (the gateway and monitoring hosts) and ``role_vars`` (Ray's metrics port)."""
    ctx = dict(context or {})
    gateway = gateway_of(plan, settings)
    ray_vars = overlay("ray_cluster", RAY_KEYS, ctx.get("role_vars"))
    router_vars = overlay("llm_gateway", ("router_metrics_port",), ctx.get("role_vars"))
    return {
        "format": DEPLOYMENT_FORMAT,
        "gateway": gateway,
        "verify": verify_plan(plan, settings, gateway),
        "monitoring": monitoring_of(
            plan, settings, gateway, dict(ctx.get("addresses") or {}), ray_vars, int(router_vars["router_metrics_port"])
        ),
        "rolling": rolling_of(plan, settings, gateway),
    }


def gateway_local_address(gateway: dict[str, Any]) -> str:
    """Where the gateway's own host reaches it: loopback, unless it listens on one other address."""
    listen = ipaddress.ip_address(gateway["listen"])
    return LOOPBACK if listen.is_loopback or listen.is_unspecified else str(listen)


def gateway_checks(plan: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """What the gateway's address means, checked at plan time: the warnings the plan prints
    (an address beyond loopback with no API key; loopback only, reachable from this host
    alone), and a refusal where a part of the plan would have to reach a gateway that only
    listens on loopback (Prometheus's nginx exporter on another host)."""
    gw = gateway_of(plan, settings)
    if not gw["enabled"]:
        return []
    loopback = ipaddress.ip_address(gw["listen"]).is_loopback
    if loopback:
        monitoring = monitoring_of(plan, settings, gw, {}, {"metrics_export_port": 0}, 0)
        if monitoring["enabled"] and monitoring["host"] != gw["host"]:
            raise PlanError(
                "vllm_fleet_monitoring_host",
                f"is {monitoring['host']}, whose nginx exporter reads the gateway's counters over the network, "
                f"but the gateway on {gw['host']} listens on {gw['listen']} only (no API key)",
                "set vllm_fleet_api_key (Vault) or VLLM_API_KEY, or vllm_fleet_gateway_listen to an address of "
                f"{gw['host']}, or leave vllm_fleet_monitoring_host unset (the gateway host)",
            )
        return [
            f"the gateway listens on {gw['listen']}:{gw['port']} only (no API key): reachable from {gw['host']} "
            "alone; set vllm_fleet_api_key (Vault) or VLLM_API_KEY to open it to clients with the key, or "
            "vllm_fleet_gateway_listen to open it without one"
        ]
    if not gw["api_key"]:
        return [
            f"the gateway listens on {gw['listen']}:{gw['port']} WITHOUT an API key "
            "(vllm_fleet_gateway_listen): anyone who reaches that address can use the model; set "
            "vllm_fleet_api_key (Vault) or VLLM_API_KEY"
        ]
    return []


def verify_plan(
    plan: dict[str, Any], settings: dict[str, Any], gateway: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Where verify sends its requests from (the gateway host, else the first node) and what it probes."""
    gw = gateway or gateway_of(plan, settings)
    targets = []
    if gw["enabled"]:
        # One probe through the gateway per model (several models: each by its name).
        routes = gw["routes"] or [{"model": served_name(plan), "upstreams": gw["upstreams"]}]
        for route in routes:
            members = [i["name"] for i in plan["instances"] if str(i["endpoint"]) in route["upstreams"]]
            targets.append(
                {
                    "endpoint": f"{gateway_local_address(gw)}:{gw['port']}",
                    "via": "gateway",
                    "name": "gateway" if len(routes) == 1 else f"gateway {route['model']}",
                    "layout": f"{len(members)} instance(s), {gw['strategy']}",
                    "model": route["model"],
                    "instances": members,
                    "load": serve.verify_load([i for i in plan["instances"] if i["name"] in members]),
                }
            )
    targets += [serve.verify_target(i, instance_served_name(i), with_load=not gw["enabled"]) for i in plan["instances"]]
    nodes = [n["name"] for n in plan.get("nodes") or []] or [plan["instances"][0]["head_node"]]
    return {"from": gw["host"] if gw["enabled"] else nodes[0], "gateway": gw["enabled"], "targets": targets}


def address_of(plan: dict[str, Any], node: str, addresses: dict[str, str]) -> str:
    for n in plan.get("nodes") or []:
        if n["name"] == node:
            return str(n.get("address") or addresses.get(node) or node)
    return str(addresses.get(node) or node)


def addresses_of(plan: dict[str, Any], addresses: dict[str, str]) -> dict[str, str]:
    """Every plan node's address (the plan's, else ``addresses``, else its name), once: a lookup
    per node over the plan's nodes was quadratic at fleet size."""
    return {
        str(n["name"]): str(n.get("address") or addresses.get(n["name"]) or n["name"]) for n in plan.get("nodes") or []
    }


DCGM_PORT = 9400
NGINX_EXPORTER_PORT = 9113


def monitoring_of(
    plan: dict[str, Any],
    settings: dict[str, Any],
    gateway: dict[str, Any],
    addresses: dict[str, str],
    ray_vars: dict[str, Any],
    router_metrics_port: int,
) -> dict[str, Any]:
    """Whether Prometheus runs, where, and what it scrapes: every instance's /metrics (its
    API port), Ray's metrics export port on every Ray node, the gateway (nginx exporter on
    the monitoring host, reading the gateway's stub_status), the node exporters and, on GPU
    nodes with the container runtime, DCGM. ``vllm_fleet_monitoring: auto`` turns it on
    for a cluster of several instances behind the gateway."""
    known = addresses_of(plan, addresses)
    wish = str(settings.get("monitoring") or "auto")
    several = bool(plan["gateway"]["enabled"])  # the planner's own choice: several instances
    enabled = several and bool(gateway["enabled"]) if wish == "auto" else wish == "true"
    names = [n["name"] for n in plan.get("nodes") or []] or [plan["instances"][0]["head_node"]]
    host = str(settings.get("monitoring_host") or (gateway["host"] if gateway["enabled"] else names[0]))
    exporter_port = int(settings.get("node_exporter_port") or 9100)
    serving = sorted({n for i in plan["instances"] for n in i["nodes"]})
    targets: dict[str, list[dict[str, Any]]] = {
        "vllm": [
            {"target": str(i["endpoint"]), "labels": {"vllm_instance": i["name"], "model": instance_served_name(i)}}
            for i in plan["instances"]
        ],
        "node": [
            {"target": f"{known.get(n) or address_of(plan, n, addresses)}:{exporter_port}", "labels": {"node": n}}
            for n in serving
        ]
        + ([] if host in serving else [{"target": f"127.0.0.1:{exporter_port}", "labels": {"node": host}}]),
        "ray": [],
        "gateway": [],
        "router": [],
        "dcgm": [],
    }
    ray_nodes = sorted({n for i in plan["instances"] if i["executor"] == "ray" for n in i["nodes"]})
    if settings.get("ray") == "always":
        ray_nodes = serving
    targets["ray"] = [
        {
            "target": f"{known.get(n) or address_of(plan, n, addresses)}:{int(ray_vars['metrics_export_port'])}",
            "labels": {"node": n},
        }
        for n in ray_nodes
    ]
    if gateway["enabled"]:
        targets["gateway"] = [{"target": f"127.0.0.1:{NGINX_EXPORTER_PORT}", "labels": {"gateway": gateway["host"]}}]
    if gateway["enabled"] and gateway["balancer"] == "vllm-router" and gateway["host"] == host:
        # Model N's vllm-router exports its metrics on the gateway host's loopback, port
        # llm_gateway_router_metrics_port + N (one router with one model): the routing decisions
        # (vllm_router_prefix_routing_decisions_total), loads and tree sizes.
        routes = gateway["routes"] or [{"model": served_name(plan)}]
        targets["router"] = [
            {
                "target": f"127.0.0.1:{router_metrics_port + n}",
                "labels": {"gateway": gateway["host"], "model": r["model"]},
            }
            for n, r in enumerate(routes)
        ]
    runtime = str(settings.get("runtime") or "container")
    gpu_nodes = sorted({n for i in plan["instances"] if i.get("device") != "cpu" for n in i["nodes"]})
    if runtime == "container":
        targets["dcgm"] = [
            {"target": f"{known.get(n) or address_of(plan, n, addresses)}:{DCGM_PORT}", "labels": {"node": n}}
            for n in gpu_nodes
        ]
    # The gateway's own host reaches it on loopback, unless it listens on one address only.
    here = gateway_local_address(gateway)
    gw_address = here if gateway["host"] == host else address_of(plan, gateway["host"], addresses)
    # Who may read nginx's counters besides loopback: the exporter's source address.
    allow = (
        []
        if not enabled or gw_address == LOOPBACK
        else [here if gateway["host"] == host else address_of(plan, host, addresses)]
    )
    return {
        "enabled": enabled,
        "host": host,
        "port": int(settings.get("monitoring_port") or 9090),
        "scrape_interval": int(settings.get("monitoring_scrape_interval") or 15),
        "node_exporter_port": exporter_port,
        "nginx_exporter_port": NGINX_EXPORTER_PORT,
        # The gateway's stub_status, which nginx answers only to loopback and this address.
        "gateway_status_url": f"http://{gw_address}:{gateway['port']}/vllm-fleet-nginx-status",
        "gateway_status_allow": allow,
        "source": address_of(plan, host, addresses),
        "targets": targets if enabled else {},
    }


def rolling_of(plan: dict[str, Any], settings: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    """How the serve phase restarts running replicas: a batch of nodes at a time, each
    drained from the gateway first, when there is a gateway and every model keeps a replica
    that serves meanwhile; a multi-node replica's nodes restart in one batch (its group
    restarts as one unit). Otherwise every node at once."""
    instances = plan["instances"]
    single = all(len(i["nodes"]) == 1 for i in instances)
    batch = int(settings.get("rolling_batch") or 1)
    replicas = len(gateway["upstreams"])
    # Several models: a drain must leave every model a replica that serves.
    lone = [r["model"] for r in gateway["routes"] if len(r["upstreams"]) < 2]
    if not gateway["enabled"]:
        reason = "no gateway: nothing to drain, nodes restart at once"
    elif lone:
        reason = f"{', '.join(lone)} has one replica: nodes restart in place (no other serves it meanwhile)"
        replicas = 1
    elif replicas < 2:
        reason = "one replica: it restarts in place (there is no other to serve meanwhile)"
    elif not single:
        reason = (
            f"{replicas} replicas: {batch} node(s) at a time, drained first; a replica spanning several "
            "nodes restarts with all of them in one batch (its group restarts as one unit)"
        )
    else:
        reason = f"{replicas} replicas: {batch} node(s) at a time, drained first"
    return {
        "enabled": gateway["enabled"] and replicas >= 2,
        "batch": batch,
        "drain_timeout": int(settings.get("drain_timeout") or 120),
        "reason": reason,
    }


NO_EARLIER_RUN = "no record of an earlier run"


def restart_units(instances: Mapping[str, list[str]]) -> list[list[str]]:
    """The nodes that restart together, in the nodes' order: nodes sharing an instance (the ranks
    of a multi-node group) are one unit, every other node a unit of its own."""
    parent = {node: node for node in instances}

    def root(node: str) -> str:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    first_node: dict[str, str] = {}
    for node, names in instances.items():
        for name in names:
            if name in first_node:
                parent[root(node)] = root(first_node[name])
            else:
                first_node[name] = node
    units: dict[str, list[str]] = {}
    for node in instances:
        units.setdefault(root(node), []).append(node)
    return list(units.values())


def rolling_now(
    rolling: dict[str, Any],
    applied: dict[str, dict[str, Any] | None],
    instances: Mapping[str, list[str]] | None = None,
) -> dict[str, Any]:
    """This run's serve batches: ``applied`` is each node's comparison with what the last run
    applied there (vllm_server's applied_check: ``current`` and ``reason``; None where it did
    not run), ``instances`` the instances each node runs a rank of. Nodes that served before
    and are not as the last run left them restart with the rest of their unit (every node of
    a multi-node replica), ``rolling.batch`` nodes at a time (a larger unit alone), drained
    first, when rolling is on; the nodes that change nothing come last. A first
    deployment and a re-run that changes nothing keep every node in one batch (``serial``
    100%). ``order``: the serve play's hosts in batch order."""
    nodes = list(applied)
    changing = [
        str(node)
        for node, state in applied.items()
        if state is not None and not state.get("current") and state.get("reason") != NO_EARLIER_RUN
    ]
    rolling_on = bool(rolling["enabled"]) and bool(changing)
    if not rolling_on:
        message = f"No running replica restarts one batch at a time ({rolling['reason']})"
        return {"serial": "100%", "nodes": [], "order": nodes, "message": message}
    units = restart_units({n: list((instances or {}).get(n) or []) for n in nodes})
    restarting = [u for u in units if set(u) & set(changing)]
    batches: list[list[str]] = []
    for unit in restarting:
        if batches and len(batches[-1]) + len(unit) <= int(rolling["batch"]):
            batches[-1] += unit
        else:
            batches.append(list(unit))
    moved = [n for b in batches for n in b]
    rest = [n for n in nodes if n not in moved]
    # The nodes that change nothing follow, rolling.batch at a time (Ansible repeats the last size).
    sizes = [len(b) for b in batches] + [int(rolling["batch"])]
    serial: int | list[int] = sizes[0] if len(set(sizes)) == 1 else sizes
    shown = ", ".join("+".join(u) for u in restarting)
    return {"serial": serial, "nodes": moved, "order": moved + rest,
            "message": f"Rolling restart of {shown}: {rolling['reason']}"}  # fmt: skip
