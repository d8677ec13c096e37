"""Ansible filter vllm_fleet_preview_node: one node's share of the preview.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_preview_node``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.inventory import hostvars as inventory
from vllm_fleet.ops import preview

DOCUMENTATION = r"""
name: vllm_fleet_preview_node
short_description: "One node's share of the preview"
version_added: 0.1.0
author: vllm-fleet
description:
  - "The node's planned state, the records read on it and the inputs a laptop plans again with
    (C(vllm_fleet/ops/preview.py) node_part)."
  - "The API key and Hub token in C(options) are hashed here and never returned."
positional: applied, options
options:
  _input:
    description:
      - "The node's record."
    type: dict
    required: true
  applied:
    description:
      - "The records read on the node: the slurp results, or their parsed dict."
    type: raw
    required: true
  options:
    description:
      - "The inputs the preview keeps."
    type: dict
    required: false
"""

EXAMPLES = r"""
- name: This node's part
  ansible.builtin.set_fact:
    __part: "{{ vllm_fleet_node | vllm_fleet_preview_node(__slurped.results, __options) }}"
"""

RETURN = r"""
_value:
  description: "The node's part."
  type: dict
"""


def vllm_fleet_preview_node(
    record: dict[str, Any], applied: dict[str, Any] | list[Any], options: dict[str, Any] | None = None
) -> Any:
    found = inventory.applied_files(applied) if isinstance(applied, list) else dict(applied or {})
    try:
        return preview.node_part(dict(record), found, dict(options or {}))
    except (KeyError, TypeError, ValueError) as err:
        raise AnsibleFilterError(f"vllm_fleet_preview_node: malformed input ({type(err).__name__}: {err})") from err


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_preview_node": vllm_fleet_preview_node}
