"""Ansible filter vllm_fleet_doctor_node: one node's part of the doctor's bundle.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_doctor_node``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.inventory import hostvars as inventory
from vllm_fleet.ops import doctor

DOCUMENTATION = r"""
name: vllm_fleet_doctor_node
short_description: "One node's part of the doctor's bundle"
version_added: 0.1.0
author: vllm-fleet
description:
  - "The node's registered probe results as the doctor's bundle part (C(vllm_fleet/ops/doctor.py) gathered)."
positional: inputs, facts
options:
  _input:
    description:
      - "The registered results."
    type: dict
    required: true
  inputs:
    description:
      - "The node's vllm_fleet_doctor_inputs entry."
    type: dict
    required: true
  facts:
    description:
      - "The node's facts."
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: This node's part
  ansible.builtin.set_fact:
    __part: "{{ __results | vllm_fleet_doctor_node(__inputs, ansible_facts) }}"
"""

RETURN = r"""
_value:
  description: "The node's part of the bundle."
  type: dict
"""


def vllm_fleet_doctor_node(results: dict[str, Any], inputs: dict[str, Any], facts: dict[str, Any]) -> Any:
    try:
        return doctor.gathered(inventory.plain(results), inventory.plain(inputs), inventory.plain(facts))
    except (KeyError, TypeError, ValueError) as err:
        raise AnsibleFilterError(f"vllm_fleet_doctor_node: malformed result ({type(err).__name__}: {err})") from err


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_doctor_node": vllm_fleet_doctor_node}
