"""The plan phase as one Python pass on the controller (plugins/action/vllm_fleet_plan_phase.py,
playbooks/plan.yml): the plan of one model or several with its ports checked, plan.json and
plan.md, the deployment, and one record file per node, which each node then reads alone.

Ansible's Jinja never holds the plan or the records: at 1,000 hosts the plan is about 8 MiB
and the records 4 MiB, and every fact of that size was walked again by Ansible's templating
(issue 48: most of a 40 s plan phase). What goes back to Ansible is small: the deployment's
shared part, the folder of the records and the plan's digest. The filters of the same steps
(plugins/filter/) call these functions too.

Files are written only when their text changes, each through a temporary file renamed into
place, so a reader never sees half a plan. The working files (plan-inputs.json, the plan's
working copy, deployment.json, records/) are written in check mode too; plan.json and plan.md
are not (:func:`write_plan`).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from vllm_fleet.deploy import deployment, records
from vllm_fleet.errors import PlanError, for_inventory
from vllm_fleet.inventory import hostvars as inventory
from vllm_fleet.inventory import interface
from vllm_fleet.model.spec import load_model
from vllm_fleet.planning.allocate import allocate, combined_plan, wishes_from_data
from vllm_fleet.planning.cluster import cluster_from_data
from vllm_fleet.planning.strategy import Wishes, plan_cluster
from vllm_fleet.planning.table import render_plan

RECORDS = "records"
RECORD_SUFFIX = ".json"


def _first(settings: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    nodes = settings.get("nodes") or {}
    if not nodes:
        raise inventory.InventoryError("vllm_nodes: no node settings; fix: add hosts to the vllm_nodes group")
    first = next(iter(nodes))
    return first, nodes[first]


def plan_of(nodes: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    """The plan for ``nodes`` (vllm_fleet_plan_nodes' entries) under ``settings`` (what
    vllm_fleet_settings returns): one model (vllm_fleet_model) or several (vllm_fleet_models),
    then :func:`checked`. The same as the filters vllm_fleet_plan / vllm_fleet_plan_models and
    vllm_fleet_check_ports."""
    _, mine = _first(settings)
    wishes = inventory.clean_wishes(settings.get("wishes"))
    try:
        cluster = cluster_from_data(nodes)
        if mine.get("models"):
            plan = combined_plan(allocate(wishes_from_data(mine["models"]), cluster, wishes))
        else:
            plan = plan_cluster(load_model(str(mine["model"])), cluster, Wishes(**wishes))
    except PlanError as err:
        raise inventory.InventoryError(str(for_inventory(err))) from None
    return checked(plan, settings)


def checked(plan: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """``plan`` once no node has two services on one port, with the gateway's warnings added
    (vllm_fleet_check_ports)."""
    nodes = settings.get("nodes") or {}
    try:
        interface.check_plan_ports(plan, nodes, settings.get("role_vars") or {})
        warnings = deployment.gateway_checks(plan, dict(nodes[next(iter(nodes))])) if nodes else []
    except PlanError as err:
        raise inventory.InventoryError(str(for_inventory(err))) from None
    if warnings:
        plan = {**plan, "warnings": [*(plan.get("warnings") or []), *warnings]}
    return plan


def deployment_for(plan: dict[str, Any], settings: dict[str, Any], hostvars: Any) -> dict[str, Any]:
    """What the whole deployment shares (vllm_fleet_deployment's filter, the same inputs)."""
    first, mine = _first(settings)
    context = {
        "addresses": inventory.addresses(mine, hostvars),
        "role_vars": (settings.get("role_vars") or {}).get(first) or {},
    }
    try:
        return deployment.deployment_of(plan, mine, context)
    except PlanError as err:
        raise inventory.InventoryError(str(for_inventory(err))) from None


def records_for(plan: dict[str, Any], settings: dict[str, Any], hostvars: Any) -> dict[str, dict[str, Any]]:
    """Every node's record (vllm_fleet_records' filter, the same inputs)."""
    nodes = list(settings.get("nodes") or {})
    contexts = inventory.plain(inventory.contexts(settings, hostvars, nodes))
    try:
        return records.records_of(plan, {n: settings["nodes"][n] for n in nodes}, contexts)
    except PlanError as err:
        raise inventory.InventoryError(str(for_inventory(err))) from None


def as_json(data: Any) -> str:
    """A file's JSON text: keys sorted, no indentation (Python's encoder is C only without one:
    indented, plan.json at 1,000 hosts took 0.8 s instead of 0.1 s; ``jq .`` shows it indented)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write(path: Path, text: str, mode: int = 0o644) -> bool:
    """``text`` at ``path`` unless it is there already (True when written): a temporary file in
    the same folder renamed into place."""
    if unchanged(path, text, mode):
        return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


# This run's plan for its later steps, written in check mode too (plan.json is not).
PLAN_WORK = ".plan-phase.json"


def unchanged(path: Path, text: str, mode: int = 0o644) -> bool:
    """Whether ``path`` holds ``text`` already, with ``mode``."""
    try:
        return path.read_text() == text and (path.stat().st_mode & 0o777) == mode
    except (FileNotFoundError, UnicodeDecodeError):
        return False


def write_plan(
    folder: Path, plan: dict[str, Any], gateway: dict[str, Any] | None, check: bool = False
) -> tuple[bool, str, str]:
    """plan.json and plan.md in ``folder`` (created), and the working copy the records step
    reads back (:data:`PLAN_WORK`); returns (changed, the table, the plan's digest). In check
    mode plan.json and plan.md stay as they are (``vllm-fleet status`` reads the plan that was
    applied) and ``changed`` says whether they would change."""
    folder.mkdir(parents=True, exist_ok=True)
    text, table = as_json(plan), render_plan(plan, gateway)
    people = f"# vllm-fleet plan\n\n```\n{table}\n```\n"
    write(folder / PLAN_WORK, text, 0o600)
    if check:
        changed = not unchanged(folder / "plan.json", text) or not unchanged(folder / "plan.md", people)
    else:
        changed = write(folder / "plan.json", text)
        changed = write(folder / "plan.md", people) or changed
    return changed, table, digest(text)


def read_back(path: Path, sha: str) -> dict[str, Any]:
    """A file this run wrote (plan-inputs.json, the plan's working copy), which must still be the
    one written (``sha``)."""
    text = path.read_text()
    if digest(text) != sha:
        raise inventory.InventoryError(
            f"{path} changed during this run (another run with the same artifacts folder?); "
            "fix: run one site.yml at a time per artifacts folder (vllm_fleet_artifacts_dir)"
        )
    data: dict[str, Any] = json.loads(text)
    return data


INPUTS = "plan-inputs.json"


def write_inputs(settings: dict[str, Any], hosts: dict[str, dict[str, Any]], stated: bool) -> dict[str, Any]:
    """The plan phase's inputs to plan-inputs.json in the artifacts folder (0600): every node's
    settings (vllm_fleet_settings' value: the role variables the planner reads, never a secret)
    and ``hosts``, what the planner and the records read of each host (hostvars.snapshot), so
    that a plan phase that reaches no host reads Ansible's hostvars once. Returns what the plays
    read of them, small at any cluster size: the folder, the hosts outside the nodes, the
    warnings, the wishes, whether every node states its GPUs (``stated``: plan before any host
    is reached), and the file with its sha256 for the plan phase's later steps."""
    folder = Path(settings["artifacts"])
    for node in settings["nodes"]:
        record_path(folder, node)  # a name that cannot be a file stops here, before any host is reached
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / INPUTS
    text = as_json({"settings": settings, "hosts": hosts})
    write(path, text, 0o600)
    return {
        **{k: settings[k] for k in ("artifacts", "extra_hosts", "warnings", "wishes")},
        "stated": stated,
        "file": str(path),
        "sha": digest(text),
    }


# The deployment's lists that grow with the cluster: in deployment.json, read only by the plays that
# use them (Prometheus's host, the verify host), never in the fact every play carries.
LONG_PARTS = (("monitoring", "targets"), ("verify", "targets"))


def write_deployment(folder: Path, whole: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """deployment.json in ``folder`` (all of it), and what the plays carry as vllm_fleet_deployment:
    the same without :data:`LONG_PARTS` (about 0.8 MiB at 1,000 hosts), with ``file``."""
    changed = write(folder / "deployment.json", as_json(whole), 0o600)
    small: dict[str, Any] = {**whole, "file": str(folder / "deployment.json")}
    for part, key in LONG_PARTS:
        small[part] = {k: v for k, v in whole[part].items() if k != key}
    return changed, small


def record_path(folder: Path, node: str) -> Path:
    """Where ``node``'s record goes: a file named after the inventory name, which must be one."""
    if not node or "/" in node or "\0" in node or node.startswith("."):
        raise inventory.InventoryError(
            f"{node!r}: this inventory name cannot name its record file; fix: rename the host in the inventory "
            "(ansible_host keeps its address)"
        )
    return folder / RECORDS / f"{node}{RECORD_SUFFIX}"


def write_records(folder: Path, by_node: dict[str, dict[str, Any]]) -> bool:
    """One file per node under ``folder``/records (0700; files 0600: the records hold no secret,
    but the folder is the controller's, not the operator's to share), and nothing else: a node
    that left the inventory loses its file. Returns whether anything changed."""
    where = folder / RECORDS
    where.mkdir(parents=True, exist_ok=True)
    os.chmod(where, 0o700)
    changed = False
    for node, record in by_node.items():
        changed = write(record_path(folder, node), as_json(record), 0o600) or changed
    wanted = {f"{n}{RECORD_SUFFIX}" for n in by_node}
    for old in where.iterdir():
        if old.name.endswith(RECORD_SUFFIX) and old.name not in wanted:
            old.unlink()
            changed = True
    return changed
