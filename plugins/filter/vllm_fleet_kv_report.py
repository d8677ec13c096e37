"""Ansible filter vllm_fleet_kv_report: what vLLM reported about its KV cache.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_kv_report``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.deploy import serve

DOCUMENTATION = r"""
name: vllm_fleet_kv_report
short_description: "What vLLM reported about its KV cache"
version_added: 0.1.0
author: vllm-fleet
description:
  - "The last C(KV cache size: N tokens, Maximum concurrency ...) line of a vLLM log, parsed."
options:
  _input:
    description:
      - "The log."
    type: str
    required: true
"""

EXAMPLES = r"""
- name: The KV report
  ansible.builtin.set_fact:
    __kv: "{{ __log.stdout | vllm_fleet_kv_report }}"
"""

RETURN = r"""
_value:
  description: "C({tokens, concurrency, ...}); empty when the log has no such line."
  type: dict
"""


def vllm_fleet_kv_report(log: str) -> Any:
    return serve.kv_report(str(log)) or {}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_kv_report": vllm_fleet_kv_report}
