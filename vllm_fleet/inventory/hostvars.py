"""What the Ansible filters (plugins/filter/) read from the inventory, in plain Python: a node's
values (the inventory's, else what gpu_facts detected), each node's record context, every node's
declared settings, the preview's records read on a node, the wishes a filter takes, and a
role's digest. ``hostvars`` is any mapping of host name to its variables (Ansible's lazy
hostvars, or plain dicts in tests). Errors are :class:`InventoryError` (or the planner's
PlanError), one line naming the field and the fix; the filters hand them to Ansible."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_fleet import schema
from vllm_fleet.deploy import records
from vllm_fleet.errors import PlanError, for_inventory
from vllm_fleet.inventory import interface
from vllm_fleet.planning.strategy import Wishes

# The wishes: every declared option (vllm_fleet/schema.py) and what the deployment hands the planner.
WISH_KEYS = frozenset(Wishes.__dataclass_fields__) - {"draft_spec"}


class InventoryError(ValueError):
    """A value the inventory (or Ansible's templating of it) cannot give: its one-line reason."""


def plain(value: Any, _seen: dict[int, Any] | None = None) -> Any:
    """``value`` as plain dicts, lists and scalars (one pass over Ansible's lazy containers). A
    container met twice is converted once and shared, as it was: every node's context holds the
    one fabric dict of every node's ports, and copying it per node made the records step
    quadratic (1,000 hosts: 5.5 s and 309 MiB for ``--tags plan`` instead of 4.2 s and 104 MiB)."""
    seen = {} if _seen is None else _seen
    if isinstance(value, dict) or (hasattr(value, "items") and hasattr(value, "keys")):
        if id(value) not in seen:
            out: dict[str, Any] = {}
            seen[id(value)] = out
            out.update((str(k), plain(v, seen)) for k, v in value.items())
        return seen[id(value)]
    if isinstance(value, list | tuple):
        if id(value) not in seen:
            items: list[Any] = []
            seen[id(value)] = items
            items.extend(plain(v, seen) for v in value)
        return seen[id(value)]
    if isinstance(value, str):
        return str(value)
    return value


def clean_wishes(wishes: Mapping[str, Any] | None) -> dict[str, Any]:
    """A filter's wishes, each declared option checked and typed as its inventory variable is."""
    data = {k: v for k, v in (wishes or {}).items() if v is not None and v not in ("", "None")}
    unknown = set(data) - WISH_KEYS
    if unknown:
        raise InventoryError(f"unknown wish(es) {sorted(unknown)}; fix: use only {sorted(WISH_KEYS)}")
    for key, value in data.items():
        if key in schema.by_name():
            data[key] = interface.coerce(key, value)
    for key in ("strategies", "extra_args"):
        if key in data:
            data[key] = tuple(data[key])
    if isinstance(data.get("ray_available"), str):
        data["ray_available"] = data["ray_available"].strip().lower() in ("1", "true", "yes", "on")
    if "port" in data:
        try:
            data["port"] = int(data["port"])
        except (TypeError, ValueError) as exc:
            raise InventoryError(f"port: '{data['port']}' is not an integer") from exc
    return data


_NO_GPU_DETECTED = (
    "Host {name} reports no NVIDIA GPU (gpu_facts found {found}): install the driver, or state vllm_fleet_gpu and "
    "vllm_fleet_gpu_count by hand (e.g. cpu / 1 for the CPU build)."
)
_NO_GPU_STATED = (
    "Host {name}: set vllm_fleet_gpu (e.g. H100-SXM, A800, L20, cpu) and vllm_fleet_gpu_count in the inventory, "
    "or run without --tags plan so that gpu_facts detects them."
)


def given(host: Any, name: str) -> Any:
    """The inventory's value of ``name`` on ``host`` (None when unset)."""
    return host.get(name) if name in host else None


# Every host variable that node_values, plan_nodes, contexts, fabric and addresses read (the
# settings come from settings_of): a plan phase that ran no host play reads these once per host
# (:func:`snapshot`), and tests/unit/test_plan_phase.py checks that nothing else is read.
_DETECTED_KEYS = ("gpu", "gpu_count", "gpu_memory_gib", "gpu_free_gib", "nvlink", "unified_memory", "nic_gbps",
                  "interface", "address")  # fmt: skip
HOST_KEYS = ("gpu_facts_found", "ansible_host", "vllm_fleet_cpu_cores", *(f"vllm_fleet_{k}" for k in _DETECTED_KEYS))


def snapshot(hostvars: Any, names: list[str]) -> dict[str, dict[str, Any]]:
    """``{name: {key: value}}`` of :data:`HOST_KEYS` that each host has, as plain values: what the
    planner's nodes and the records' contexts read of those hosts, read once."""
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        if name in out or name not in hostvars:
            continue
        host = hostvars[name]
        out[str(name)] = {k: plain(host[k]) for k in HOST_KEYS if k in host}
    return out


def node_values(host: Any) -> dict[str, Any]:
    """A node's GPUs, NIC, interface, address and cores as the planner takes them: the
    inventory's vllm_fleet_* value where it states one, else what gpu_facts detected there
    (memory, NVLink and free memory only from GPUs actually seen: a host planned before its
    driver is installed keeps the catalog's values for the GPU the inventory names)."""
    found = host.get("gpu_facts_found") if "gpu_facts_found" in host else None
    seen: dict[str, Any] = dict(found) if isinstance(found, dict) else {}
    gpus = bool(seen.get("gpu_count"))
    route = dict(seen.get("route_to_head") or {})
    detected = {
        "gpu": seen.get("gpu"),
        "gpu_count": seen.get("gpu_count"),
        "gpu_memory_gib": seen.get("gpu_memory_gib") if gpus else None,
        "gpu_free_gib": seen.get("gpu_free_gib") if gpus else None,
        "nvlink": seen.get("nvlink") if gpus else None,
        "unified_memory": seen.get("unified_memory") if gpus else None,
        "nic_gbps": seen.get("nic_gbps"),
        "interface": route.get("interface"),
        "address": route.get("address"),
    }
    out = {}
    for key, value in detected.items():
        stated = given(host, f"vllm_fleet_{key}")
        out[key] = stated if stated is not None else value
    out["cores"] = seen.get("cpu_cores")
    out["detected"] = bool(seen)
    return out


def plan_nodes(hostvars: Any, nodes: list[str]) -> list[dict[str, Any]]:
    """The planner's nodes from the inventory and what gpu_facts detected (the inventory's
    values win), in one pass: a loop of set_fact cost 30 ms a node (4 s at 128 hosts). A node
    without GPUs is named, with the fix. Unset values stay None: the planner's own defaults
    apply (cluster.py)."""
    out = []
    for name in nodes:
        host = hostvars[name]
        values = node_values(host)
        gpu, count = values["gpu"], values["gpu_count"]
        try:
            usable = gpu is not None and count is not None and int(count) > 0
        except (TypeError, ValueError):
            usable = True  # the planner names a count that is not a number
        if not usable:
            text = _NO_GPU_DETECTED if values["detected"] else _NO_GPU_STATED
            raise InventoryError(text.format(name=name, found=count if values["detected"] else None))
        out.append(
            {
                "name": str(name),
                "gpu": gpu,
                "gpu_count": int(count) if str(count).strip().isdigit() else count,
                "gpu_memory_gib": values["gpu_memory_gib"],
                "gpu_free_gib": values["gpu_free_gib"],
                "nvlink": values["nvlink"],
                "unified_memory": values["unified_memory"],
                "nic_gbps": values["nic_gbps"],
                "address": values["address"] or given(host, "ansible_host") or str(name),
                "interface": values["interface"],
                "cpu_cores": given(host, "vllm_fleet_cpu_cores") or values["cores"],
            }
        )
    return out


def fabric(settings: dict[str, Any], hostvars: Any, nodes: list[str]) -> dict[str, Any]:
    """What every node's record reads of the nodes' RDMA (vllm_fleet/deploy/records.py fabric_of):
    ``{name: {"infiniband": gpu_facts' ports or None where not gathered, "rdma": ...,
    "rdma_devices": ..., "roce_gid_index": ...}}``; ``settings``: the first play's
    vllm_fleet_settings."""
    out: dict[str, Any] = {}
    for name in nodes:
        found = hostvars[name].get("gpu_facts_found") if name in hostvars else None
        ports = found.get("infiniband") if isinstance(found, dict) else None
        mine = dict((settings.get("nodes") or {}).get(name) or {})
        out[str(name)] = {
            "infiniband": [dict(p) for p in ports] if isinstance(ports, list) else None,
            **{k: mine.get(k) for k in records.FABRIC_KEYS},
        }
    return out


def contexts(settings: dict[str, Any], hostvars: Any, nodes: list[str]) -> dict[str, dict[str, Any]]:
    """What each node's record reads beside the plan and its settings (vllm_fleet/deploy/records.py
    node_record): the cores gpu_facts counted, whether the model is a folder on this
    controller, the role variables the inventory sets, the addresses of the gateway and
    monitoring hosts, the node's own address, interface and GPU count, and (one dict shared
    by every node) the fabric: each node's InfiniBand/RoCE ports and RDMA settings."""
    per_node = settings.get("nodes") or {}
    shared = fabric(settings, hostvars, nodes)
    folders: dict[str, bool] = {}
    out: dict[str, dict[str, Any]] = {}
    for name in nodes:
        mine = per_node.get(name) or {}
        model = str(mine.get("model") or "")
        if model not in folders:
            folders[model] = bool(model) and Path(model).is_dir()
        host = hostvars[name]
        values = node_values(host)
        out[str(name)] = {
            "detected_cores": values["cores"],
            "model_is_dir": folders[model],
            "role_vars": (settings.get("role_vars") or {}).get(name) or {},
            "addresses": addresses(mine, hostvars),
            "host": {
                "address": values["address"] or given(host, "ansible_host") or str(name),
                "interface": values["interface"],
                "gpu_count": values["gpu_count"],
            },
            "fabric": shared,
        }
    return out


def addresses(mine: dict[str, Any], hostvars: Any) -> dict[str, str]:
    """The addresses of the gateway and monitoring hosts a node's settings name."""
    out = {}
    for other in (mine.get("gateway_host"), mine.get("monitoring_host")):
        if other and other in hostvars:
            out[str(other)] = str(given(hostvars[other], "ansible_host") or other)
    return out


def applied_by_host(hostvars: Any, hosts: list[str]) -> dict[str, Any]:
    """Each host's ``__vllm_server_applied`` (vllm_server's applied_check), None where it did not run it."""
    applied: dict[str, Any] = {}
    for name in hosts:
        host = hostvars[name]
        result = plain(host.get("__vllm_server_applied")) if "__vllm_server_applied" in host else None
        applied[str(name)] = result if isinstance(result, dict) and "current" in result else None
    return applied


def instances_by_host(hostvars: Any, hosts: list[str]) -> dict[str, list[str]]:
    """The instances each host runs a rank of (its record's launches), [] where it has no record."""
    out: dict[str, list[str]] = {}
    for name in hosts:
        record = plain(hostvars[name].get("vllm_fleet_node")) if "vllm_fleet_node" in hostvars[name] else None
        launches = record.get("launches") if isinstance(record, dict) else None
        out[str(name)] = [str(launch["instance"]) for launch in launches or [] if isinstance(launch, dict)]
    return out


def applied_files(results: list[Any]) -> dict[str, Any]:
    """What the roles recorded on a node, from the preview play's slurp results (one per file;
    a missing file has no content): its launches (``*.launch.json``, in the order read), Ray's
    ``cluster.json`` and the gateway's ``gateway.json`` (None where missing)."""
    by_file: dict[str, Any] = {}
    for result in results:
        if isinstance(result, dict) and result.get("content"):
            by_file[os.path.basename(str(result.get("item") or ""))] = json.loads(base64.b64decode(result["content"]))
    return {
        "launches": [v for k, v in by_file.items() if k.endswith(".launch.json")],
        "ray": by_file.get("cluster.json"),
        "gateway": by_file.get("gateway.json"),
    }


def own_vars(host_vars: Any) -> dict[str, Any]:
    """A host's ``vllm_fleet_*`` variables, templated (Vault values are decrypted here);
    one that cannot be read (an undecryptable Vault value, a broken template) is named."""
    out: dict[str, Any] = {}
    for k in list(host_vars.keys()):
        if not str(k).startswith(interface.PREFIX) or k in interface.DERIVED:
            continue
        try:
            value = host_vars[k]
            str(value)  # an undecryptable Vault value trips here, not on access
            out[k] = value
        except Exception as err:  # Ansible raises many kinds; the name is what matters
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise InventoryError(
                f"{k} cannot be read ({first}); fix: check its Vault password (--ask-vault-pass, "
                "--vault-password-file) or its template"
            ) from err
    return out


def settings_of(hostvars: Any, nodes: list[str], api_key: bool, playbook_dir: str) -> dict[str, Any]:
    """Every node's declared ``vllm_fleet_*`` values, typed and with defaults:
    ``{"nodes": {name: settings}, "warnings": [...], "artifacts": folder, ...}``; one line naming
    the field on a bad value. ``api_key``: whether the deployment has an API key from anywhere
    (Vault or $VLLM_API_KEY; only the fact that it has one, never the value): the gateway's
    address follows it. ``artifacts``: vllm_fleet_artifacts_dir, else the checkout's artifacts/
    (next to ``playbook_dir``)."""
    per_node: dict[str, dict[str, Any]] = {}
    role_vars: dict[str, dict[str, Any]] = {}
    hosts: dict[str, str | None] = {}
    ssh_ports: dict[str, Any] = {}
    warnings: list[str] = []
    for name in nodes:
        try:
            raw = own_vars(hostvars[name])
            per_node[name] = interface.resolve(raw)
            per_node[name]["api_key"] = bool(per_node[name]["api_key"] or api_key)
            # The role variables the planner reads (ports, paths, modes), never a secret one: this
            # fact is printed at -v, and the roles read their secrets from the inventory themselves.
            role_vars[name] = {
                k: hostvars[name][k]
                for k in list(hostvars[name].keys())
                if str(k).startswith(interface.ROLE_PREFIXES) and not records.is_secret_role_var(str(k))
            }
            # The machine behind the name: two names for one machine are refused.
            host = hostvars[name].get("ansible_host")
            hosts[name] = str(host) if host else None
            ssh_ports[name] = hostvars[name].get("ansible_port")
        except (PlanError, InventoryError) as err:
            raise InventoryError(f"{name}: {err}") from err
        except Exception as err:  # an undecryptable Vault value, a broken template
            raise InventoryError(f"{name}: a vllm_fleet_* variable cannot be read: {err}") from err
        for line in interface.unknown(raw):
            if line not in warnings:
                warnings.append(line)
    try:
        interface.check_nodes(per_node, role_vars, hosts, ssh_ports)
    except PlanError as err:
        raise InventoryError(str(for_inventory(err))) from None
    first = nodes[0] if nodes else None
    if first and not per_node[first].get("model") and not per_node[first].get("models"):
        raise InventoryError(
            "vllm_fleet_model: the inventory declares no model; fix: set vllm_fleet_model (a model folder or a "
            "catalog name, see 'vllm-fleet models') or vllm_fleet_models (several)"
        )
    # Every host the plan names must be in the inventory (and is reached before any phase
    # changes a node: playbooks/plan.yml's reach play takes these with the nodes).
    extra_hosts: list[str] = []
    for field in ("gateway_host", "monitoring_host"):
        host = per_node[first].get(field) if first else None
        if not host:
            continue
        if host not in hostvars:
            raise InventoryError(
                f"{interface.PREFIX}{field}: {host} is not in the inventory; fix: add {host} to the inventory "
                f"(with its ansible_host), or leave {interface.PREFIX}{field} unset"
            )
        if host not in nodes and host not in extra_hosts:
            extra_hosts.append(str(host))
    stated = per_node[first].get("artifacts_dir") if first else None
    return {
        "nodes": per_node,
        "artifacts": str(stated or os.path.normpath(os.path.join(str(playbook_dir), "..", "artifacts"))),
        "extra_hosts": extra_hosts,
        "role_vars": role_vars,
        "warnings": warnings,
        "wishes": interface.wishes(per_node[first], role_vars[first], per_node.values()) if first else {},
    }


@functools.lru_cache(maxsize=32)
def role_digest(role_path: str) -> str:
    """sha256 of a role's own files (tasks, templates, files, vars, defaults; not its tests or
    docs): part of the inputs a role's applied-state record keeps, so that a changed role
    converges again on the next run even where its inputs are the same. A folder linked into
    files/ (the node agents' package) counts with its contents."""
    root = Path(role_path)
    sha = hashlib.sha256()
    for part in ("defaults", "files", "handlers", "meta", "tasks", "templates", "vars"):
        found = [
            Path(folder) / name
            for folder, _dirs, names in os.walk(root / part, followlinks=True)
            if "__pycache__" not in Path(folder).parts
            for name in names
        ]
        for path in sorted(found):
            sha.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()


class ReadOnce(Mapping[str, Any]):
    """``hostvars`` with each host read once: every read of Ansible's ``hostvars[name]`` merges
    that host's variables again (about 0.5 ms, and it cleans the host's facts), and the plan
    phase reads each node several times (settings, the planner's nodes, its record's context)."""

    def __init__(self, hostvars: Any) -> None:
        self._hostvars = hostvars
        self._read: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._read:
            self._read[name] = self._hostvars[name]
        return self._read[name]

    def __contains__(self, name: object) -> bool:
        return name in self._read or name in self._hostvars

    def __iter__(self) -> Any:
        return iter(self._hostvars)

    def __len__(self) -> int:
        return len(self._hostvars)
