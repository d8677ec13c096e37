"""Ansible filter vllm_fleet_launches: the vllm serve processes a node runs.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_launches``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.deploy import serve
from vllm_fleet.errors import PlanError, for_inventory

DOCUMENTATION = r"""
name: vllm_fleet_launches
short_description: "The vllm serve processes a node runs"
version_added: 0.1.0
author: vllm-fleet
description:
  - "The C(vllm serve) processes C(node) runs for the plan's instances: argv, environment, port, role."
positional: node, options
options:
  _input:
    description:
      - "The plan's instances."
    type: list
    required: true
    elements: dict
  node:
    description:
      - "The node's inventory name."
    type: str
    required: true
  options:
    description:
      - "Serving options (model folder, cores, ...)."
    type: dict
    required: false
"""

EXAMPLES = r"""
- name: The launches of node1
  ansible.builtin.set_fact:
    __launches: "{{ plan.instances | vllm_fleet_launches('node1', {'model': '/models/tiny'}) }}"
"""

RETURN = r"""
_value:
  description: "One dict per launch."
  type: list
"""


def vllm_fleet_launches(instances: list[dict[str, Any]], node: str, options: dict[str, Any] | None = None) -> Any:
    try:
        return serve.launches(instances, node, options)
    except PlanError as err:
        raise AnsibleFilterError(str(for_inventory(err))) from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_launches": vllm_fleet_launches}
