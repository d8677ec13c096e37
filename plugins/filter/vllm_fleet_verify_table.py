"""Ansible filter vllm_fleet_verify_table: the verify playbook's summary table.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_verify_table``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.deploy import serve

DOCUMENTATION = r"""
name: vllm_fleet_verify_table
short_description: "The verify playbook's summary table"
version_added: 0.1.0
author: vllm-fleet
description:
  - "The rows of vllm_fleet_verify_rows as a table a person reads."
options:
  _input:
    description:
      - "The rows."
    type: list
    required: true
    elements: dict
"""

EXAMPLES = r"""
- name: Show the verdict
  ansible.builtin.debug:
    msg: "{{ __rows | vllm_fleet_verify_table }}"
"""

RETURN = r"""
_value:
  description: "The table."
  type: str
"""


def vllm_fleet_verify_table(rows: list[dict[str, Any]]) -> Any:
    return serve.verify_table(rows)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_verify_table": vllm_fleet_verify_table}
