"""Ansible filter vllm_fleet_deployment: what the whole deployment shares, computed once.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_deployment``)."""

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
name: vllm_fleet_deployment
short_description: "What the whole deployment shares, computed once"
version_added: 0.1.0
author: vllm-fleet
description:
  - "The deployment's gateway, verify, monitoring and rolling parts (C(vllm_fleet/deploy/deployment.py)), once,
    on the controller."
  - "The first node's settings are the deployment-wide ones; the gateway and monitoring hosts' addresses
    come from C(hostvars)."
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
- name: The deployment's shared parts
  ansible.builtin.set_fact:
    vllm_fleet_deployment: "{{ vllm_fleet_plan | vllm_fleet_deployment(vllm_fleet_settings, hostvars) }}"
"""

RETURN = r"""
_value:
  description: "C({gateway, verify, monitoring, rolling, ...})."
  type: dict
"""


def vllm_fleet_deployment(plan: dict[str, Any], settings: dict[str, Any], hostvars: Any) -> Any:
    plan, settings = inventory.plain(plan), inventory.plain(settings)
    if not settings.get("nodes"):
        raise AnsibleFilterError("vllm_fleet_deployment: no node settings")
    try:
        return plan_phase.deployment_for(plan, settings, hostvars)
    except inventory.InventoryError as err:
        raise AnsibleFilterError(str(err)) from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_deployment": vllm_fleet_deployment}
