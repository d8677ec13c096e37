"""Ansible filter vllm_fleet_rolling_now: this run's serve batches.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_rolling_now``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.deploy import deployment
from vllm_fleet.inventory import hostvars as inventory

DOCUMENTATION = r"""
name: vllm_fleet_rolling_now
short_description: "This run's serve batches"
version_added: 0.1.0
author: vllm-fleet
description:
  - "From each host's C(__vllm_server_applied) (vllm_server's applied check): which nodes restart, in
    batches (C(vllm_fleet/deploy/deployment.py) rolling_now); the nodes of a multi-node instance (read
    from each host's C(vllm_fleet_node) launches) restart in one batch."
  - "A host that did not run the check counts as nothing to restart."
positional: hosts, rolling
options:
  _input:
    description:
      - "Ansible's C(hostvars)."
    type: dict
    required: true
  hosts:
    description:
      - "The serving hosts."
    type: list
    required: true
    elements: str
  rolling:
    description:
      - "The deployment's rolling part."
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: This run's batches
  ansible.builtin.set_fact:
    __rolling: "{{ hostvars | vllm_fleet_rolling_now(ansible_play_hosts, vllm_fleet_deployment.rolling) }}"
"""

RETURN = r"""
_value:
  description: "C({serial, nodes, order, message}): C(order) is the serve play's hosts in batch order."
  type: dict
"""


def vllm_fleet_rolling_now(hostvars: Any, hosts: list[str], rolling: dict[str, Any]) -> Any:
    return deployment.rolling_now(
        inventory.plain(rolling),
        inventory.applied_by_host(hostvars, list(hosts)),
        inventory.instances_by_host(hostvars, list(hosts)),
    )


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_rolling_now": vllm_fleet_rolling_now}
