"""Monitoring for the Prometheus Operator: ServiceMonitors that scrape what the monitoring
role scrapes on the nodes, under the same job names and labels (vllm: every serving pod's
/metrics with ``vllm_instance`` and ``model``; gateway: the nginx exporter), and a
PrometheusRule holding the monitoring role's alert rules whose jobs exist here."""

from __future__ import annotations

import re
from typing import Any

import yaml

from vllm_fleet.deploy.deployment import ROLES
from vllm_fleet.kube.options import KubeOptions
from vllm_fleet.kube.workloads import MODEL_LABEL, PART_OF, labels

RULES = ROLES / "monitoring" / "files" / "rules" / "vllm-fleet.rules.yml"
# Node and GPU exporters are the cluster's (kube-prometheus-stack, the GPU operator), under their own jobs.
JOBS = ("vllm", "gateway")
_JOB = re.compile(r'job="([^"]+)"')


def _monitor(name: str, component: str, port: str, job: str, opts: KubeOptions,
             relabel: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": name, "namespace": opts.namespace, "labels": labels(opts, component)},
        "spec": {
            "selector": {"matchLabels": {PART_OF: opts.name, "app.kubernetes.io/component": component}},
            "endpoints": [
                {
                    "port": port,
                    "path": "/metrics",
                    "interval": "15s",
                    "relabelings": [{"action": "replace", "targetLabel": "job", "replacement": job}, *relabel],
                }
            ],
        },
    }


def rules(opts: KubeOptions, jobs: tuple[str, ...] = JOBS) -> dict[str, Any]:
    """The alert rules as a PrometheusRule: those that read a job this rendering does not
    scrape (ray, node, dcgm's up) are left out; the rest are the monitoring role's, unchanged."""
    data = yaml.safe_load(RULES.read_text())
    groups = []
    for group in data["groups"]:
        kept = [r for r in group["rules"] if set(_JOB.findall(str(r.get("expr", "")))) <= set(jobs)]
        if kept:
            groups.append({**group, "rules": kept})
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": f"{opts.name}-alerts", "namespace": opts.namespace, "labels": labels(opts, "monitoring")},
        "spec": {"groups": groups},
    }


def monitoring(opts: KubeOptions, gateway: bool) -> list[dict[str, Any]]:
    vllm = _monitor(
        f"{opts.name}-vllm",
        "vllm",
        "http",
        "vllm",
        opts,
        [
            {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "vllm_instance"},
            {
                "action": "replace",
                "sourceLabels": [f"__meta_kubernetes_service_label_{re.sub(r'[^a-zA-Z0-9]', '_', MODEL_LABEL)}"],
                "targetLabel": "model",
            },
        ],
    )
    out = [vllm]
    if gateway:
        out.append(_monitor(f"{opts.name}-gateway", "gateway", "metrics", "gateway", opts, []))
    out.append(rules(opts, JOBS if gateway else ("vllm",)))
    return out
