"""Ansible filter vllm_fleet_nccl_check: nCCL's transports in a log against what the node's facts promise.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_nccl_check``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.ops import nccl

DOCUMENTATION = r"""
name: vllm_fleet_nccl_check
short_description: "NCCL's transports in a log against what the node's facts promise"
version_added: 0.1.0
author: vllm-fleet
description:
  - "Parses an C(NCCL_DEBUG=INFO) log (C(vllm_fleet/ops/nccl.py)) and checks its transports against the
    node's gpu_facts."
  - "C(ok) is false only when NCCL fell back to sockets on a node with an active InfiniBand or RoCE port."
positional: facts, node
options:
  _input:
    description:
      - "The log (a rank's output with C(NCCL_DEBUG=INFO))."
    type: str
    required: true
  facts:
    description:
      - "The node's C(gpu_facts_found)."
    type: dict
    required: false
  node:
    description:
      - "The node's name, for the check's detail."
    type: str
    required: false
"""

EXAMPLES = r"""
- name: Check NCCL's transport on this node
  ansible.builtin.set_fact:
    __nccl: "{{ __rank_log.stdout | vllm_fleet_nccl_check(gpu_facts_found, inventory_hostname) }}"
"""

RETURN = r"""
_value:
  description: "C({ok, transport: {inter_node, gdrdma, intra_node, ...}, check: {name, status, detail, fix}})."
  type: dict
"""


def vllm_fleet_nccl_check(log: str, facts: dict[str, Any] | None = None, node: str = "") -> Any:
    if facts is not None and not isinstance(facts, dict):
        raise AnsibleFilterError("vllm_fleet_nccl_check: facts must be the node's gpu_facts dict")
    return nccl.verdict(str(log or ""), dict(facts or {}), str(node or ""))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_nccl_check": vllm_fleet_nccl_check}
