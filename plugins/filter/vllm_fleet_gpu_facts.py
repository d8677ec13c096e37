"""Ansible filter vllm_fleet_gpu_facts: a host's GPUs, links, NICs and limits from raw command outputs.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_gpu_facts``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.inventory.facts import host_facts

DOCUMENTATION = r"""
name: vllm_fleet_gpu_facts
short_description: "A host's GPUs, links, NICs and limits from raw command outputs"
version_added: 0.1.0
author: vllm-fleet
description:
  - "Parses what the gpu_facts role gathered (nvidia-smi, topology, NICs, routes, limits) into one dict."
options:
  _input:
    description:
      - "The raw outputs, by name."
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Parse the facts
  ansible.builtin.set_fact:
    gpu_facts_found: "{{ __raw | vllm_fleet_gpu_facts }}"
"""

RETURN = r"""
_value:
  description: "C({gpu, gpu_count, gpu_memory_gib, nvlink, nic_gbps, infiniband, route_to_head, ...})."
  type: dict
"""


def vllm_fleet_gpu_facts(raw: dict[str, Any]) -> Any:
    if not isinstance(raw, dict):
        raise AnsibleFilterError("vllm_fleet_gpu_facts expects a dict of raw command outputs")
    return host_facts(raw)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_gpu_facts": vllm_fleet_gpu_facts}
