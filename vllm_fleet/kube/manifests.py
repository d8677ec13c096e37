"""All of a plan's Kubernetes objects, and the YAML stream ``kubectl apply -f`` takes.

``manifests(plan, options)`` renders a plan (``vllm-fleet plan --json``, an inventory run's
artifacts/plan.json, or a multi-model plan) as: the Namespace; per multi-node instance a
LeaderWorkerSet, per group of alike single-node instances a Deployment; a Service per model
and a NetworkPolicy; the gateway when the plan puts one in front; the ServiceMonitors and
the PrometheusRule. With ``ray_service`` a multi-model plan becomes a KubeRay RayService
instead. Secrets are referenced by name; no value is ever read or written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from vllm_fleet.deploy.deployment import instance_served_name
from vllm_fleet.errors import PlanError
from vllm_fleet.kube.gateway import gateway
from vllm_fleet.kube.monitoring import monitoring
from vllm_fleet.kube.options import KubeOptions
from vllm_fleet.kube.rayservice import network_policy as ray_network_policy
from vllm_fleet.kube.rayservice import ray_service
from vllm_fleet.kube.workloads import service_name, slug, workloads


def _check(plan: Any) -> dict[str, Any]:
    if not isinstance(plan, dict) or not isinstance(plan.get("instances"), list) or not plan["instances"]:
        raise PlanError(
            "--plan", "holds no planned instances", "pass the JSON of `vllm-fleet plan --json` or artifacts/plan.json"
        )
    return plan


def manifests(
    plan: dict[str, Any], opts: KubeOptions, given: Mapping[str, Mapping[str, Any]] | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every object, in the order ``kubectl apply`` creates them, and notes on what changed meaning.
    ``given``: each node's serving options from its inventory (``-i``), none from a plan file."""
    plan = _check(plan)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": opts.namespace}}
    if opts.ray_service:
        if plan.get("strategy") != "models":
            raise PlanError("--ray-service", "renders a multi-model plan", "plan with --models FILE.yml")
        rs, notes = ray_service(plan, opts)
        return [namespace, rs, ray_network_policy(opts)], notes
    objects, notes = workloads(plan, opts, given)
    served = {instance_served_name(i): slug(instance_served_name(i), 50) for i in plan["instances"]}
    front = bool((plan.get("gateway") or {}).get("enabled"))
    if front:
        routes = [(name, service_name(model, opts)) for name, model in served.items()]
        objects += gateway(routes, opts)
    else:
        notes.append("no gateway: the plan has one instance; clients use the model's Service")
    objects += monitoring(opts, front)
    seen: dict[tuple[str, str], int] = {}
    for obj in objects:
        key = (obj["kind"], obj["metadata"]["name"])
        seen[key] = seen.get(key, 0) + 1
    twice = sorted(f"{k} {n}" for (k, n), count in seen.items() if count > 1)
    if twice:
        raise PlanError(
            "kubernetes", f"two objects would share a name: {', '.join(twice)}", "give the models distinct served names"
        )
    return [namespace, *objects], notes


class _Dumper(yaml.SafeDumper):
    """Each value written out where it stands: no YAML anchors and aliases for repeated parts."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(objects: list[dict[str, Any]], header: str = "") -> str:
    body = "---\n".join(yaml.dump(o, Dumper=_Dumper, sort_keys=False, width=120) for o in objects)
    return header + "---\n" + body
