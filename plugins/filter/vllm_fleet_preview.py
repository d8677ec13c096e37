"""Ansible filter vllm_fleet_preview: what applying the plan starts, restarts or stops.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_preview``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.errors import PlanError
from vllm_fleet.inventory import hostvars as inventory
from vllm_fleet.ops import preview

DOCUMENTATION = r"""
name: vllm_fleet_preview
short_description: "What applying the plan starts, restarts or stops"
version_added: 0.1.0
author: vllm-fleet
description:
  - "Every node's changes (C(vllm_fleet/ops/preview.py) report): what starts, restarts or stops, warnings, a
    summary, and the applied and planned states."
positional: gateways, wishes, gateway
options:
  _input:
    description:
      - "Every node's vllm_fleet_preview_node part."
    type: dict
    required: true
  gateways:
    description:
      - "What the gateway hosts recorded."
    type: dict
    required: false
  wishes:
    description:
      - "The deployment's wishes."
    type: dict
    required: false
  gateway:
    description:
      - "The deployment's gateway (vllm_fleet_deployment)."
    type: dict
    required: false
"""

EXAMPLES = r"""
- name: The preview
  ansible.builtin.set_fact:
    __preview: "{{ __parts | vllm_fleet_preview(__gateways, __wishes, vllm_fleet_deployment.gateway) }}"
"""

RETURN = r"""
_value:
  description: "C({changes, lines, warnings, summary, applied, planned})."
  type: dict
"""


def vllm_fleet_preview(
    parts: dict[str, Any],
    gateways: dict[str, Any] | None = None,
    wishes: dict[str, Any] | None = None,
    gateway: dict[str, Any] | None = None,
) -> Any:
    try:
        return preview.report(
            inventory.plain(parts),
            dict(gateways or {}),
            dict(wishes or {}),
            inventory.plain(gateway) if gateway else None,
        )
    except PlanError as err:
        raise AnsibleFilterError(f"vllm_fleet_preview: {err}") from err
    except (KeyError, TypeError, ValueError) as err:
        raise AnsibleFilterError(f"vllm_fleet_preview: malformed input ({type(err).__name__}: {err})") from err


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_preview": vllm_fleet_preview}
