"""Ansible filter vllm_fleet_plan_nodes: the planner's nodes from the inventory and what gpu_facts detected.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_plan_nodes``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.inventory import hostvars as inventory

DOCUMENTATION = r"""
name: vllm_fleet_plan_nodes
short_description: "The planner's nodes from the inventory and what gpu_facts detected"
version_added: 0.1.0
author: vllm-fleet
description:
  - "One entry per node (C(name, gpu, gpu_count, gpu_memory_gib, gpu_free_gib, nvlink, nic_gbps, address,
    interface)): the inventory's C(vllm_fleet_*) value where it states one, else what the gpu_facts role
    detected."
  - "A node without a GPU, stated or detected, is named with the fix."
positional: nodes
options:
  _input:
    description:
      - "Ansible's C(hostvars)."
    type: dict
    required: true
  nodes:
    description:
      - "The inventory names of the nodes."
    type: list
    required: true
    elements: str
"""

EXAMPLES = r"""
- name: The nodes as the planner takes them
  ansible.builtin.set_fact:
    __nodes: "{{ hostvars | vllm_fleet_plan_nodes(groups['vllm_nodes']) }}"
"""

RETURN = r"""
_value:
  description: "The nodes, in the order given."
  type: list
"""


def vllm_fleet_plan_nodes(hostvars: Any, nodes: list[str]) -> Any:
    try:
        return inventory.plan_nodes(hostvars, list(nodes))
    except inventory.InventoryError as err:
        raise AnsibleFilterError(str(err)) from err


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_plan_nodes": vllm_fleet_plan_nodes}
