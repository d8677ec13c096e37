"""The plan as Kubernetes manifests (vllm_fleet/kube/): every object validates against
Kubernetes' own OpenAPI schema (kubernetes-validate, strict) or its CRD's published schema
(tests/unit/data/crds, unknown fields refused as `kubectl apply --validate=strict` does), per
executor, for the seeds' A800 + L20 case, and the refusals. No API server runs here."""

from __future__ import annotations

import functools
import gzip
import http.server
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.conftest import FIXTURES, ROOT
from vllm_fleet import cli
from vllm_fleet.errors import PlanError
from vllm_fleet.kube.gateway import nginx_conf, route_js
from vllm_fleet.kube.manifests import manifests, to_yaml
from vllm_fleet.kube.options import KubeOptions
from vllm_fleet.model.spec import load_model
from vllm_fleet.planning.allocate import allocate, combined_plan, load_wishes
from vllm_fleet.planning.cluster import cluster_from_data
from vllm_fleet.planning.strategy import Wishes, load_cluster, plan_cluster

CRDS = ROOT / "tests/unit/data/crds"
# The Kubernetes releases the core objects are checked against: the oldest LeaderWorkerSet
# v0.10 supports that kubernetes-validate holds, and the newest it holds.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CRD_FILES = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkersets-lws-v0.10.0.yaml.gz",
    ("ray.io/v1", "RayService"): "rayservices-kuberay-v1.7.0.yaml.gz",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitors-prometheus-operator-v0.93.0.yaml.gz",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrules-prometheus-operator-v0.93.0.yaml.gz",
}


