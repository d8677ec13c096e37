"""The serving workloads: a Deployment per group of alike single-node instances, a
LeaderWorkerSet per multi-node instance (group size = its nodes, restarted as one), a
Service per model over the pods that answer HTTP, and NetworkPolicies that let only the
gateway and Prometheus reach vLLM's port, and a group's pods reach each other.

Names are stable across re-plans and unique: a readable part and a short hash of what makes
the object itself (a Deployment's model, GPU and arguments; a LeaderWorkerSet's instance)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from vllm_fleet.deploy import serve
from vllm_fleet.deploy.deployment import instance_served_name
from vllm_fleet.deploy.records import looks_secret
from vllm_fleet.errors import PlanError
from vllm_fleet.kube.options import GPU_RESOURCE, PRODUCT_LABEL, KubeOptions
from vllm_fleet.kube.pods import (
    CPU_PER_RANK,
    HF_CACHE,
    HOST_GIB,
    MODEL_MOUNT,
    PORT,
    PROBE_PERIOD_S,
    Part,
    part_of,
    shm_gib,
    startup_failures,
)

PART_OF = "app.kubernetes.io/part-of"
COMPONENT = "app.kubernetes.io/component"
MODEL_LABEL = "vllm-fleet.io/model"
SERVES_LABEL = "vllm-fleet.io/serves"
WORKLOAD_LABEL = "vllm-fleet.io/workload"


def slug(text: str, limit: int = 40) -> str:
    """A DNS label from ``text``: lowercase, [a-z0-9-], starting with a letter, at most ``limit``."""
    out = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    out = out if out[:1].isalpha() else f"m-{out}"
    return out[:limit].rstrip("-") or "m"


def name_of(*parts: str, key: str = "", limit: int = 45) -> str:
    """A DNS label: the readable ``parts`` cut to fit, then a hash of ``key`` (or of the parts)
    so that two objects whose readable parts agree still differ."""
    digest = hashlib.sha256((key or "/".join(parts)).encode()).hexdigest()[:6]
    return f"{slug('-'.join(parts), limit - 7)}-{digest}"


def labels(opts: KubeOptions, component: str, **extra: str) -> dict[str, str]:
    return {PART_OF: opts.name, COMPONENT: component, **extra}


def model_path(inst: dict[str, Any], opts: KubeOptions) -> str | None:
    """The model's path in the pod (the volume's mount), or None: vLLM fetches the Hub name."""
    model = str(inst.get("model") or inst["vllm_args"][1])
    if opts.model_pvc or opts.model_host_path:
        # The volume holds one folder per model, named as the model's last path part.
        return f"{MODEL_MOUNT}/{model.rstrip('/').rsplit('/', 1)[-1]}"
    if model.startswith("/") or model.startswith("."):
        raise PlanError(
            "--model-pvc",
            f"the model {model} is a folder on this machine, which no pod can read",
            "put it on a volume and pass --model-pvc NAME (or --model-host-path PATH on every node)",
        )
    return None


def serve_options(node: str, given: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """``node``'s serving options (vllm_fleet/deploy/serve.py ServeOptions: trust_remote_code, the
    parsers, extra_args, extra_env, ...), as its inventory gives them; none from a bare plan."""
    mine = {k: v for k, v in dict((given or {}).get(node) or {}).items() if v is not None}
    for name in dict(mine.get("extra_env") or {}):
        # A secret must come from a Secret: a manifest holds env values in plain text.
        if looks_secret(str(name)):
            raise PlanError(
                f"vllm_fleet_extra_env of {node}",
                f"{name} looks like a secret, and a manifest holds environment values in plain text",
                "give it through a Secret (--api-key-secret, --hf-token-secret), not vllm_fleet_extra_env",
            )
    return mine


def parts_of(
    inst: dict[str, Any], opts: KubeOptions, gpus: dict[str, str], given: Mapping[str, Mapping[str, Any]] | None = None
) -> list[Part]:
    """Every node's pod template of ``inst`` (leader first), from its planned launches with the
    node's serving options (``given``, per node); ``gpus``: each plan node's GPU."""
    nodes = list(dict.fromkeys(s["node"] for s in inst["stages"]))
    path = model_path(inst, opts)
    out = []
    for node in nodes:
        options = serve_options(node, given)
        if path:
            options["model"] = path
        mine = serve.launches([inst], node, options)
        gpu = gpus.get(node) or str(inst.get("gpu") or "")
        out.append(part_of(inst, mine[0] if mine else None, node, gpu, rdma=opts.rdma() is not None))
    return out


def _product(gpu: str, device: str, opts: KubeOptions, mixed: bool) -> dict[str, str]:
    if device == "cpu":
        return {}
    label = opts.products().get(gpu)
    if label:
        return {PRODUCT_LABEL: label}
    if mixed:
        raise PlanError(
            "--gpu-product",
            f"the plan places stages on {gpu}, whose {PRODUCT_LABEL} label is not known here",
            f"pass --gpu-product {gpu}=<the label GPU feature discovery gives those nodes>",
        )
    return {}


def container(part: Part, opts: KubeOptions, version: str, probes: bool) -> dict[str, Any]:
    env: list[dict[str, Any]] = []
    if part.field_env:
        env += [{"name": n, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} for n in part.field_env]
    env += [{"name": k, "value": str(v)} for k, v in sorted(part.env.items())]
    if opts.api_key_secret and part.serves:
        env.append({"name": "VLLM_API_KEY", "valueFrom": KubeOptions.secret_ref(opts.api_key_secret, "api-key")})
    if opts.hf_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": KubeOptions.secret_ref(opts.hf_token_secret, "token")})
    limits: dict[str, str] = {}
    if part.device != "cpu":
        limits[GPU_RESOURCE.get(part.device, "nvidia.com/gpu")] = str(part.gpus)
    rdma = opts.rdma()
    if rdma and part.device != "cpu":
        limits[rdma[0]] = str(rdma[1])
    # Requested, so the pod is not the first evicted: vLLM's host process and the memory-backed /dev/shm.
    requests = {"cpu": str(CPU_PER_RANK * max(1, part.gpus)), "memory": f"{shm_gib(part) + HOST_GIB}Gi"}
    out: dict[str, Any] = {
        "name": "vllm",
        "image": opts.image or f"vllm/vllm-openai:v{version}",
        "command": part.command,
        "args": part.args,
        "env": env,
        "resources": {"requests": requests, **({"limits": limits} if limits else {})},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, _model_mount(opts)],
    }
    if rdma:
        out["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    if part.serves:
        out["ports"] = [{"name": "http", "containerPort": PORT}]
    if probes and part.serves:
        health = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": 5}
        out["startupProbe"] = {**health, "failureThreshold": startup_failures(part, opts.load_gib_per_s)}
        out["readinessProbe"] = {**health, "failureThreshold": 3}
        out["livenessProbe"] = {**health, "periodSeconds": 30, "timeoutSeconds": 10, "failureThreshold": 5}
    return out


def _model_mount(opts: KubeOptions) -> dict[str, Any]:
    if opts.model_pvc or opts.model_host_path:
        return {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}
    return {"name": "model", "mountPath": HF_CACHE}


def pod_spec(part: Part, opts: KubeOptions, version: str, mixed: bool) -> dict[str, Any]:
    if opts.model_pvc:
        model: dict[str, Any] = {"persistentVolumeClaim": {"claimName": opts.model_pvc, "readOnly": True}}
    elif opts.model_host_path:
        model = {"hostPath": {"path": opts.model_host_path, "type": "Directory"}}
    else:
        model = {"emptyDir": {}}  # vLLM fetches the Hub name into the pod
    spec: dict[str, Any] = {
        "containers": [container(part, opts, version, probes=True)],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib(part)}Gi"}},
            {"name": "model", **model},
        ],
        # vLLM drains its running requests on SIGTERM.
        "terminationGracePeriodSeconds": 60,
    }
    selector = _product(part.gpu, part.device, opts, mixed)
    if selector:
        spec["nodeSelector"] = selector
    return spec


def _meta(name: str, opts: KubeOptions, lab: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": opts.namespace, "labels": lab}


def deployment(name: str, parts: list[Part], replicas: int, model: str, opts: KubeOptions, version: str,
               mixed: bool) -> dict[str, Any]:  # fmt: skip
    lab = labels(opts, "vllm", **{MODEL_LABEL: model, WORKLOAD_LABEL: name})
    pod_labels = {**lab, SERVES_LABEL: "true"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, opts, lab),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {PART_OF: opts.name, WORKLOAD_LABEL: name}},
            # One replica at a time, replaced in place: the plan uses the GPUs a surge pod would need.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec(parts[0], opts, version, mixed)},
        },
    }


def leader_worker_set(name: str, parts: list[Part], model: str, opts: KubeOptions, version: str,
                      mixed: bool, inst: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    leader, workers = parts[0], parts[1:]
    for w in workers[1:]:
        if w.key() != workers[0].key():
            what = "GPU" if w.gpu != workers[0].gpu else "GPU count" if w.gpus != workers[0].gpus else "arguments"
            raise PlanError(
                "kubernetes",
                f"{inst['name']}: its worker nodes differ in {what}, and a LeaderWorkerSet gives all "
                "workers one pod template (only the leader has its own)",
                "plan it on worker nodes of one GPU model and count (the leader's may differ), or serve it "
                "with Ansible",
            )
    lab = labels(opts, "vllm", **{MODEL_LABEL: model, WORKLOAD_LABEL: name})
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": _meta(name, opts, lab),
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": len(parts),
                # Any pod's restart recreates the whole group, as the group wrapper does on the nodes.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": {**lab, SERVES_LABEL: "true"}},
                    "spec": pod_spec(leader, opts, version, mixed),
                },
                "workerTemplate": {
                    "metadata": {"labels": {**lab, SERVES_LABEL: "false"}},
                    "spec": pod_spec(workers[0], opts, version, mixed),
                },
            },
        },
    }


def service_name(model: str, opts: KubeOptions) -> str:
    plain = f"{opts.name}-{model}"
    return plain if len(plain) <= 63 else name_of(opts.name, model, limit=63)


def service(model: str, opts: KubeOptions) -> dict[str, Any]:
    lab = labels(opts, "vllm", **{MODEL_LABEL: model})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(service_name(model, opts), opts, lab),
        "spec": {
            "selector": {PART_OF: opts.name, MODEL_LABEL: model, SERVES_LABEL: "true"},
            "ports": [{"name": "http", "port": PORT, "targetPort": "http"}],
        },
    }


# Prometheus's own pods (the Prometheus Operator labels them so), in the monitoring namespace.
PROMETHEUS_PODS = {"app.kubernetes.io/name": "prometheus"}


def _policy(name: str, opts: KubeOptions, selector: dict[str, str], ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(name, opts, labels(opts, "vllm")),
        "spec": {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def network_policy(opts: KubeOptions) -> dict[str, Any]:
    """vLLM's port takes connections from the gateway's pods and Prometheus's only (vLLM checks
    an API key on /v1 alone: /metrics, /invocations and the rest are open to whoever connects);
    the kubelet's probes are not subject to it."""
    port = [{"port": PORT, "protocol": "TCP"}]
    monitoring = {"kubernetes.io/metadata.name": opts.monitoring_namespace}
    return _policy(
        f"{opts.name}-vllm",
        opts,
        {PART_OF: opts.name, COMPONENT: "vllm"},
        [
            {"from": [{"podSelector": {"matchLabels": {PART_OF: opts.name, COMPONENT: "gateway"}}}], "ports": port},
            {
                "from": [
                    {"namespaceSelector": {"matchLabels": monitoring}, "podSelector": {"matchLabels": PROMETHEUS_PODS}}
                ],
                "ports": port,
            },
        ],
    )


