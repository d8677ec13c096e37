"""A multi-model plan as a KubeRay RayService: the Ray Serve LLM application the plan already
renders (vllm_fleet/deploy/rayserve.py) as its ``serveConfigV2``, on a Ray cluster with a
CPU-only head and one worker group per GPU model and count of the plan's nodes, each
pinned to its GPU product by label."""

from __future__ import annotations

from collections import Counter
from typing import Any

import yaml

from vllm_fleet.deploy.rayserve import RAY_VERSION, serve_config
from vllm_fleet.errors import PlanError
from vllm_fleet.kube.options import PRODUCT_LABEL, KubeOptions
from vllm_fleet.kube.pods import HF_CACHE
from vllm_fleet.kube.workloads import PART_OF, labels, slug

SERVE_PORT = 8000


def _env(opts: KubeOptions) -> list[dict[str, Any]]:
    if not opts.hf_token_secret:
        return []
    return [{"name": "HF_TOKEN", "valueFrom": KubeOptions.secret_ref(opts.hf_token_secret, "token")}]


POD_LABELS = {"app.kubernetes.io/component": "ray-serve"}


def network_policy(opts: KubeOptions) -> dict[str, Any]:
    """The Ray pods reach each other on every port (GCS, raylets, object store); from elsewhere in
    the namespace only Serve's port: the dashboard and the GCS accept jobs, that is, code."""
    mine = {PART_OF: opts.name, **POD_LABELS}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{opts.name}-ray-serve",
            "namespace": opts.namespace,
            "labels": labels(opts, "ray-serve"),
        },
        "spec": {
            "podSelector": {"matchLabels": mine},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": mine}}]},
                {"from": [{"podSelector": {}}], "ports": [{"port": SERVE_PORT, "protocol": "TCP"}]},
            ],
        },
    }


def ray_service(plan: dict[str, Any], opts: KubeOptions) -> tuple[dict[str, Any], list[str]]:
    if not opts.ray_image:
        raise PlanError(
            "--ray-image",
            "a RayService needs a Ray image with ray[serve,llm] and vLLM",
            f"pass --ray-image (e.g. a rayproject/ray-llm image of Ray {RAY_VERSION})",
        )
    if opts.api_key_secret:
        raise PlanError(
            "--api-key-secret",
            "Ray Serve LLM's OpenAI app takes no vLLM API key: the key would be dropped",
            "put an authenticating proxy in front of the Serve Service, and drop --api-key-secret",
        )
    if opts.model_pvc or opts.model_host_path:
        raise PlanError(
            "--ray-service", "serves each model by its Hub name (model_source)", "drop --model-pvc / --model-host-path"
        )
    config, notes = serve_config(plan)
    used = {n for i in plan["instances"] for n in i["nodes"]}
    groups = Counter((str(n["gpu"]), int(n["gpu_count"])) for n in plan["nodes"] if n["name"] in used)
    products = opts.products()
    cache = [{"name": "hf-cache", "mountPath": HF_CACHE}]
    volumes = [{"name": "hf-cache", "emptyDir": {}}, {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    shm = [{"name": "dshm", "mountPath": "/dev/shm"}]
    workers = []
    for (gpu, count), nodes in sorted(groups.items()):
        spec: dict[str, Any] = {
            "containers": [
                {
                    "name": "ray-worker",
                    "image": opts.ray_image,
                    "env": _env(opts),
                    "resources": {"limits": {"nvidia.com/gpu": str(count)}},
                    "volumeMounts": cache + shm,
                }
            ],
            "volumes": volumes,
        }
        if gpu in products:
            spec["nodeSelector"] = {PRODUCT_LABEL: products[gpu]}
        elif len(groups) > 1:
            raise PlanError(
                "--gpu-product", f"{gpu}'s {PRODUCT_LABEL} label is not known here", f"pass --gpu-product {gpu}=LABEL"
            )
        workers.append(
            {
                "groupName": slug(f"{gpu}-x{count}", 30),
                "replicas": nodes,
                "minReplicas": nodes,
                "maxReplicas": nodes,
                "rayStartParams": {},
                "template": {"metadata": {"labels": {PART_OF: opts.name, **POD_LABELS}}, "spec": spec},
            }
        )
    head = {
        "rayStartParams": {"num-gpus": "0"},
        "template": {
            "metadata": {"labels": {PART_OF: opts.name, **POD_LABELS}},
            "spec": {
                "containers": [
                    {
                        "name": "ray-head",
                        "image": opts.ray_image,
                        "env": _env(opts),
                        "ports": [
                            {"name": "gcs", "containerPort": 6379},
                            {"name": "dashboard", "containerPort": 8265},
                            {"name": "serve", "containerPort": SERVE_PORT},
                        ],
                        "volumeMounts": cache,
                    }
                ],
                "volumes": volumes[:1],
            },
        },
    }
    service = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": f"{opts.name}-serve", "namespace": opts.namespace, "labels": labels(opts, "ray-serve")},
        "spec": {
            "serveConfigV2": yaml.safe_dump(config, sort_keys=False),
            "rayClusterConfig": {"rayVersion": RAY_VERSION, "headGroupSpec": head, "workerGroupSpecs": workers},
        },
    }
    return service, notes
