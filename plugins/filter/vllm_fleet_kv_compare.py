"""Ansible filter vllm_fleet_kv_compare: reported KV tokens against the plan's.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_kv_compare``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.deploy import serve

DOCUMENTATION = r"""
name: vllm_fleet_kv_compare
short_description: "Reported KV tokens against the plan's"
version_added: 0.1.0
author: vllm-fleet
description:
  - "Reported / predicted KV tokens with a verdict: match within 5 %, over, under, or unknown."
positional: reported
options:
  _input:
    description:
      - "The plan's KV tokens."
    type: int
    required: true
  reported:
    description:
      - "vLLM's, or null when it reported none."
    type: int
    required: true
"""

EXAMPLES = r"""
- name: Compare
  ansible.builtin.set_fact:
    __kv_verdict: "{{ instance.kv_tokens | vllm_fleet_kv_compare(__kv.tokens | default(none)) }}"
"""

RETURN = r"""
_value:
  description: "C({predicted, reported, ratio, verdict})."
  type: dict
"""


def vllm_fleet_kv_compare(predicted: int, reported: int | None) -> Any:
    return serve.compare(int(predicted), None if reported is None else int(reported))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_kv_compare": vllm_fleet_kv_compare}
