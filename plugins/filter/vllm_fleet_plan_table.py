"""Ansible filter vllm_fleet_plan_table: the plan as the table a person reads.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_plan_table``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.planning.table import render_plan

DOCUMENTATION = r"""
name: vllm_fleet_plan_table
short_description: "The plan as the table a person reads"
version_added: 0.1.0
author: vllm-fleet
description:
  - "The plan rendered as C(vllm-fleet plan) prints it: instances, nodes, GPUs, memory per GPU, KV
    tokens."
options:
  _input:
    description:
      - "The plan."
    type: dict
    required: true
  gateway:
    description:
      - "The deployment's gateway (C(vllm_fleet_deployment.gateway)): the gateway line then names the
        balancer it chose and why."
    type: dict
    required: false
"""

EXAMPLES = r"""
- name: Show the plan
  ansible.builtin.debug:
    msg: "{{ vllm_fleet_plan | vllm_fleet_plan_table(vllm_fleet_deployment.gateway) }}"
"""

RETURN = r"""
_value:
  description: "The table, several lines."
  type: str
"""


def vllm_fleet_plan_table(plan: dict[str, Any], gateway: dict[str, Any] | None = None) -> Any:
    return render_plan(plan, gateway)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_plan_table": vllm_fleet_plan_table}
