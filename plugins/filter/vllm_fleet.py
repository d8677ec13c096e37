"""Ansible filters: thin adapters from Ansible data to the vllm_fleet planner.

No arithmetic lives here: every number comes from the ``vllm_fleet`` package.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet import deploy, deployment, doctor, interface, nccl, preview, schema, serve
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.allocate import allocate, combined_plan, wishes_from_data
from vllm_fleet.cluster import cluster_from_data
from vllm_fleet.errors import PlanError, for_inventory
from vllm_fleet.facts import host_facts
from vllm_fleet.memory import estimate
from vllm_fleet.model_spec import load_model
from vllm_fleet.strategy import Wishes, plan_cluster
from vllm_fleet.table import render_plan

DOCUMENTATION = r"""
name: vllm_fleet_plan
short_description: Choose the vLLM layout of a model on a cluster
description:
  - Calls C(vllm_fleet.strategy.plan_cluster) with the nodes and the operator's wishes.
  - Fails with the planner's one-line reason (field and fix) when the request cannot work.
positional: model
options:
  _input:
    description: Nodes, a list of C({name, gpu, gpu_count}) with optional C(gpu_memory_gib), C(nvlink), C(nic_gbps),
      C(address), C(interface).
    type: list
    elements: dict
    required: true
  model:
    description: Model folder with config.json, or a catalog name.
    type: str
    required: true
  wishes:
    description: Every option vllm_fleet/schema.py declares (the inventory's vllm_fleet_<name> without the
      prefix, checked as the inventory variable is), and strategies, model_ref, served_model_name, port,
      ray_available, extra_env (the environment vLLM runs with, which its start-up checks read, e.g.
      VLLM_ALLOW_LONG_MAX_MODEL_LEN), extra_args (the vllm serve arguments every node adds, e.g.
      --allow-deprecated-quantization).
    type: dict
"""

EXAMPLES = r"""
- name: Plan the deployment
  ansible.builtin.set_fact:
    vllm_fleet_plan_result: "{{ nodes | vllm_fleet_plan(vllm_fleet_model, {'max_model_len': 32768}) }}"

- name: Show it
  ansible.builtin.debug:
    msg: "{{ vllm_fleet_plan_result | vllm_fleet_plan_table }}"
"""

RETURN = r"""
_value:
  description: The plan, as C(vllm-fleet plan --json) prints it (instances, rejected, gateway, warnings).
  type: dict
"""

# The wishes: every declared option (vllm_fleet/schema.py) and what the deployment hands the planner.
_WISH_KEYS = frozenset(Wishes.__dataclass_fields__) - {"draft_spec"}


def _clean(wishes: dict[str, Any] | None) -> dict[str, Any]:
    data = {k: v for k, v in (wishes or {}).items() if v is not None and v not in ("", "None")}
    unknown = set(data) - _WISH_KEYS
    if unknown:
        raise AnsibleFilterError(
            f"vllm_fleet_plan: unknown wish(es) {sorted(unknown)}; fix: use only {sorted(_WISH_KEYS)}"
        )
    for key, value in data.items():
        if key in schema.by_name():
            # Checked and typed as the inventory variable of the same name is.
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
            raise AnsibleFilterError(f"vllm_fleet_plan: port: '{data['port']}' is not an integer") from exc
    return data


def vllm_fleet_plan(nodes: Any, model: str, wishes: dict[str, Any] | None = None) -> dict[str, Any]:
    try:
        spec = load_model(str(model))
        cluster = cluster_from_data(list(nodes) if not isinstance(nodes, dict) else nodes)
        return plan_cluster(spec, cluster, Wishes(**_clean(wishes)))
    except PlanError as err:
        raise AnsibleFilterError(f"vllm_fleet_plan: {for_inventory(err)}") from None


def vllm_fleet_plan_models(nodes: Any, models: Any, wishes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Several models on the nodes (``vllm_fleet_models``): the allocation as one plan
    (vllm_fleet/allocate.py combined_plan). ``wishes``: the deployment-wide ones, which every
    model inherits unless its entry says otherwise."""
    try:
        cluster = cluster_from_data(list(nodes) if not isinstance(nodes, dict) else nodes)
        return combined_plan(allocate(wishes_from_data(models), cluster, _clean(wishes)))
    except PlanError as err:
        raise AnsibleFilterError(f"vllm_fleet_plan_models: {for_inventory(err)}") from None


