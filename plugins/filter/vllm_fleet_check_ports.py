"""Ansible filter vllm_fleet_check_ports: the plan, once no node has two services on one port.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_check_ports``)."""

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
name: vllm_fleet_check_ports
short_description: "The plan, once no node has two services on one port"
version_added: 0.1.0
author: vllm-fleet
description:
  - "Checks the ports the plan hands out on each node against each other and the roles' own ports."
  - "Adds the gateway's warnings to the plan's."
positional: settings
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
"""

EXAMPLES = r"""
- name: Check the ports
  ansible.builtin.set_fact:
    vllm_fleet_plan: "{{ __plan | vllm_fleet_check_ports(vllm_fleet_settings) }}"
"""

RETURN = r"""
_value:
  description: "The plan, with the gateway's warnings added."
  type: dict
"""


def vllm_fleet_check_ports(plan: dict[str, Any], settings: dict[str, Any]) -> Any:
    try:
        return plan_phase.checked(inventory.plain(plan), inventory.plain(settings))
    except inventory.InventoryError as err:
        raise AnsibleFilterError(f"vllm_fleet_check_ports: {err}") from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_check_ports": vllm_fleet_check_ports}