def _strict(schema: Any) -> Any:
    """A CRD's structural schema with unknown fields refused (the API server would prune them silently)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if isinstance(out.get("pattern"), str) and "(?i)" in out["pattern"]:  # Go's inline flag, where Python takes it
        out["pattern"] = "(?i)" + out["pattern"].replace("(?i)", "")
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def _crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    crd = yaml.safe_load(gzip.decompress((CRDS / CRD_FILES[(api_version, kind)]).read_bytes()))
    version = api_version.split("/")[1]
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema: dict[str, Any] = _strict(entry["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def validate(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        if key in CRD_FILES:
            jsonschema.Draft7Validator(_crd_schema(*key)).validate(obj)
            for container in _containers(obj):  # the pod templates inside, against Kubernetes' own schema
                kubernetes_validate.validate(
                    {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": container},
                    K8S_VERSIONS[-1],
                    True,
                )
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]
    if obj["kind"] == "LeaderWorkerSet":
        tmpl = spec["leaderWorkerTemplate"]
        return [tmpl["leaderTemplate"]["spec"], tmpl["workerTemplate"]["spec"]]
    if obj["kind"] == "RayService":
        cluster = spec["rayClusterConfig"]
        return [cluster["headGroupSpec"]["template"]["spec"]] + [
            g["template"]["spec"] for g in cluster["workerGroupSpecs"]
        ]
    return []


def _by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _vllm(pod: dict[str, Any]) -> dict[str, Any]:
    (c,) = [c for c in pod["containers"] if c["name"] == "vllm"]
    return c


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _plan(model: str, cluster: str, **wishes: Any) -> dict[str, Any]:
    return plan_cluster(load_model(model), load_cluster(FIXTURES / cluster), Wishes(**wishes))


@functools.cache
def _multinode(backend: str) -> str:
    plan = _plan("meta-llama/Llama-3.1-405B-Instruct", "2x8xa800.yml", max_model_len=8192, multinode_backend=backend,
                 ray_available=backend == "ray")  # fmt: skip
    return json.dumps(plan)


def test_mp_replicas_are_one_deployment_behind_the_gateway() -> None:
    cluster = cluster_from_data({"nodes": [{"name": f"h{i}", "gpu": "H100-SXM", "gpu_count": 8} for i in range(2)]})
    plan = plan_cluster(load_model("meta-llama/Llama-3.1-8B-Instruct"), cluster, Wishes(max_model_len=8192))
    assert len(plan["instances"]) == 16 and {i["executor"] for i in plan["instances"]} == {"mp"}
    objects, _ = manifests(plan, KubeOptions(api_key_secret="vllm-key", hf_token_secret="hf:token"))
    validate(objects)
    (dep,) = [
        d for d in _by_kind(objects, "Deployment") if d["metadata"]["labels"]["app.kubernetes.io/component"] == "vllm"
    ]
    assert dep["spec"]["replicas"] == 16
    pod = dep["spec"]["template"]["spec"]
    c = _vllm(pod)
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "1"} and pod["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"
    }
    # Every replica listens on the pod's port; the plan's per-instance ports and GPU ids are the node's, not the pod's.
    assert (_flag(c["args"], "--host"), _flag(c["args"], "--port")) == ("0.0.0.0", "8000")
    env = _env(c)
    assert "CUDA_VISIBLE_DEVICES" not in env and "VLLM_HOST_IP" not in env
    # Secrets by reference only.
    assert env["VLLM_API_KEY"] == {"secretKeyRef": {"name": "vllm-key", "key": "api-key"}}
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert c["startupProbe"]["httpGet"]["path"] == "/health" and c["startupProbe"]["failureThreshold"] >= 30
    assert pod["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    (gw,) = [d for d in _by_kind(objects, "Deployment") if d["metadata"]["name"] == "vllm-fleet-gateway"]
    assert [c["name"] for c in gw["spec"]["template"]["spec"]["containers"]] == ["nginx", "exporter"]
    assert {o["kind"] for o in objects} >= {"ServiceMonitor", "PrometheusRule", "NetworkPolicy", "ConfigMap"}


def test_native_multinode_is_a_leader_worker_set_with_lws_addresses() -> None:
    objects, _ = manifests(json.loads(_multinode("native")), KubeOptions(model_pvc="models"))
    validate(objects)
    (lws,) = _by_kind(objects, "LeaderWorkerSet")
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert tmpl["size"] == 2 and tmpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = _vllm(tmpl["leaderTemplate"]["spec"]), _vllm(tmpl["workerTemplate"]["spec"])
    assert _flag(leader["args"], "--node-rank") == "0" and "--headless" not in leader["args"]
    assert _flag(worker["args"], "--node-rank") == "$(LWS_WORKER_INDEX)" and worker["args"][-1] == "--headless"
    assert _flag(worker["args"], "--master-addr") == "$(LWS_LEADER_ADDRESS)"
    assert _flag(leader["args"], "--master-addr") == "$(POD_IP)"  # its own DNS record may not resolve yet
    # The model from the claim, read-only, under the pod's path.
    assert leader["args"][1] == "/models/Llama-3.1-405B-Instruct"
    assert {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}.items() <= next(
        v for v in tmpl["leaderTemplate"]["spec"]["volumes"] if v["name"] == "model"
    ).items()
    assert _env(worker)["VLLM_HOST_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert "ports" not in worker and "startupProbe" not in worker  # headless: no HTTP to probe
    assert leader["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    # One Service per model, over the leaders only.
    (svc,) = _by_kind(objects, "Service")
    assert svc["spec"]["selector"]["vllm-fleet.io/serves"] == "true"
    assert tmpl["leaderTemplate"]["metadata"]["labels"]["vllm-fleet.io/serves"] == "true"
    assert tmpl["workerTemplate"]["metadata"]["labels"]["vllm-fleet.io/serves"] == "false"


def test_ray_executor_starts_ray_in_the_group_and_needs_an_image_with_ray() -> None:
    plan = json.loads(_multinode("ray"))
    assert plan["instances"][0]["executor"] == "ray"
    with pytest.raises(PlanError, match=r"--image: .*holds no Ray"):
        manifests(plan, KubeOptions())
    objects, _ = manifests(plan, KubeOptions(image="registry.example/vllm-ray:0.32.0"))
    validate(objects)
    tmpl = _by_kind(objects, "LeaderWorkerSet")[0]["spec"]["leaderWorkerTemplate"]
    leader, worker = _vllm(tmpl["leaderTemplate"]["spec"]), _vllm(tmpl["workerTemplate"]["spec"])
    assert leader["command"][:2] == ["/bin/sh", "-c"] and "ray start --head" in leader["command"][2]
    assert leader["command"][3:] == ["vllm", "vllm"] and leader["args"][0] == "serve"
    assert _flag(leader["args"], "--distributed-executor-backend") == "ray"
    assert _env(leader)["RAY_ADDRESS"] == "$(POD_IP):6379"
    assert worker["args"] == [] and "ray start --address=" in worker["command"][2] and "--block" in worker["command"][2]
    assert "--num-gpus=8" in worker["command"][2]


def test_dp_ranks_start_at_the_worker_index_times_its_local_ranks() -> None:
    plan = _plan("Qwen/Qwen3-235B-A22B", "2x8xa800.yml", max_model_len=8192, strategies=("dp_ep",))
    assert plan["instances"][0]["executor"] == "dp"
    objects, _ = manifests(plan, KubeOptions())
    validate(objects)
    tmpl = _by_kind(objects, "LeaderWorkerSet")[0]["spec"]["leaderWorkerTemplate"]
    leader, worker = _vllm(tmpl["leaderTemplate"]["spec"]), _vllm(tmpl["workerTemplate"]["spec"])
    assert leader["command"] == ["vllm"] and _flag(leader["args"], "--data-parallel-address") == "$(POD_IP)"
    assert _flag(worker["args"], "--data-parallel-address") == "$(LWS_LEADER_ADDRESS)"
    assert "--data-parallel-start-rank" not in worker["args"] and "--headless" in worker["args"]
    # $$ is Kubernetes' escape: the shell sees $((LWS_WORKER_INDEX * 8)).
    assert worker["command"][:3] == [
        "/bin/sh",
        "-c",
        'exec "$@" --data-parallel-start-rank "$$((LWS_WORKER_INDEX * 8))"',
    ]
    assert _flag(worker["args"], "--data-parallel-size-local") == "8"


def test_seed_case_a800_and_l20_stages_land_on_their_gpus() -> None:
    plan = _plan("deepseek-ai/DeepSeek-R1", "a800_l20.yml", max_model_len=32768)
    inst = plan["instances"][0]
    objects, _ = manifests(plan, KubeOptions())
    validate(objects)
    tmpl = _by_kind(objects, "LeaderWorkerSet")[0]["spec"]["leaderWorkerTemplate"]
    assert tmpl["leaderTemplate"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A800-SXM4-80GB"}
    assert tmpl["workerTemplate"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L20"}
    partition = ",".join(str(n) for n in inst["layer_partition"])
    for part in ("leaderTemplate", "workerTemplate"):
        assert _env(_vllm(tmpl[part]["spec"]))["VLLM_PP_LAYER_PARTITION"] == partition
    # A GPU whose product label is not known: mixed placement needs it, so it is asked for.
    nodes = [{"name": "x", "gpu": "A800", "gpu_count": 8}, {"name": "y", "gpu": "RTX-PRO-6000", "gpu_count": 8}]
    mixed = plan_cluster(load_model("deepseek-ai/DeepSeek-R1"), cluster_from_data({"nodes": nodes}),
                         Wishes(max_model_len=8192))  # fmt: skip
    with pytest.raises(PlanError, match=r"--gpu-product: .*RTX-PRO-6000"):
        manifests(mixed, KubeOptions())
    objects, _ = manifests(mixed, KubeOptions(gpu_product=("RTX-PRO-6000=NVIDIA-RTX-PRO-6000",)))
    validate(objects)


def test_workers_that_differ_cannot_share_one_template() -> None:
    nodes = [{"name": "h", "gpu": "H100-SXM", "gpu_count": 8}, {"name": "a", "gpu": "A800", "gpu_count": 8},
             {"name": "l", "gpu": "L20", "gpu_count": 8}]  # fmt: skip
    plan = plan_cluster(load_model("deepseek-ai/DeepSeek-R1"), cluster_from_data({"nodes": nodes}),
                        Wishes(max_model_len=8192, strategies=("pp",)))  # fmt: skip
    assert [s["node"] for s in plan["instances"][0]["stages"]] == ["h", "a", "l"]
    with pytest.raises(PlanError, match="worker nodes differ in GPU, and a LeaderWorkerSet gives all workers one pod"):
        manifests(plan, KubeOptions())


def test_several_models_route_by_name_through_the_roles_njs() -> None:
    wishes = ROOT / "inventories/example-models/group_vars/all.yml"
    plan = combined_plan(allocate(load_wishes(wishes), load_cluster(FIXTURES / "2x8xa800.yml")))
    objects, _ = manifests(plan, KubeOptions())
    validate(objects)
    (config,) = _by_kind(objects, "ConfigMap")
    js = config["data"]["route.js"]
    assert '"llama-70b": "@vllm_fleet_model_0"' in js and "{{" not in js
    assert len(_by_kind(objects, "Service")) == 3 + 1  # a Service per model, and the gateway's
    # The same plan as a KubeRay RayService: the Ray Serve LLM config inside, a worker group per GPU kind.
    objects, _ = manifests(plan, KubeOptions(ray_service=True, ray_image="rayproject/ray-llm:2.60.0-py311-cu128"))
    validate(objects)
    (rs,) = _by_kind(objects, "RayService")
    serve = yaml.safe_load(rs["spec"]["serveConfigV2"])
    assert serve["applications"][0]["import_path"] == "ray.serve.llm:build_openai_app"
    (group,) = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    used = {n for i in plan["instances"] for n in i["nodes"]}
    assert group["replicas"] == len(used) and group["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "8"
    }


def test_the_alert_rules_are_the_monitoring_roles_for_the_jobs_scraped_here() -> None:
    objects, _ = manifests(json.loads(_multinode("native")), KubeOptions())
    (rule,) = _by_kind(objects, "PrometheusRule")
    names = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"VllmInstanceDown", "VllmKvCacheNearlyFull"} <= names
    # No gateway in a one-instance plan, no Ray, node and DCGM exporters under their own jobs: left out.
    assert not names & {"GatewayDown", "RayNodeDown", "NodeExporterDown", "DcgmExporterDown"}
    (monitor,) = _by_kind(objects, "ServiceMonitor")
    relabel = monitor["spec"]["endpoints"][0]["relabelings"]
    assert relabel[0] == {"action": "replace", "targetLabel": "job", "replacement": "vllm"}


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed")
def test_nginx_accepts_the_gateway_config(tmp_path: Path) -> None:
    """`nginx -t` on the rendered config, with the Services' names pointing here."""
    njs = next(iter(Path("/usr/lib/nginx/modules").glob("ngx_http_js_module.so")), None)
    for routes in ([("m", "svc-m")], [("a", "svc-a"), ("b", "svc-b")]):
        if len(routes) > 1 and njs is None:
            continue
        conf = nginx_conf(routes, "ns").replace(".ns.svc:", ".localhost:")
        conf = re.sub(r"(svc-\w)\.localhost", "127.0.0.1", conf).replace("modules/ngx_http_js_module.so", str(njs))
        conf = conf.replace("/etc/nginx/vllm-fleet/route.js", str(tmp_path / "route.js"))
        conf = conf.replace("events {", f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{")
        (tmp_path / "route.js").write_text(route_js([m for m, _ in routes]))
        (tmp_path / "nginx.conf").write_text(conf)
        done = subprocess.run(["nginx", "-t", "-c", str(tmp_path / "nginx.conf"), "-e", str(tmp_path / "err.log")],
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr


def test_the_cli_writes_the_stream_and_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(_multinode("native"))
    out = tmp_path / "k8s.yaml"
    assert cli.main(["kubernetes", "--plan", str(plan), "-o", str(out), "--api-key-secret", "vllm:key"]) == 0
    text = out.read_text()
    leader = _vllm(
        next(yaml.safe_load_all(text.split("---", 2)[2]))["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    )
    assert _env(leader)["VLLM_API_KEY"] == {"secretKeyRef": {"name": "vllm", "key": "key"}}
    assert [o["kind"] for o in yaml.safe_load_all(text)][:2] == ["Namespace", "LeaderWorkerSet"]
    assert "1 LeaderWorkerSet" in capsys.readouterr().err
    for argv, message in [
        (["--api-key-secret", "sk-live value"], "--api-key-secret: 'sk-live value' is not a Secret's NAME[:KEY]"),
        (["--namespace", "Prod_NS"], "--namespace: 'Prod_NS' is not a short DNS label"),
        (["--gpu-product", "A800"], "--gpu-product: 'A800' is not GPU=LABEL"),
        (["--model-pvc", "a", "--model-host-path", "/m"], "--model-pvc: and --model-host-path both name"),
        (["--ray-service"], "--ray-service: renders a multi-model plan"),
    ]:
        assert cli.main(["kubernetes", "--plan", str(plan), *argv]) == 2
        assert message in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"instances": [{"name": "x"}]}))
    assert cli.main(["kubernetes", "--plan", str(broken)]) == 2
    assert "--plan: malformed plan (KeyError: 'stages')" in capsys.readouterr().err
    allocation = tmp_path / "allocation.json"
    allocation.write_text(json.dumps({"models": []}))
    assert cli.main(["kubernetes", "--plan", str(allocation)]) == 2
    assert "is an allocation" in capsys.readouterr().err


def test_a_model_folder_here_needs_a_volume(tiny_model: Path) -> None:
    cluster = cluster_from_data({"nodes": [{"name": "c", "gpu": "cpu", "gpu_count": 1, "gpu_memory_gib": 2}]})
    plan = plan_cluster(load_model(str(tiny_model)), cluster, Wishes(max_model_len=1024))
    with pytest.raises(PlanError, match=r"--model-pvc: the model .* is a folder on this machine"):
        manifests(plan, KubeOptions(image="vllm-cpu:0.32.0"))
    with pytest.raises(PlanError, match=r"--image: .*runs on CPUs"):
        manifests(plan, KubeOptions(model_host_path="/srv/models/tiny"))
    objects, notes = manifests(plan, KubeOptions(image="vllm-cpu:0.32.0", model_host_path="/srv/models/tiny"))
    validate(objects)
    c = _vllm(_by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"])
    assert "limits" not in c["resources"] and _env(c)["VLLM_TARGET_DEVICE"] == "cpu"
    assert c["args"][1] == "/models/" + tiny_model.name  # the host folder holds one folder per model
    assert any("VLLM_CPU_OMP_THREADS_BIND" in n for n in notes)


def test_yaml_stream_has_no_aliases() -> None:
    objects, _ = manifests(json.loads(_multinode("native")), KubeOptions())
    text = to_yaml(objects)
    assert "&id" not in text and "*id" not in text


def test_an_inventorys_serve_options_reach_the_pods_and_its_secrets_do_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-i: the inventory's serving options (not in a plan file) are in the argv and env, as on the
    Ansible path; its API key (here in plain text) is nowhere; a secret in extra_env is refused."""
    inv = tmp_path / "inv"
    shutil.copytree(ROOT / "inventories/example-2x8xa800", inv)
    extra = {
        "vllm_fleet_api_key": "sk-must-not-appear",
        "vllm_fleet_trust_remote_code": True,
        "vllm_fleet_reasoning_parser": "deepseek_r1",
        "vllm_fleet_extra_args": ["--seed", "7"],
        "vllm_fleet_extra_env": {"VLLM_LOGGING_LEVEL": "DEBUG"},
    }
    with (inv / "group_vars/all.yml").open("a") as f:
        f.write(yaml.safe_dump(extra))
    out = tmp_path / "k8s.yaml"
    assert cli.main(["kubernetes", "-i", str(inv), "-o", str(out), "--api-key-secret", "vllm"]) == 0
    text = out.read_text()
    assert "sk-must-not-appear" not in text and "sk-must-not-appear" not in capsys.readouterr().err
    (lws,) = _by_kind(list(yaml.safe_load_all(text)), "LeaderWorkerSet")
    for part in ("leaderTemplate", "workerTemplate"):
        c = _vllm(lws["spec"]["leaderWorkerTemplate"][part]["spec"])
        assert {"--trust-remote-code", "--reasoning-parser", "deepseek_r1", "--seed", "7"} <= set(c["args"])
        assert _env(c)["VLLM_LOGGING_LEVEL"] == "DEBUG"
    with (inv / "group_vars/all.yml").open("a") as f:
        f.write(
            yaml.safe_dump({"vllm_fleet_extra_env": {"OPENAI_API_KEY": "sk-x"}}).replace(
                "vllm_fleet_extra_env", "x_unused"
            )
        )
    (inv / "host_vars").mkdir()
    (inv / "host_vars/a800-1.yml").write_text(yaml.safe_dump({"vllm_fleet_extra_env": {"OPENAI_API_KEY": "sk-x"}}))
    assert cli.main(["kubernetes", "-i", str(inv)]) == 2
    assert "vllm_fleet_extra_env of a800-1: OPENAI_API_KEY looks like a secret" in capsys.readouterr().err


def test_rdma_pods_get_the_device_and_keep_nccl_on_it() -> None:
    objects, _ = manifests(json.loads(_multinode("native")), KubeOptions(rdma_resource="rdma/ib=1"))
    validate(objects)
    tmpl = _by_kind(objects, "LeaderWorkerSet")[0]["spec"]["leaderWorkerTemplate"]
    for part in ("leaderTemplate", "workerTemplate"):
        c = _vllm(tmpl[part]["spec"])
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/ib": "1"}
        assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
        assert "NCCL_IB_DISABLE" not in _env(c)
    objects, _ = manifests(json.loads(_multinode("native")), KubeOptions())
    leader = _vllm(_by_kind(objects, "LeaderWorkerSet")[0]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"])
    assert _env(leader)["NCCL_IB_DISABLE"] == "1"  # no RDMA device: sockets


def test_names_are_unique_stable_and_prefixed() -> None:
    nodes = [{"name": "s", "gpu": "H100-SXM", "gpu_count": 1}, {"name": "p", "gpu": "H100-PCIe", "gpu_count": 1}]
    model = "mistralai/Mistral-Small-3.1-24B-Instruct-2503"
    plan = plan_cluster(load_model(model), cluster_from_data({"nodes": nodes}), Wishes(max_model_len=8192))
    first, _ = manifests(plan, KubeOptions(name="prod"))
    again, _ = manifests(plan, KubeOptions(name="prod"))
    deployments = [
        d["metadata"]["name"] for d in _by_kind(first, "Deployment") if "gateway" not in d["metadata"]["name"]
    ]
    assert len(deployments) == 2 and len(set(deployments)) == 2
    assert all(n.startswith("prod-") and len(n) <= 45 for n in deployments)
    assert first == again
    dep = _by_kind(first, "Deployment")[0]
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}  # no GPU is spare
    (lws,) = _by_kind(manifests(json.loads(_multinode("native")), KubeOptions(name="prod"))[0], "LeaderWorkerSet")
    assert lws["metadata"]["name"].startswith("prod-llama-3-1-405b-instruct-0-")


def test_the_gateway_passes_the_api_paths_only(tmp_path: Path) -> None:
    """nginx with the rendered config, in front of a stand-in for the model's Service: /v1 reaches
    it, /health too; /invocations and /metrics (vLLM checks no key there) stop at the gateway."""
    nginx = shutil.which("nginx")
    if nginx is None:
        pytest.skip("nginx is not installed")
    seen: list[str] = []

    class Model(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    model = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Model)
    threading.Thread(target=model.serve_forever, daemon=True).start()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conf = nginx_conf([("m", "svc-m")], "ns").replace("svc-m.ns.svc:8000", f"127.0.0.1:{model.server_port}")
    conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    conf = conf.replace("events {", f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{")
    conf = conf.replace("http {", f"http {{\n    access_log off;\n    client_body_temp_path {tmp_path};", 1)
    (tmp_path / "nginx.conf").write_text(conf)
    server = subprocess.Popen([nginx, "-c", str(tmp_path / "nginx.conf"), "-e", str(tmp_path / "err.log"),
                               "-g", "daemon off;"])  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        codes: dict[str, int] = {}
        for path in ("/vllm-fleet-gateway-ready", "/v1/models", "/health", "/invocations", "/metrics"):
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
                        codes[path] = reply.status
                    break
                except urllib.error.HTTPError as err:
                    codes[path] = err.code
                    break
                except OSError:
                    assert time.monotonic() < deadline, "nginx did not start"
                    time.sleep(0.1)
    finally:
        server.terminate()
        server.wait(timeout=10)
        model.shutdown()
    assert codes == {"/vllm-fleet-gateway-ready": 200, "/v1/models": 200, "/health": 200, "/invocations": 404,
                     "/metrics": 404}  # fmt: skip
    assert seen == ["/v1/models", "/health"]


def test_an_inventory_is_planned_without_reaching_a_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`-i`: the inventory's own plan play (--tags plan) into a temporary folder; auto multi-node
    plans vLLM's native mode, as for a pulled image (the pods' vllm-openai holds no Ray)."""
    out = tmp_path / "k8s.yaml"
    assert cli.main(["kubernetes", "-i", str(ROOT / "inventories/example-2x8xa800"), "-o", str(out)]) == 0
    objects = list(yaml.safe_load_all(out.read_text()))
    validate(objects)
    (lws,) = _by_kind(objects, "LeaderWorkerSet")
    leader = _vllm(lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"])
    assert _flag(leader["args"], "--nnodes") == "2" and _flag(leader["args"], "--max-model-len") == "32768"
    recap = capsys.readouterr().err.split("PLAY RECAP")[-1]
    assert "localhost" in recap and "a800-1" not in recap and "a800-2" not in recap  # no node was reached
