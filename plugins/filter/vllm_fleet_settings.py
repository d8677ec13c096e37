"""Ansible filter vllm_fleet_settings: every node's declared vllm_fleet_* values, typed and checked.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_settings``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.inventory import hostvars as inventory

DOCUMENTATION = r"""
name: vllm_fleet_settings
short_description: "Every node's declared vllm_fleet_* values, typed and checked"
version_added: 0.1.0
author: vllm-fleet
description:
  - "Resolves each node's C(vllm_fleet_*) variables (C(vllm_fleet/inventory/interface.py), declared in
    C(vllm_fleet/schema.py)) with their defaults and checks."
  - "Fails with one line naming the host, the field and the fix; unknown C(vllm_fleet_*) names become
    warnings."
  - "Never returns a secret: C(api_key) is only whether the deployment has one."
positional: nodes
options:
  _input:
    description:
      - "Ansible's C(hostvars)."
    type: dict
    required: true
  nodes:
    description:
      - "The inventory names of the nodes, the first one's values are the deployment's."
    type: list
    required: true
    elements: str
  api_key:
    description:
      - "Whether an API key reaches the deployment from anywhere (Vault, C($VLLM_API_KEY))."
    type: bool
    required: false
    default: false
  playbook_dir:
    description:
      - "The playbooks' folder: C(artifacts/) is next to it unless C(vllm_fleet_artifacts_dir) is set."
    type: str
    required: false
    default: playbooks
"""

EXAMPLES = r"""
- name: Read every node's settings
  ansible.builtin.set_fact:
    vllm_fleet_settings: "{{ hostvars | vllm_fleet_settings(groups['vllm_nodes'], __has_key, playbook_dir) }}"
"""

RETURN = r"""
_value:
  description: "C({nodes: {name: settings}, artifacts, extra_hosts, role_vars, warnings, wishes})."
  type: dict
"""


def vllm_fleet_settings(hostvars: Any, nodes: list[str], api_key: bool = False, playbook_dir: str = "playbooks") -> Any:
    try:
        return inventory.settings_of(hostvars, list(nodes), bool(api_key), str(playbook_dir))
    except inventory.InventoryError as err:
        raise AnsibleFilterError(str(err)) from err


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_settings": vllm_fleet_settings}
