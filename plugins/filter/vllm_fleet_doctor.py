"""Ansible filter vllm_fleet_doctor: the doctor's verdict on a bundle.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_doctor``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.ops import doctor

DOCUMENTATION = r"""
name: vllm_fleet_doctor
short_description: "The doctor's verdict on a bundle"
version_added: 0.1.0
author: vllm-fleet
description:
  - "Every check of C(vllm_fleet/ops/doctor.py) on the gathered bundle: the same bundle gives the same
    verdict on a laptop."
options:
  _input:
    description:
      - "The bundle (every node's part)."
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: The verdict
  ansible.builtin.set_fact:
    __verdict: "{{ __bundle | vllm_fleet_doctor }}"
"""

RETURN = r"""
_value:
  description: "C({ok, checks: [{name, status, detail, fix}], lines})."
  type: dict
"""


def vllm_fleet_doctor(bundle: dict[str, Any]) -> Any:
    try:
        checks = doctor.evaluate(bundle)
    except doctor.BundleError as err:
        raise AnsibleFilterError(f"vllm_fleet_doctor: {err}") from err
    return {
        "ok": doctor.exit_code(checks) == 0,
        "checks": [vars(c) for c in checks],
        "lines": doctor.render(checks).splitlines(),
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_doctor": vllm_fleet_doctor}