def _plain(value: Any) -> Any:
    """``value`` as plain dicts, lists and scalars (one pass over Ansible's lazy containers)."""
    if isinstance(value, dict) or (hasattr(value, "items") and hasattr(value, "keys")):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value


_NO_GPU_DETECTED = (
    "Host {name} reports no NVIDIA GPU (gpu_facts found {found}): install the driver, or state vllm_fleet_gpu and "
    "vllm_fleet_gpu_count by hand (e.g. cpu / 1 for the CPU build)."
)
_NO_GPU_STATED = (
    "Host {name}: set vllm_fleet_gpu (e.g. H100-SXM, A800, L20, cpu) and vllm_fleet_gpu_count in the inventory, "
    "or run without --tags plan so that gpu_facts detects them."
)


def _given(host: Any, name: str) -> Any:
    """The inventory's value of ``name`` on ``host`` (None when unset)."""
    return host.get(name) if name in host else None


def _node_values(host: Any) -> dict[str, Any]:
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
        "nic_gbps": seen.get("nic_gbps"),
        "interface": route.get("interface"),
        "address": route.get("address"),
    }
    out = {}
    for key, value in detected.items():
        given = _given(host, f"vllm_fleet_{key}")
        out[key] = given if given is not None else value
    out["cores"] = seen.get("cpu_cores")
    out["detected"] = bool(seen)
    return out


def vllm_fleet_plan_nodes(hostvars: Any, nodes: list[str]) -> list[dict[str, Any]]:
    """The planner's nodes from the inventory and what gpu_facts detected (the inventory's
    values win), in one pass: a loop of set_fact cost 30 ms a node (4 s at 128 hosts). A node
    without GPUs is named, with the fix. Unset values stay None: the planner's own defaults
    apply (cluster.py)."""
    out = []
    for name in nodes:
        host = hostvars[name]
        values = _node_values(host)
        gpu, count = values["gpu"], values["gpu_count"]
        try:
            usable = gpu is not None and count is not None and int(count) > 0
        except (TypeError, ValueError):
            usable = True  # the planner names a count that is not a number
        if not usable:
            text = _NO_GPU_DETECTED if values["detected"] else _NO_GPU_STATED
            raise AnsibleFilterError(text.format(name=name, found=count if values["detected"] else None))
        out.append(
            {
                "name": str(name),
                "gpu": gpu,
                "gpu_count": int(count) if str(count).strip().isdigit() else count,
                "gpu_memory_gib": values["gpu_memory_gib"],
                "gpu_free_gib": values["gpu_free_gib"],
                "nvlink": values["nvlink"],
                "nic_gbps": values["nic_gbps"],
                "address": values["address"] or _given(host, "ansible_host") or str(name),
                "interface": values["interface"],
            }
        )
    return out


def _contexts(settings: dict[str, Any], hostvars: Any, nodes: list[str]) -> dict[str, dict[str, Any]]:
    """What each node's record reads beside the plan and its settings (vllm_fleet/deploy.py
    node_record): the cores gpu_facts counted, whether the model is a folder on this
    controller, the role variables the inventory sets, the addresses of the gateway and
    monitoring hosts, the node's own address, interface and GPU count, and (one dict shared
    by every node) the fabric: each node's InfiniBand/RoCE ports and RDMA settings."""
    per_node = settings.get("nodes") or {}
    fabric = vllm_fleet_fabric(settings, hostvars, nodes)
    folders: dict[str, bool] = {}
    out: dict[str, dict[str, Any]] = {}
    for name in nodes:
        mine = per_node.get(name) or {}
        model = str(mine.get("model") or "")
        if model not in folders:
            folders[model] = bool(model) and Path(model).is_dir()
        host = hostvars[name]
        values = _node_values(host)
        addresses = {}
        for other in (mine.get("gateway_host"), mine.get("monitoring_host")):
            if other and other in hostvars:
                addresses[str(other)] = str(_given(hostvars[other], "ansible_host") or other)
        out[str(name)] = {
            "detected_cores": values["cores"],
            "model_is_dir": folders[model],
            "role_vars": (settings.get("role_vars") or {}).get(name) or {},
            "addresses": addresses,
            "host": {
                "address": values["address"] or _given(host, "ansible_host") or str(name),
                "interface": values["interface"],
                "gpu_count": values["gpu_count"],
            },
            "fabric": fabric,
        }
    return out


