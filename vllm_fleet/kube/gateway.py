"""The gateway on Kubernetes: nginx with the routes of the Ansible gateway (one model: every
request to its Service; several: by the model a request's body names, with the llm_gateway
role's own njs script), its counters read by nginx-prometheus-exporter beside it, as a
Deployment, a ConfigMap and a Service."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from vllm_fleet.deploy.deployment import ROLES
from vllm_fleet.kube.options import KubeOptions
from vllm_fleet.kube.pods import PORT
from vllm_fleet.kube.workloads import PART_OF, labels

GATEWAY_PORT = 8080
EXPORTER_PORT = 9113
STATUS_PATH = "/vllm-fleet-nginx-status"
READY_PATH = "/vllm-fleet-gateway-ready"
ROUTE_JS = ROLES / "llm_gateway" / "templates" / "route.js.j2"
_PROXY = """            proxy_buffering off;
            proxy_cache off;"""


def route_js(models: list[str]) -> str:
    """The llm_gateway role's route.js with this gateway's models in place of its Jinja values."""
    text = ROUTE_JS.read_text()
    values = {
        "{{ ansible_managed }}": "written by vllm-fleet kubernetes",
        "{{ __llm_gateway_model_locations | to_json }}": json.dumps(
            {m: f"@vllm_fleet_model_{i}" for i, m in enumerate(models)}
        ),
        "{{ __llm_gateway_model_lists | to_json }}": json.dumps(
            [f"/_vllm_fleet/models/{i}" for i in range(len(models))]
        ),
    }
    for old, new in values.items():
        if old not in text:
            raise ValueError(f"{ROUTE_JS}: no {old} to fill in")
        text = text.replace(old, new)
    if "{{" in text or "{%" in text:
        raise ValueError(f"{ROUTE_JS}: a Jinja expression this renderer does not fill in")
    return text


def nginx_conf(routes: list[tuple[str, str]], namespace: str) -> str:
    """``routes``: (served model name, its Service's name) in the plan's order."""
    several = len(routes) > 1
    upstreams = "\n".join(
        f"    upstream vllm_fleet_model_{i} {{\n        server {svc}.{namespace}.svc:{PORT};\n"
        "        keepalive 32;\n    }"
        for i, (_, svc) in enumerate(routes)
    )
    if several:
        locations = """        location = /v1/models {
            js_content vllm_fleet.models;
        }

        location ~ ^/(v1|v2|inference|cohere)/ {
            js_content vllm_fleet.route;
        }
"""
        for i, (model, _) in enumerate(routes):
            locations += f"""
        # {model}
        location @vllm_fleet_model_{i} {{
{_PROXY}
            proxy_pass http://vllm_fleet_model_{i};
        }}

        location = /_vllm_fleet/models/{i} {{
            internal;
            proxy_pass http://vllm_fleet_model_{i}/v1/models;
        }}
"""
    else:
        locations = f"""        location ~ ^/(v1|v2|inference|cohere)/ {{
{_PROXY}
            proxy_pass http://vllm_fleet_model_0;
        }}
"""
    head = "load_module modules/ngx_http_js_module.so;\n" if several else ""
    js = "    js_import vllm_fleet from /etc/nginx/vllm-fleet/route.js;\n" if several else ""
    what = "routes by the model a request names" if several else "every request to the model's Service"
    return f"""# vllm-fleet gateway (written by vllm-fleet kubernetes): {what}.
{head}worker_processes auto;
events {{
    worker_connections 4096;
}}

http {{
    client_max_body_size 64m;
    client_body_buffer_size 64m;
    server_tokens off;
{js}
{upstreams}

    server {{
        listen {GATEWAY_PORT};
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_connect_timeout 10s;
        proxy_read_timeout 600s;
        proxy_send_timeout 600s;
        proxy_next_upstream error timeout http_502 http_503;

        # nginx's counters, for the exporter beside it only.
        location = {STATUS_PATH} {{
            stub_status;
            access_log off;
            allow 127.0.0.1;
            deny all;
        }}

        # The gateway's own readiness: nginx answers, whatever the models behind it do.
        location = {READY_PATH} {{
            access_log off;
            return 200 "ok\\n";
        }}

        location = /health {{
            proxy_pass http://vllm_fleet_model_0/health;
        }}

        # The API paths vLLM checks a key on (its middleware: /v1, /v2, /inference, /cohere), and
        # nothing else: /invocations, /metrics and vLLM's admin paths would pass without a key.
        location / {{
            default_type application/json;
            return 404 '{{"error": "not served by the gateway (the API is under /v1)"}}\\n';
        }}

{locations}    }}
}}
"""


def gateway(routes: list[tuple[str, str]], opts: KubeOptions) -> list[dict[str, Any]]:
    """The gateway's ConfigMap, Deployment and Service."""
    name = f"{opts.name}-gateway"
    data = {"nginx.conf": nginx_conf(routes, opts.namespace)}
    if len(routes) > 1:
        data["route.js"] = route_js([m for m, _ in routes])
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    lab = labels(opts, "gateway")
    meta = {"name": name, "namespace": opts.namespace, "labels": lab}
    ready = {"httpGet": {"path": READY_PATH, "port": "http"}, "periodSeconds": 10}
    mounts = [{"name": "config", "mountPath": "/etc/nginx/nginx.conf", "subPath": "nginx.conf", "readOnly": True}]
    if len(routes) > 1:
        mounts.append({"name": "config", "mountPath": "/etc/nginx/vllm-fleet/route.js", "subPath": "route.js",
                       "readOnly": True})  # fmt: skip
    nginx = {
        "name": "nginx",
        "image": opts.gateway_image,
        "ports": [{"name": "http", "containerPort": GATEWAY_PORT}],
        "volumeMounts": mounts,
        "readinessProbe": ready,
        # nginx itself, not the models behind it: a model's outage must not restart the gateway.
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 20},
    }
    exporter = {
        "name": "exporter",
        "image": opts.exporter_image,
        "args": [f"--nginx.scrape-uri=http://127.0.0.1:{GATEWAY_PORT}{STATUS_PATH}"],
        "ports": [{"name": "metrics", "containerPort": EXPORTER_PORT}],
    }
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {PART_OF: opts.name, "app.kubernetes.io/component": "gateway"}},
                "template": {
                    # A changed config rolls the gateway's pods.
                    "metadata": {"labels": lab, "annotations": {"vllm-fleet.io/config-sha256": digest}},
                    "spec": {
                        "containers": [nginx, exporter],
                        "volumes": [{"name": "config", "configMap": {"name": name}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {
                "selector": {PART_OF: opts.name, "app.kubernetes.io/component": "gateway"},
                "ports": [
                    {"name": "http", "port": GATEWAY_PORT, "targetPort": "http"},
                    {"name": "metrics", "port": EXPORTER_PORT, "targetPort": "metrics"},
                ],
            },
        },
    ]