def group_policy(name: str, opts: KubeOptions) -> dict[str, Any]:
    """A multi-node group's pods reach each other on every port (torch.distributed, NCCL, Ray)."""
    group = {PART_OF: opts.name, WORKLOAD_LABEL: name}
    return _policy(f"{name}-group", opts, group, [{"from": [{"podSelector": {"matchLabels": group}}]}])


def workloads(
    plan: dict[str, Any], opts: KubeOptions, given: Mapping[str, Mapping[str, Any]] | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """The plan's instances as workloads, a Service per model and the NetworkPolicies; and notes.
    ``given``: each node's serving options from its inventory (none from a bare plan)."""
    version = str(plan.get("vllm_version") or "")
    notes: list[str] = []
    gpus = {str(n["name"]): str(n.get("gpu") or "") for n in plan.get("nodes") or []}
    # Several GPU models in the cluster: every pod must land on the one the plan sized it for.
    mixed = len(set(gpus.values()) | {str(i.get("gpu") or "") for i in plan["instances"]}) > 1
    singles: dict[tuple[Any, ...], list[tuple[str, list[Part]]]] = {}
    objects: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    models: list[str] = []
    for inst in plan["instances"]:
        model = slug(instance_served_name(inst), 50)
        models += [model] if model not in models else []
        if inst.get("executor") == "ray" and not opts.image:
            raise PlanError(
                "--image",
                f"{inst['name']}: the plan chose the Ray executor, and vllm/vllm-openai:v{version} holds no Ray",
                "pass --image with an image that has vLLM and Ray, or plan with --multinode-backend native "
                "(vllm_fleet_multinode_backend: native)",
            )
        if inst.get("device") == "cpu" and not opts.image:
            raise PlanError(
                "--image",
                f"{inst['name']} runs on CPUs: vllm/vllm-openai is a CUDA image",
                "pass --image (a vLLM CPU build)",
            )
        parts = parts_of(inst, opts, gpus, given)
        if len(parts) > 1:
            name = name_of(opts.name, str(inst["name"]), key=str(inst["name"]))
            objects.append(leader_worker_set(name, parts, model, opts, version, mixed, inst))
            groups.append(group_policy(name, opts))
            continue
        singles.setdefault((model, parts[0].key()), []).append((inst["name"], parts))
    for (model, key), group in singles.items():
        parts = group[0][1]
        name = name_of(opts.name, model, parts[0].gpu or "cpu", key=repr((model, key)))
        objects.append(deployment(name, parts, len(group), model, opts, version, mixed))
        if len(group) > 1:
            notes.append(f"{name}: {len(group)} replicas of {', '.join(n for n, _ in group)} (alike: one Deployment)")
    if any(i.get("device") == "cpu" for i in plan["instances"]):
        notes.append("CPU instances: no VLLM_CPU_OMP_THREADS_BIND (the pod's cores are the kubelet's to pick)")
    if not given:
        notes.append(
            "serving options from an inventory (trust_remote_code, parsers, extra_args, extra_env) come with -i; "
            "a plan file holds the planned arguments only"
        )
    objects += [service(m, opts) for m in models]
    objects += [network_policy(opts), *groups]
    return objects, notes
