"""Ansible filter vllm_fleet_records: every node's deployment record, computed once.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_records``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.inventory import hostvars as inventory
from vllm_fleet.inventory import plan_phase

DOCUMENTATION = r"""
name: vllm_fleet_records
short_description: "Every node's deployment record, computed once"
version_added: 0.1.0
author: vllm-fleet
description:
  - "Every node's record (C(vllm_fleet/deploy/records.py) records_of), after gpu_facts: runtime, executors, Ray
    membership, launches, gateway part, paths."
  - "Each node then holds its own record only; a record does not grow with the cluster."
positional: settings, hostvars
options:
  _input:
    description:
      - "The plan."
    type: dict
    required: true
  settings:
    description:
      - "What vllm_fleet_settings returned."
    type: dict
    required: true
  hostvars:
    description:
      - "Ansible's C(hostvars)."
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Every node's record
  ansible.builtin.set_fact:
    __records: "{{ vllm_fleet_plan | vllm_fleet_records(vllm_fleet_settings, hostvars) }}"
"""

RETURN = r"""
_value:
  description: "C({node: record})."
  type: dict
"""


def vllm_fleet_records(plan: dict[str, Any], settings: dict[str, Any], hostvars: Any) -> Any:
    try:
        return plan_phase.records_for(inventory.plain(plan), inventory.plain(settings), hostvars)
    except inventory.InventoryError as err:
        raise AnsibleFilterError(str(err)) from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_records": vllm_fleet_records}
