"""Ansible action vllm_fleet_plan_phase: the plan phase in one Python pass on the controller.

A thin adapter: every decision is the vllm_fleet package's (vllm_fleet/inventory/plan_phase.py).
playbooks/plan.yml calls it three times: the settings (step=settings), the plan when the
inventory states every node's GPUs (step=plan), and every node's record after gpu_facts
(step=records), which plans first when step=plan did not. The plan and the records go to
files in the artifacts folder, never through Ansible's templating; what comes back is small.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.inventory import hostvars as inventory
from vllm_fleet.inventory import plan_phase

STEPS = ("settings", "plan", "records")


class ActionModule(ActionBase):  # type: ignore[misc]
    """step=settings: writes plan-inputs.json; C(settings) what the plays read of it
    (vllm_fleet/inventory/plan_phase.py write_inputs). The later steps read the hosts from that
    file unless C(gathered) (a host play ran since: they read Ansible's hostvars again).
    step=plan: writes plan.json and plan.md (not in check mode: the plan that was applied stays) and
    the working copy the records step reads; C(msg) the table, C(plan_sha) the plan's sha256. With
    C(only) (a run that only plans) it also runs the records' checks and returns C(records_checked).
    step=records: writes records/<node>.json and deployment.json; C(deployment) without its long
    lists (write_deployment), C(records_dir), and C(msg)/C(plan_sha) when it planned."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("step", "nodes", "api_key", "playbook_dir", "settings", "plan_sha", "gathered", "only"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        args = self._task.args
        step = args.get("step")
        if step not in STEPS:
            raise AnsibleActionFail(f"vllm_fleet_plan_phase: step must be one of {', '.join(STEPS)}, got {step!r}")
        hostvars: Any = inventory.ReadOnce((task_vars or {})["hostvars"])
        nodes = [str(n) for n in args.get("nodes") or []]
        # The default callback prints the table through a debug task; the data stays out of -v.
        result.update(changed=False, _ansible_verbose_override=True)
        try:
            if step == "settings":
                api_key, playbook_dir = bool(args.get("api_key")), str(args.get("playbook_dir") or "playbooks")
                settings = inventory.settings_of(hostvars, nodes, api_key, playbook_dir)
                # Plan before any host is reached when the inventory states every node's GPUs.
                stated = all("vllm_fleet_gpu" in hostvars[n] and "vllm_fleet_gpu_count" in hostvars[n] for n in nodes)
                hosts = inventory.snapshot(hostvars, [*nodes, *settings["extra_hosts"]])
                result["settings"] = plan_phase.write_inputs(settings, hosts, stated)
                return result
            given = dict(args.get("settings") or {})
            inputs = plan_phase.read_back(Path(str(given.get("file"))), str(given.get("sha")))
            settings = inputs["settings"]
            folder = Path(settings["artifacts"])
            # What the hosts hold now, where a host play (gpu_facts) ran since the settings were read.
            if boolean(args.get("gathered") or False, strict=False):
                hostvars = inventory.ReadOnce((task_vars or {})["hostvars"])
            else:
                hostvars = inputs["hosts"]
            sha = str(args.get("plan_sha") or "")
            if sha:
                plan = plan_phase.read_back(folder / plan_phase.PLAN_WORK, sha)
                whole = plan_phase.deployment_for(plan, settings, hostvars)
            else:
                plan = plan_phase.plan_of(inventory.plan_nodes(hostvars, nodes), settings)
                whole = plan_phase.deployment_for(plan, settings, hostvars)
                if step == "plan" and boolean(args.get("only") or False, strict=False):
                    # A run that only plans (--tags plan): the records' own checks (a node in two
                    # Ray clusters, Ray's GPUs, RDMA settings) run here, before plan.json is
                    # written, and no record is written, as no play of this run reads one; the
                    # records step is then skipped.
                    plan_phase.records_for(plan, settings, hostvars)
                    result["records_checked"] = True
                result["changed"], result["msg"], result["plan_sha"] = plan_phase.write_plan(
                    folder, plan, whole["gateway"], bool(self._task.check_mode)
                )
            if step == "records":
                # The records and deployment.json are this run's working files, as the facts they
                # replaced were: only a changed plan.json / plan.md counts as a change.
                plan_phase.write_records(folder, plan_phase.records_for(plan, settings, hostvars))
                _, result["deployment"] = plan_phase.write_deployment(folder, whole)
                result["records_dir"] = str(folder / plan_phase.RECORDS)
        except inventory.InventoryError as err:
            raise AnsibleActionFail(str(err)) from None
        return result