def vllm_fleet_records(plan: dict[str, Any], settings: dict[str, Any], hostvars: Any) -> dict[str, Any]:
    """Every node's deployment record (vllm_fleet/deploy.py records_of), once per run on the
    controller, after gpu_facts: ``{node: record}``. Each node then holds its own record only
    (playbooks/plan.yml). ``settings``: what vllm_fleet_settings returned."""
    plan, settings = _plain(plan), _plain(settings)
    nodes = list(settings.get("nodes") or {})
    contexts = _plain(_contexts(settings, hostvars, nodes))
    try:
        return deploy.records_of(plan, {n: settings["nodes"][n] for n in nodes}, contexts)
    except PlanError as err:
        raise AnsibleFilterError(str(for_inventory(err))) from None


def vllm_fleet_doctor_inputs(settings: dict[str, Any], hostvars: Any) -> dict[str, Any]:
    """What the doctor play checks on each node (vllm_fleet/doctor.py inputs_of), by node."""
    settings = _plain(settings)
    role_vars = settings.get("role_vars") or {}
    return {
        name: doctor.inputs_of(mine, role_vars.get(name) or {}, _given(hostvars[name], "ansible_host"), name)
        for name, mine in (settings.get("nodes") or {}).items()
    }


def vllm_fleet_doctor_node(results: dict[str, Any], inputs: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """One node's part of the doctor's bundle from its registered results (vllm_fleet/doctor.py gathered)."""
    try:
        return doctor.gathered(_plain(results), _plain(inputs), _plain(facts))
    except (KeyError, TypeError, ValueError) as err:
        raise AnsibleFilterError(f"vllm_fleet_doctor_node: malformed result ({type(err).__name__}: {err})") from err


def vllm_fleet_rolling_now(hostvars: Any, hosts: list[str], rolling: dict[str, Any]) -> dict[str, Any]:
    """This run's serve batches (vllm_fleet/deployment.py rolling_now) from each host's
    ``__vllm_server_applied`` (vllm_server's applied_check; a host that did not run it counts
    as nothing to restart): ``{"serial", "nodes", "message"}``."""
    applied: dict[str, Any] = {}
    for name in hosts:
        host = hostvars[name]
        result = _plain(host.get("__vllm_server_applied")) if "__vllm_server_applied" in host else None
        applied[str(name)] = result if isinstance(result, dict) and "current" in result else None
    return deployment.rolling_now(_plain(rolling), applied)


def vllm_fleet_contexts(settings: dict[str, Any], hostvars: Any) -> dict[str, Any]:
    """What each node's record was computed with beside the plan and its settings (the
    preview keeps it, without secrets, for ``vllm-fleet plan --diff``)."""
    settings = _plain(settings)
    return _plain(_contexts(settings, hostvars, list(settings.get("nodes") or {})))


def vllm_fleet_check_ports(plan: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """``plan`` itself, once no node has two services on one port among the ports the plan
    hands out there (``settings``: what vllm_fleet_settings returned)."""
    # Plain Python before the walk: Ansible hands a value over as containers that template each
    # item on access, and the port check reads the plan's instances once per node (70 s at 1,000
    # hosts through those containers, 1.5 s plain).
    plan, settings = _plain(plan), _plain(settings)
    nodes = settings["nodes"]
    try:
        interface.check_plan_ports(plan, nodes, settings.get("role_vars") or {})
        warnings = deployment.gateway_checks(plan, dict(nodes[next(iter(nodes))])) if nodes else []
    except PlanError as err:
        raise AnsibleFilterError(f"vllm_fleet_check_ports: {for_inventory(err)}") from None
    if not warnings:
        return plan
    return {**plan, "warnings": [*(plan.get("warnings") or []), *warnings]}


def vllm_fleet_estimate(model: str, gpu_memory_gib: float, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    try:
        spec = load_model(str(model))
        return estimate(spec, Device("GPU", float(gpu_memory_gib)), Settings(**(settings or {}))).to_dict()
    except PlanError as err:
        raise AnsibleFilterError(f"vllm_fleet_estimate: {for_inventory(err)}") from None
    except TypeError as err:
        raise AnsibleFilterError(f"vllm_fleet_estimate: bad settings ({err})") from err


def vllm_fleet_plan_table(plan: dict[str, Any]) -> str:
    return render_plan(plan)


def vllm_fleet_instances_on(plan: dict[str, Any], node: str) -> list[dict[str, Any]]:
    """Instances with a stage on ``node`` (what a host's serve role starts)."""
    return [inst for inst in plan["instances"] if node in inst["nodes"]]


def vllm_fleet_gpu_facts(raw: dict[str, Any]) -> dict[str, Any]:
    """A host's GPUs, links, NICs and limits from the raw outputs the gpu_facts role gathered."""
    if not isinstance(raw, dict):
        raise AnsibleFilterError("vllm_fleet_gpu_facts expects a dict of raw command outputs")
    return host_facts(raw)


def vllm_fleet_doctor(bundle: dict[str, Any]) -> dict[str, Any]:
    """The doctor's verdict on a bundle: {"ok", "checks": [{name, status, detail, fix}], "lines"}."""
    try:
        checks = doctor.evaluate(bundle)
    except doctor.BundleError as err:
        raise AnsibleFilterError(f"vllm_fleet_doctor: {err}") from err
    return {
        "ok": doctor.exit_code(checks) == 0,
        "checks": [vars(c) for c in checks],
        "lines": doctor.render(checks).splitlines(),
    }


def vllm_fleet_launches(
    instances: list[dict[str, Any]], node: str, options: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The ``vllm serve`` processes ``node`` runs for the plan's instances (argv, env, port, role)."""
    try:
        return serve.launches(instances, node, options)
    except PlanError as err:
        raise AnsibleFilterError(str(for_inventory(err))) from None


def vllm_fleet_kv_report(log: str) -> dict[str, Any]:
    """The last "KV cache size: N tokens, Maximum concurrency ..." line of a vLLM log ({} if none)."""
    return serve.kv_report(str(log)) or {}


def vllm_fleet_kv_compare(predicted: int, reported: int | None) -> dict[str, Any]:
    """Reported / predicted KV tokens with a verdict (match within 5 %, over, under, unknown)."""
    return serve.compare(int(predicted), None if reported is None else int(reported))


def vllm_fleet_verify_table(rows: list[dict[str, Any]]) -> str:
    """The verify playbook's summary table."""
    return serve.verify_table(rows)


def vllm_fleet_verify_target(instance: dict[str, Any], model: str) -> dict[str, Any]:
    """What verify probes for one planned instance (its endpoint, directly)."""
    return serve.verify_target(instance, model)


def vllm_fleet_verify_rows(probes: list[dict[str, Any]], reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The probe's results joined with vLLM's KV reports."""
    return serve.verify_rows(probes, reports)


def vllm_fleet_nccl_check(log: str, facts: dict[str, Any] | None = None, node: str = "") -> dict[str, Any]:
    """The transports an ``NCCL_DEBUG=INFO`` log shows (vllm_fleet/nccl.py parse) against what the
    node's gpu_facts promise: ``{"ok", "transport": {inter_node, gdrdma, intra_node, ...},
    "check": {name, status, detail, fix}}``. ``ok`` is false only when NCCL fell back to sockets
    on a node with an active IB/RoCE port."""
    if facts is not None and not isinstance(facts, dict):
        raise AnsibleFilterError("vllm_fleet_nccl_check: facts must be the node's gpu_facts dict")
    return nccl.verdict(str(log or ""), dict(facts or {}), str(node or ""))


def vllm_fleet_node(
    plan: dict[str, Any], node: str, settings: dict[str, Any], context: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The deployment record of ``node`` (vllm_fleet/deploy.py): runtime, executors,
    Ray membership, launches, gateway, verify targets, the vLLM release and image."""
    try:
        return deploy.node_record(plan, str(node), dict(settings), dict(context or {}))
    except PlanError as err:
        raise AnsibleFilterError(str(for_inventory(err))) from None


def vllm_fleet_deployment(plan: dict[str, Any], settings: dict[str, Any], hostvars: Any) -> dict[str, Any]:
    """What the whole deployment shares (vllm_fleet/deploy.py deployment_of), once, on the
    controller: the gateway, verify, monitoring and rolling parts. ``settings``: what
    vllm_fleet_settings returned; the first node's values are the deployment-wide ones, and
    the gateway and monitoring hosts' addresses come from ``hostvars`` (they may be outside
    the plan's nodes)."""
    plan, settings = _plain(plan), _plain(settings)
    nodes = settings["nodes"]
    if not nodes:
        raise AnsibleFilterError("vllm_fleet_deployment: no node settings")
    first = next(iter(nodes))
    mine = nodes[first]
    addresses = {}
    for host in (mine.get("gateway_host"), mine.get("monitoring_host")):
        if host and host in hostvars:
            addresses[str(host)] = str(hostvars[host].get("ansible_host") or host)
    context = {"addresses": addresses, "role_vars": (settings.get("role_vars") or {}).get(first) or {}}
    try:
        return deployment.deployment_of(plan, mine, context)
    except PlanError as err:
        raise AnsibleFilterError(str(for_inventory(err))) from None


def vllm_fleet_fabric(settings: dict[str, Any], hostvars: Any, nodes: list[str]) -> dict[str, Any]:
    """What every node's record reads of the nodes' RDMA (vllm_fleet/deploy.py fabric_of):
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
            **{k: mine.get(k) for k in deploy.FABRIC_KEYS},
        }
    return out


def _applied_files(results: list[Any]) -> dict[str, Any]:
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


def vllm_fleet_preview_node(
    record: dict[str, Any], applied: dict[str, Any], options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One node's share of the preview (vllm_fleet/preview.py node_part): its planned state,
    the records read on it and the inputs a laptop plans again with. The API key and Hub
    token in ``options`` are hashed here and never returned."""
    if isinstance(applied, list):
        applied = _applied_files(applied)
    try:
        return preview.node_part(dict(record), dict(applied or {}), dict(options or {}))
    except (KeyError, TypeError, ValueError) as err:
        raise AnsibleFilterError(f"vllm_fleet_preview_node: malformed input ({type(err).__name__}: {err})") from err


def vllm_fleet_preview(
    parts: dict[str, Any],
    gateways: dict[str, Any] | None = None,
    wishes: dict[str, Any] | None = None,
    gateway: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What applying the plan starts, restarts or stops on every node (vllm_fleet/preview.py
    report): changes, lines, warnings, summary, and the applied and planned states.
    ``gateway``: the deployment's gateway (vllm_fleet_deployment)."""
    try:
        return preview.report(
            _plain(parts), dict(gateways or {}), dict(wishes or {}), _plain(gateway) if gateway else None
        )
    except PlanError as err:
        raise AnsibleFilterError(f"vllm_fleet_preview: {err}") from err
    except (KeyError, TypeError, ValueError) as err:
        raise AnsibleFilterError(f"vllm_fleet_preview: malformed input ({type(err).__name__}: {err})") from err


def _own_vars(host_vars: Any) -> dict[str, Any]:
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
            raise _Unreadable(
                f"{k} cannot be read ({first}); fix: check its Vault password (--ask-vault-pass, "
                "--vault-password-file) or its template"
            ) from err
    return out


class _Unreadable(Exception):
    """A variable whose value Ansible cannot produce."""


def vllm_fleet_settings(
    hostvars: Any, nodes: list[str], api_key: bool = False, playbook_dir: str = "playbooks"
) -> dict[str, Any]:
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
            raw = _own_vars(hostvars[name])
            per_node[name] = interface.resolve(raw)
            per_node[name]["api_key"] = bool(per_node[name]["api_key"] or api_key)
            # The role variables the planner reads (ports, paths, modes), never a secret one: this
            # fact is printed at -v, and the roles read their secrets from the inventory themselves.
            role_vars[name] = {
                k: hostvars[name][k]
                for k in list(hostvars[name].keys())
                if str(k).startswith(interface.ROLE_PREFIXES) and not deploy.is_secret_role_var(str(k))
            }
            # The machine behind the name: two names for one machine are refused.
            host = hostvars[name].get("ansible_host")
            hosts[name] = str(host) if host else None
            ssh_ports[name] = hostvars[name].get("ansible_port")
        except PlanError as err:
            raise AnsibleFilterError(f"{name}: {err}") from err
        except _Unreadable as err:
            raise AnsibleFilterError(f"{name}: {err}") from err
        except Exception as err:  # an undecryptable Vault value, a broken template
            raise AnsibleFilterError(f"{name}: a vllm_fleet_* variable cannot be read: {err}") from err
        for line in interface.unknown(raw):
            if line not in warnings:
                warnings.append(line)
    try:
        interface.check_nodes(per_node, role_vars, hosts, ssh_ports)
    except PlanError as err:
        raise AnsibleFilterError(str(for_inventory(err))) from None
    first = nodes[0] if nodes else None
    if first and not per_node[first].get("model") and not per_node[first].get("models"):
        raise AnsibleFilterError(
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
            raise AnsibleFilterError(
                f"{interface.PREFIX}{field}: {host} is not in the inventory; fix: add {host} to the inventory "
                f"(with its ansible_host), or leave {interface.PREFIX}{field} unset"
            )
        if host not in nodes and host not in extra_hosts:
            extra_hosts.append(str(host))
    given = per_node[first].get("artifacts_dir") if first else None
    return {
        "nodes": per_node,
        "artifacts": str(given or os.path.normpath(os.path.join(str(playbook_dir), "..", "artifacts"))),
        "extra_hosts": extra_hosts,
        "role_vars": role_vars,
        "warnings": warnings,
        "wishes": interface.wishes(per_node[first], role_vars[first], per_node.values()) if first else {},
    }


@functools.lru_cache(maxsize=32)
def vllm_fleet_role_digest(role_path: str) -> str:
    """sha256 of a role's own files (tasks, templates, files, vars, defaults; not its tests or
    docs): part of the inputs a role's applied-state record keeps, so that a changed role
    converges again on the next run even where its inputs are the same."""
    root = Path(role_path)
    sha = hashlib.sha256()
    for part in ("defaults", "files", "handlers", "meta", "tasks", "templates", "vars"):
        for path in sorted((root / part).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                sha.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "vllm_fleet_plan": vllm_fleet_plan,
            "vllm_fleet_plan_models": vllm_fleet_plan_models,
            "vllm_fleet_check_ports": vllm_fleet_check_ports,
            "vllm_fleet_plan_nodes": vllm_fleet_plan_nodes,
            "vllm_fleet_node": vllm_fleet_node,
            "vllm_fleet_records": vllm_fleet_records,
            "vllm_fleet_contexts": vllm_fleet_contexts,
            "vllm_fleet_rolling_now": vllm_fleet_rolling_now,
            "vllm_fleet_doctor_inputs": vllm_fleet_doctor_inputs,
            "vllm_fleet_doctor_node": vllm_fleet_doctor_node,
            "vllm_fleet_deployment": vllm_fleet_deployment,
            "vllm_fleet_fabric": vllm_fleet_fabric,
            "vllm_fleet_preview_node": vllm_fleet_preview_node,
            "vllm_fleet_preview": vllm_fleet_preview,
            "vllm_fleet_settings": vllm_fleet_settings,
            "vllm_fleet_estimate": vllm_fleet_estimate,
            "vllm_fleet_plan_table": vllm_fleet_plan_table,
            "vllm_fleet_instances_on": vllm_fleet_instances_on,
            "vllm_fleet_gpu_facts": vllm_fleet_gpu_facts,
            "vllm_fleet_doctor": vllm_fleet_doctor,
            "vllm_fleet_launches": vllm_fleet_launches,
            "vllm_fleet_kv_report": vllm_fleet_kv_report,
            "vllm_fleet_kv_compare": vllm_fleet_kv_compare,
            "vllm_fleet_verify_table": vllm_fleet_verify_table,
            "vllm_fleet_verify_target": vllm_fleet_verify_target,
            "vllm_fleet_verify_rows": vllm_fleet_verify_rows,
            "vllm_fleet_nccl_check": vllm_fleet_nccl_check,
            "vllm_fleet_role_digest": vllm_fleet_role_digest,
        }
