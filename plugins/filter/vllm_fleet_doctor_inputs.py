"""Ansible filter vllm_fleet_doctor_inputs: what the doctor play checks on each node.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_doctor_inputs``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.inventory import hostvars as inventory
from vllm_fleet.ops import doctor

DOCUMENTATION = r"""
name: vllm_fleet_doctor_inputs
short_description: "What the doctor play checks on each node"
version_added: 0.1.0
author: vllm-fleet
description:
  - "By node: the ports, paths and addresses the doctor checks (C(vllm_fleet/ops/doctor.py) inputs_of)."
positional: hostvars
options:
  _input:
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
- name: The doctor's inputs
  ansible.builtin.set_fact:
    __doctor: "{{ vllm_fleet_settings | vllm_fleet_doctor_inputs(hostvars) }}"
"""

RETURN = r"""
_value:
  description: "C({node: inputs})."
  type: dict
"""


def vllm_fleet_doctor_inputs(settings: dict[str, Any], hostvars: Any) -> Any:
    settings = inventory.plain(settings)
    role_vars = settings.get("role_vars") or {}
    return {
        name: doctor.inputs_of(mine, role_vars.get(name) or {}, inventory.given(hostvars[name], "ansible_host"), name)
        for name, mine in (settings.get("nodes") or {}).items()
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_doctor_inputs": vllm_fleet_doctor_inputs}
