"""Ansible filter vllm_fleet_role_digest: a role's digest for its applied-state record.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_role_digest``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.inventory import hostvars as inventory

DOCUMENTATION = r"""
name: vllm_fleet_role_digest
short_description: "A role's digest for its applied-state record"
version_added: 0.1.0
author: vllm-fleet
description:
  - "sha256 of a role's own files (tasks, templates, files with what is linked into them, vars, defaults;
    not its tests or docs)."
  - "Part of the inputs the role's applied-state record keeps: a changed role converges again on the next
    run even where its inputs are the same."
options:
  _input:
    description:
      - "The role's folder."
    type: path
    required: true
"""

EXAMPLES = r"""
- name: The role's digest
  ansible.builtin.set_fact:
    __digest: "{{ role_path | vllm_fleet_role_digest }}"
"""

RETURN = r"""
_value:
  description: "64 hex digits."
  type: str
"""


def vllm_fleet_role_digest(role_path: str) -> Any:
    return inventory.role_digest(str(role_path))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_role_digest": vllm_fleet_role_digest}
