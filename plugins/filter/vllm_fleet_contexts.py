"""Ansible filter vllm_fleet_contexts: what each node's record was computed with.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_contexts``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.inventory import hostvars as inventory

DOCUMENTATION = r"""
name: vllm_fleet_contexts
short_description: "What each node's record was computed with"
version_added: 0.1.0
author: vllm-fleet
description:
  - "Beside the plan and its settings: detected cores, whether the model is a folder here, role
    variables, addresses, the fabric."
  - "The preview keeps it, without secrets, for C(vllm-fleet plan --diff)."
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
- name: The records' contexts
  ansible.builtin.set_fact:
    __contexts: "{{ vllm_fleet_settings | vllm_fleet_contexts(hostvars) }}"
"""

RETURN = r"""
_value:
  description: "C({node: context})."
  type: dict
"""


def vllm_fleet_contexts(settings: dict[str, Any], hostvars: Any) -> Any:
    settings = inventory.plain(settings)
    return dict(inventory.plain(inventory.contexts(settings, hostvars, list(settings.get("nodes") or {}))))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_contexts": vllm_fleet_contexts}
