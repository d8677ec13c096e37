"""Ansible filter vllm_fleet_verify_rows: the verify probe's results joined with vLLM's KV reports.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_verify_rows``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.deploy import serve

DOCUMENTATION = r"""
name: vllm_fleet_verify_rows
short_description: "The verify probe's results joined with vLLM's KV reports"
version_added: 0.1.0
author: vllm-fleet
description:
  - "One row per planned instance: health, models, a completion, KV tokens and blocks against the plan."
positional: reports
options:
  _input:
    description:
      - "The probe's results."
    type: list
    required: true
    elements: dict
  reports:
    description:
      - "The serve phase's KV reports."
    type: list
    required: true
    elements: dict
"""

EXAMPLES = r"""
- name: The rows
  ansible.builtin.set_fact:
    __rows: "{{ __probes | vllm_fleet_verify_rows(__reports) }}"
"""

RETURN = r"""
_value:
  description: "The rows."
  type: list
"""


def vllm_fleet_verify_rows(probes: list[dict[str, Any]], reports: list[dict[str, Any]]) -> Any:
    return serve.verify_rows(probes, reports)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_verify_rows": vllm_fleet_verify_rows}
