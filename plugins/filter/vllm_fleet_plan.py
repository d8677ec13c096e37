"""Ansible filter vllm_fleet_plan: choose the vLLM layout of a model on a cluster.

A thin adapter: every decision is the vllm_fleet package's (``ansible-doc -t filter vllm_fleet_plan``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# A checkout's plugin plans with the checkout's own package, before any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.errors import PlanError, for_inventory
from vllm_fleet.inventory import hostvars as inventory
from vllm_fleet.model.spec import load_model
from vllm_fleet.planning.cluster import cluster_from_data
from vllm_fleet.planning.strategy import Wishes, plan_cluster

DOCUMENTATION = r"""
name: vllm_fleet_plan
short_description: "Choose the vLLM layout of a model on a cluster"
version_added: 0.1.0
author: vllm-fleet
description:
  - "Calls C(vllm_fleet.planning.strategy.plan_cluster) with the nodes and the operator's wishes."
  - "Fails with the planner's one-line reason (field and fix) when the request cannot work."
positional: model
options:
  _input:
    description:
      - "Nodes, a list of C({name, gpu, gpu_count}) with optional C(gpu_memory_gib), C(nvlink), C(nic_gbps),
        C(address), C(interface)."
    type: list
    required: true
    elements: dict
  model:
    description:
      - "Model folder with config.json, or a catalog name."
    type: str
    required: true
  wishes:
    description:
      - "Every option vllm_fleet/schema.py declares (the inventory's vllm_fleet_<name> without the prefix,
        checked as the inventory variable is), and strategies, model_ref, served_model_name, port,
        ray_available, extra_env (the environment vLLM runs with, which its start-up checks read, e.g.
        VLLM_ALLOW_LONG_MAX_MODEL_LEN), extra_args (the vllm serve arguments every node adds, e.g. --allow-
        deprecated-quantization)."
    type: dict
    required: false
"""

EXAMPLES = r"""
- name: Plan the deployment
  ansible.builtin.set_fact:
    vllm_fleet_plan_result: "{{ nodes | vllm_fleet_plan(vllm_fleet_model, {'max_model_len': 32768}) }}"
"""

RETURN = r"""
_value:
  description: "The plan, as C(vllm-fleet plan --json) prints it (instances, rejected, gateway, warnings)."
  type: dict
"""


def vllm_fleet_plan(nodes: Any, model: str, wishes: dict[str, Any] | None = None) -> Any:
    try:
        spec = load_model(str(model))
        cluster = cluster_from_data(list(nodes) if not isinstance(nodes, dict) else nodes)
        return plan_cluster(spec, cluster, Wishes(**inventory.clean_wishes(wishes)))
    except inventory.InventoryError as err:
        raise AnsibleFilterError(f"vllm_fleet_plan: {err}") from err
    except PlanError as err:
        raise AnsibleFilterError(f"vllm_fleet_plan: {for_inventory(err)}") from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_plan": vllm_fleet_plan}
