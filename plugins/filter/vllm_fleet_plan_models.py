"""Ansible filter vllm_fleet_plan_models: allocate several models on the nodes as one plan.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_plan_models``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.errors import PlanError, for_inventory
from vllm_fleet.inventory import hostvars as inventory
from vllm_fleet.planning.allocate import allocate, combined_plan, wishes_from_data
from vllm_fleet.planning.cluster import cluster_from_data

DOCUMENTATION = r"""
name: vllm_fleet_plan_models
short_description: "Allocate several models on the nodes as one plan"
version_added: 0.1.0
author: vllm-fleet
description:
  - "Several models on the nodes (C(vllm_fleet_models)): the allocation (C(vllm_fleet/planning/allocate.py)) as
    one plan."
  - "Every model inherits the deployment-wide wishes unless its entry says otherwise."
positional: models
options:
  _input:
    description:
      - "Nodes, as for vllm_fleet_plan."
    type: list
    required: true
    elements: dict
  models:
    description:
      - "The C(vllm_fleet_models) entries."
    type: list
    required: true
    elements: dict
  wishes:
    description:
      - "The deployment-wide wishes, as for vllm_fleet_plan."
    type: dict
    required: false
"""

EXAMPLES = r"""
- name: Plan several models
  ansible.builtin.set_fact:
    vllm_fleet_plan_result: "{{ nodes | vllm_fleet_plan_models(vllm_fleet_models, wishes) }}"
"""

RETURN = r"""
_value:
  description: "The combined plan: every model's instances, the gateway's routes by model."
  type: dict
"""


def vllm_fleet_plan_models(nodes: Any, models: Any, wishes: dict[str, Any] | None = None) -> Any:
    try:
        cluster = cluster_from_data(list(nodes) if not isinstance(nodes, dict) else nodes)
        return combined_plan(allocate(wishes_from_data(models), cluster, inventory.clean_wishes(wishes)))
    except inventory.InventoryError as err:
        raise AnsibleFilterError(f"vllm_fleet_plan_models: {err}") from err
    except PlanError as err:
        raise AnsibleFilterError(f"vllm_fleet_plan_models: {for_inventory(err)}") from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_plan_models": vllm_fleet_plan_models}
