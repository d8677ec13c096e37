"""site.yml with the container runtime on test hosts that run their own Docker Engine.

The hosts are engine-capable (tests/hosts/nodes.py ``engines``); everything on them comes
from site.yml: the docker role installs Debian's docker.io, the toolkit role says why a CPU
node gets none, the serving image arrives only through serving_image's own paths (the
stand-in for vllm/vllm-openai, tests/hosts/engine.py, is a `docker save` file on the
controller: the builder loads it and builds the derived image FROM it, which reaches the
other nodes through a registry the builder runs for the transfer), the Ray head and workers run in containers
(``vllm_fleet_ray: always``), and the models are served by vLLM containers:

* beta (8 layers): PP=2 native across node1 and node3, node3 headless;
* alpha (4 layers): one single-node replica on node2;
* the gateway (nginx, routing by model) on node3.

One deployment, checked many ways: verify's rows, the containers' settings as the engine
itself reports them (host network, /dev/shm, restart policy, log rotation, the read-only
model mount at the same path, no secret in the configuration), the same image id on every
node, a second run that changes nothing, a crashed rank (kill -9; the group comes back
as one), ``systemctl restart docker`` (live-restore keeps every container), a node whose
image id differs (named before anything starts), and a teardown that leaves nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, failures, run_playbook, run_site
from tests.hosts import engine, nodes
from tests.hosts.common import SSH_OPTIONS, Node
from tests.hosts.nodes import ssh_argv
from tests.system.test_site_on_hosts import _recap

# About 15 minutes on fresh hosts and an image built once per machine: CI runs it on lane "b"'s
# hosts (tests/hosts/ci.py), `make test-containers` alone.
pytestmark = pytest.mark.skipif(
    os.environ.get("VLLM_FLEET_CONTAINER_TESTS") != "1",
    reason="the container-runtime site.yml test runs with VLLM_FLEET_CONTAINER_TESTS=1 (make test-containers)",
)

API_KEY = "containers-test-key-7b3f"
HF_TOKEN = "hf_containers_test_token_9c1d"
MODELS = [
    {
        "model": str(ROOT / "tests/system/files/tiny-llama-8"),
        "served_model_name": "beta",
        "max_model_len": 1024,
        "pipeline_parallel_size": 2,
    },
    {"model": str(ROOT / "inventories/local/files/tiny-llama"), "served_model_name": "alpha", "max_model_len": 1024},
]
# These machines' hard limits (memlock 8 MiB, nofile 20000; root lacks CAP_SYS_RESOURCE): the
# containers cannot be given more. Real GPU nodes keep the roles' defaults.
LIMITS = {
    "docker_daemon_options": {
        "default-ulimits": {
            "memlock": {"Name": "memlock", "Hard": 8388608, "Soft": 8388608},
            "nofile": {"Name": "nofile", "Hard": 20000, "Soft": 20000},
        }
    },
    "vllm_server_nofile": 20000,
    "ray_cluster_nofile": 20000,
    "ray_cluster_memlock": 8388608,
}


@dataclass
class Deployment:
    nodes: list[Node]
    inventory: Path
    artifacts: Path
    image: str
    first: subprocess.CompletedProcess[str]
    first_seconds: float

    def address(self, name: str) -> str:
        return next(n.address for n in self.nodes if n.name == name)

    @property
    def gateway(self) -> str:
        return f"http://{self.address('node3')}:8080"


def _ssh(node: str, command: str, timeout: float = 120) -> str:
    done = subprocess.run(ssh_argv(node, command), capture_output=True, text=True, timeout=timeout, check=False)
    return done.stdout


def _inventory(path: Path, hosts: list[Node], image: str, tarball: Path, transfer: Path) -> Path:
    inventory = {
        "all": {
            "hosts": {"localhost": {"ansible_connection": "local"}},
            "children": {
                "vllm_nodes": {
                    "hosts": {
                        n.name: {
                            "ansible_host": n.address,
                            "vllm_fleet_gpu": "cpu",
                            "vllm_fleet_gpu_count": 1,
                            # node2's 2 GiB gives the single-node replica the bigger node.
                            "vllm_fleet_gpu_memory_gib": 2 if n.name == "node2" else 1,
                        }
                        for n in hosts
                    }
                }
            },
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(nodes.KEY),
                "ansible_ssh_common_args": SSH_OPTIONS,
                "vllm_fleet_models": MODELS,
                "vllm_fleet_build_model": True,
                "vllm_fleet_runtime": "container",
                "vllm_fleet_image": image,
                # vLLM's CPU build refuses the Ray executor (tests/system/test_multinode.py proves
                # that path): the ranks use vLLM's own; Ray still runs, in its containers.
                "vllm_fleet_multinode_backend": "native",
                "vllm_fleet_ray": "always",
                "vllm_fleet_gateway": True,
                "vllm_fleet_gateway_host": "node3",
                "vllm_fleet_api_key": API_KEY,
                "vllm_fleet_hf_token": HF_TOKEN,
                "vllm_fleet_connect_timeout": 5,
                "vllm_fleet_prepare_model": False,
                # Prometheus is test_serve_on_hosts' (a minute more here for nothing new).
                "vllm_fleet_monitoring": False,
                # nginx checks the key and routes by model to one vLLM router per model on node3's loopback.
                "vllm_fleet_gateway_balancer": "vllm-router",
                "llm_gateway_router_pip_args": ["--no-index", "--find-links", "/opt/wheels"],
                # The stand-in reaches the nodes as an air-gapped site's image does: a file on the controller.
                "serving_image_mode": "derived",
                "serving_image_tarball": str(tarball),
                "serving_image_transfer_dir": str(transfer),
                # No index here: Ray is in the base already, pip only checks it.
                "serving_image_pip_args": ["--no-index"],
                **LIMITS,
            },
        }
    }
    path.write_text(yaml.safe_dump(inventory))
    return path


def _complete(gateway: str, model: str) -> dict[str, Any]:
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
    request = urllib.request.Request(gateway + "/v1/completions", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def _inspect(node: str, *names: str) -> list[dict[str, Any]]:
    raw = _ssh(node, "docker inspect " + " ".join(names))
    return json.loads(raw) if raw.strip() else []


def _containers(node: str) -> list[str]:
    return sorted(_ssh(node, "docker ps --all --format '{{.Names}}'").split())


@pytest.fixture(scope="module")
def containers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    # Hosts that run their own engine; CI's system stage starts them so (tests/hosts/ci.py).
    if not nodes.engines_enabled():
        nodes.reset(3, engines=True)
    hosts = nodes.node_list(3)
    image = engine.serving_image()
    tarball = engine.serving_tarball()
    work = tmp_path_factory.mktemp("containers")
    inventory = _inventory(work / "hosts.yml", hosts, image, tarball, work / "images")
    start = time.monotonic()
    first = run_site(inventory, work / "artifacts", timeout=2400)
    deployment = Deployment(hosts, inventory, work / "artifacts", image, first, time.monotonic() - start)
    print(f"\n[containers] site.yml to verified completions with containers: {deployment.first_seconds:.0f} s")
    yield deployment
    down = run_playbook("playbooks/teardown.yml", inventory, timeout=900)
    assert down.returncode == 0, failures(down)
    for node in hosts:
        left = _containers(node.name)
        assert left == [], f"{node.name} still has containers: {left}"
        # What the launches and the gateway wrote goes; the prepared node (engine, image, models,
        # the role's helper scripts) stays for the next deployment.
        files = _ssh(
            node.name,
            "ls /etc/vllm-fleet/vllm /etc/vllm-fleet/gateway /var/lib/vllm-fleet/vllm 2>/dev/null"
            " | grep -E '[.](env|secrets|launch[.]json|group-starts|conf)$' || true",
        )
        assert files.strip() == "", f"{node.name} keeps: {files}"
        units = _ssh(node.name, "systemctl list-units --all --no-legend 'vllm-fleet*' | grep -v not-found || true")
        assert units.strip() == "", f"{node.name}: {units}"
    # The gateway's routers go with their venv, launcher and key.
    assert _ssh("node3", "ls -d /opt/vllm-fleet/router /etc/vllm-fleet/gateway/router.key 2>/dev/null").strip() == ""


def test_site_serves_both_models_from_containers(containers: Deployment) -> None:
    output = containers.first.stdout + containers.first.stderr
    assert containers.first.returncode == 0, failures(containers.first)
    assert API_KEY not in output and HF_TOKEN not in output, "a secret was logged"

    plan = json.loads((containers.artifacts / "plan.json").read_text())
    placed = {i["served_model_name"]: i for i in plan["instances"]}
    assert (placed["beta"]["executor"], placed["beta"]["nodes"]) == ("native", ["node1", "node3"]), placed["beta"]
    assert placed["alpha"]["nodes"] == ["node2"], placed["alpha"]
    # The allocation table a person reads names both models' instances.
    table = (containers.artifacts / "plan.md").read_text()
    assert "Allocation of 2 model(s) on 3 node(s)" in table and "alpha-0" in table and "beta-0" in table, table
    rows = json.loads((containers.artifacts / "verify.json").read_text())
    assert rows and all(r["ok"] for r in rows), rows
    for model in ("beta", "alpha"):
        assert _complete(containers.gateway, model)["usage"]["completion_tokens"] > 0

    # Prepare: the toolkit says why a CPU node gets none; the image came through the role's paths.
    assert "the plan gives this node no NVIDIA GPU" in output
    assert "Load the base image on the builder from the controller's tarball" in output
    ids = {n.name: _ssh(n.name, f"docker image inspect --format '{{{{.Id}}}}' {_derived(n.name)}").strip()
           for n in containers.nodes}  # fmt: skip
    assert len(set(ids.values())) == 1 and all(ids.values()), ids


def _post(url: str, body: dict[str, Any], key: str | None = API_KEY) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_the_image_travelled_once_through_the_builders_registry_which_is_gone(containers: Deployment) -> None:
    """The derived image reached node2 and node3 from node1's transfer registry (pushed once,
    pulled by both), not through the controller; after the run nothing of the registry is left:
    no unit, storage, key, firewall rule, trust file or transfer name, and no `docker save` file
    on the controller."""
    out = containers.first.stdout

    def task(name: str) -> str:
        return out.split(f"TASK [serving_image : {name}")[1].split("TASK [")[0]

    assert "changed: [node1" in task("Push the image once (the builder)"), task("Push the image once")
    pull = task("Pull it on the nodes that lack it")
    assert "changed: [node2]" in pull and "changed: [node3]" in pull, pull
    fetch = task("Fetch it to the controller")
    assert "changed" not in fetch and "ok:" not in fetch, f"the image went through the controller: {fetch}"
    assert not list((containers.artifacts.parent / "images").glob("*.tar")), "an image file on the controller"
    left = _ssh(
        "node1",
        "systemctl list-unit-files --no-legend 'vllm-fleet-image-registry*'; ls -d /var/tmp/vllm-fleet-image/registry;"
        " iptables -S INPUT | grep -F 'serving image registry'; ss -ltn | grep -F ':5000 '; true",
    )
    assert left.strip() == "", f"node1 keeps the registry: {left}"
    # The package's own service (every address, no TLS) stays masked.
    masked = _ssh("node1", "readlink /etc/systemd/system/docker-registry.service; systemctl is-active docker-registry")
    assert masked.split() == ["/dev/null", "inactive"], masked
    for node in containers.nodes:
        trust = _ssh(
            node.name, "ls /etc/docker/certs.d; docker image ls --format '{{.Repository}}' | grep transfer; true"
        )
        assert trust.strip() == "", f"{node.name} keeps: {trust}"


def test_the_gateway_routes_each_model_by_name_through_its_router(containers: Deployment) -> None:
    """Several models behind one gateway (issue 15), here on containers: nginx checks the key and
    routes by the body's model to one vllm-router per model on node3's loopback, whose workers
    the gateway's watcher set."""
    rows = json.loads((containers.artifacts / "verify.json").read_text())
    assert sorted((r["via"], r["model"]) for r in rows) == [
        ("direct", "alpha"), ("direct", "beta"), ("gateway", "alpha"), ("gateway", "beta"),
    ], rows  # fmt: skip
    for row in rows:
        assert row["kv"]["verdict"] == "match", row  # each model's KV tokens within 5 % of its plan
    assert {r["layout"] for r in rows if r["via"] == "gateway"} == {"1 instance(s), vllm-router cache_aware"}, rows
    listening = _ssh("node3", "ss -ltnH")
    # The head rank (node1) serves beta's API; alpha's replica is node2's.
    for index, (name, node) in enumerate((("beta", "node1"), ("alpha", "node2"))):
        address = containers.address(node)
        unit = f"vllm-fleet-gateway-router-{index}.service"
        assert _ssh("node3", f"systemctl is-active {unit}").strip() == "active", unit
        assert f"127.0.0.1:{8200 + index} " in listening and f"0.0.0.0:{8200 + index} " not in listening, listening
        workers = json.loads(_ssh("node3", f"curl -s -m 5 http://127.0.0.1:{8200 + index}/list_workers"))
        assert workers == {"urls": [f"http://{address}:8000"]}, (name, workers)
        pid = _ssh("node3", f"systemctl show -p MainPID --value {unit}").strip()
        assert API_KEY not in _ssh("node3", f"tr '\\0' ' ' < /proc/{pid}/cmdline"), "the key is on argv"
        assert API_KEY not in _ssh("node3", f"systemctl cat {unit}"), "the key is in the unit"
    assert _ssh("node3", "stat -c '%a %U' /etc/vllm-fleet/gateway/router.key").split() == ["600", "root"]

    gateway = containers.gateway
    for name in ("alpha", "beta"):
        status, raw = _post(f"{gateway}/v1/completions", {"model": name, "prompt": "Hello", "max_tokens": 4})
        assert status == 200 and json.loads(raw)["model"] == name, raw
    status, raw = _post(
        f"{gateway}/v1/chat/completions",
        {"model": "beta", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True},
    )
    assert status == 200 and raw.count(b"data: ") >= 2 and b"[DONE]" in raw, raw[:400]
    # An unknown model: vLLM's own 404 from the gateway; no key: 401.
    status, raw = _post(f"{gateway}/v1/completions", {"model": "gamma", "prompt": "Hello"})
    assert status == 404 and json.loads(raw)["error"]["message"] == "The model `gamma` does not exist.", raw
    assert _post(f"{gateway}/v1/completions", {"model": "alpha", "prompt": "x"}, key=None)[0] == 401
    # A body that is not JSON names no model: nginx answers 400, nothing is routed.
    request = urllib.request.Request(
        f"{gateway}/v1/completions", data=b"not json", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    try:
        urllib.request.urlopen(request, timeout=30)
        raise AssertionError("a body that is not JSON was routed")
    except urllib.error.HTTPError as err:
        assert err.code == 400
    request = urllib.request.Request(f"{gateway}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        listed = {m["id"]: m for m in json.loads(resp.read())["data"]}
    assert sorted(listed) == ["alpha", "beta"], listed
    assert listed["alpha"]["root"].endswith("/tiny-llama") and listed["beta"]["root"].endswith("/tiny-llama-8")


def _derived(node: str) -> str:
    """The derived image's name on a node (vllm-fleet/serving:<ray>-<hash>)."""
    return _ssh(node, "docker images --format '{{.Repository}}:{{.Tag}}' vllm-fleet/serving").split()[0]


def test_the_engine_reports_the_planned_container_settings(containers: Deployment) -> None:
    plan = json.loads((containers.artifacts / "plan.json").read_text())
    expected = {"node1": ["vllm-beta-0"], "node2": ["vllm-alpha-0"], "node3": ["vllm-beta-0"]}
    ray_seen = 0
    for node in containers.nodes:
        names = _containers(node.name)
        assert set(expected[node.name]) <= set(names), (node.name, names)
        # The ray_cluster role's container (ray_cluster_name): the head on node1, a worker elsewhere.
        ray = [n for n in names if n == "vllm-fleet-ray"]
        ray_seen += len(ray)
        for info in _inspect(node.name, *expected[node.name], *ray):
            name, host, config = info["Name"].lstrip("/"), info["HostConfig"], info["Config"]
            assert info["State"]["Running"], (node.name, name, info["State"])
            assert host["NetworkMode"] == "host", (node.name, name)
            assert host["IpcMode"] == "host" or host["ShmSize"] >= 1 << 30, (node.name, name, host["ShmSize"])
            assert host["RestartPolicy"]["Name"] in {"unless-stopped", "always"}, (node.name, name)
            assert host["LogConfig"]["Type"] == "json-file" and host["LogConfig"]["Config"].get("max-size"), name
            env = "\n".join(config.get("Env") or [])
            assert API_KEY not in env and HF_TOKEN not in env, f"{node.name} {name}: a secret in the configuration"
            if name in expected[node.name]:
                assert any(name == f"vllm-{i['name']}" for i in plan["instances"]), name
                # The folder vllm serve reads (the built model's, on the node) is mounted read-only at its path.
                args = info["Args"]
                model = args[args.index("serve") + 1]
                mounts = {m["Destination"]: m for m in info["Mounts"]}
                assert mounts[model]["Source"] == model and mounts[model]["RW"] is False, mounts
                # The key reaches vLLM from the secrets file, read by the entry point.
                secrets = mounts["/run/vllm-fleet/launch.secrets"]
                assert secrets["RW"] is False, secrets
                assert _ssh(node.name, f"stat -c %a {secrets['Source']}").strip() == "600"
    assert ray_seen == 3, "the Ray head and workers do not run in containers on every node"


def test_a_second_run_changes_nothing(containers: Deployment) -> None:
    start = time.monotonic()
    again = run_site(containers.inventory, containers.artifacts, timeout=1200)
    seconds = time.monotonic() - start
    assert again.returncode == 0, failures(again)
    recap = _recap(again.stdout)
    assert all(c["changed"] == 0 for c in recap.values()), {h: c["changed"] for h, c in recap.items()}
    print(f"\n[containers] second run {seconds:.0f} s")


def test_the_preview_says_nothing_restarts(containers: Deployment) -> None:
    """site.yml --tags preview on the deployed plan (moved here from test_multinode, which is
    extended): it changes nothing on any host, shows no key, and says every launch and the
    gateway stay as they are."""
    start = time.monotonic()
    done = run_site(containers.inventory, containers.artifacts, "--tags", "preview", timeout=600)
    assert done.returncode == 0, failures(done)
    print(f"\n[containers] preview of the deployed plan: {time.monotonic() - start:.0f} s")
    recap = _recap(done.stdout)
    assert all(recap[n.name]["changed"] == 0 for n in containers.nodes), recap
    text = (containers.artifacts / "preview.json").read_text()
    assert API_KEY not in done.stdout + done.stderr + text, "the API key was shown"
    result = json.loads(text)
    lines = [line for node_lines in result["by_node"].values() for line in node_lines]
    assert sorted(result["by_node"]) == ["node1", "node2", "node3"], result["lines"]
    assert lines and all(line.endswith(": nothing") for line in lines), result["lines"]
    assert any(line.startswith("gateway on node3") for line in lines), result["lines"]
    assert result["warnings"] == [] and set(result["counts"]) == {"nothing"}, result


def _started(node: str, name: str) -> str:
    return _ssh(node, f"docker inspect --format '{{{{.State.StartedAt}}}}' {name}").strip()


def _wait_answering(gateway: str, model: str, since: float, limit: float = 600) -> float:
    while time.monotonic() - since < limit:
        time.sleep(5)
        try:
            if _complete(gateway, model)["usage"]["completion_tokens"]:
                return time.monotonic() - since
        except (urllib.error.URLError, TimeoutError, ConnectionError, KeyError):
            continue
    raise AssertionError(f"{model} did not answer again within {limit:.0f} s")


def test_a_crashed_rank_brings_the_group_back(containers: Deployment) -> None:
    """kill -9 of the headless rank's container process (a crash; `docker kill` is an operator's stop,
    which Docker's restart policy leaves stopped until the next site.yml run starts it again)."""
    gateway = containers.gateway
    head_before = _started("node1", "vllm-beta-0")
    _ssh("node3", "kill -9 $(docker inspect --format '{{.State.Pid}}' vllm-beta-0)")
    killed = time.monotonic()
    seconds = _wait_answering(gateway, "beta", killed)
    print(f"\n[containers] kill -9 of the headless rank's container -> answering again after {seconds:.0f} s")
    assert _started("node1", "vllm-beta-0") != head_before, "the head was not restarted with its group"
    verify = run_site(containers.inventory, containers.artifacts, "--tags", "verify", timeout=600)
    assert verify.returncode == 0, failures(verify)


def test_restarting_docker_keeps_every_container_running(containers: Deployment) -> None:
    before = {name: _started("node2", name) for name in _containers("node2")}
    assert "vllm-alpha-0" in before, before
    _ssh("node2", "systemctl restart docker", timeout=180)
    after = {name: _started("node2", name) for name in _containers("node2")}
    assert after == before, "live-restore: no container restarts with dockerd"
    assert _complete(containers.gateway, "alpha")["usage"]["completion_tokens"] > 0
    verify = run_site(containers.inventory, containers.artifacts, "--tags", "verify", timeout=600)
    assert verify.returncode == 0, failures(verify)


def test_a_node_with_another_image_id_is_named_before_anything_starts(containers: Deployment) -> None:
    name = _derived("node2")
    original = _ssh("node2", f"docker image inspect --format '{{{{.Id}}}}' {name}").strip()
    started = {n.name: {c: _started(n.name, c) for c in _containers(n.name)} for n in containers.nodes}
    # Same name, other content: what a hand-built image on one node looks like.
    _ssh("node2", f"docker rm -f vf-odd >/dev/null 2>&1; docker run --name vf-odd --entrypoint true {name} "
                  f"&& docker commit vf-odd {name} >/dev/null && docker rm vf-odd >/dev/null")  # fmt: skip
    try:
        done = run_site(containers.inventory, containers.artifacts, timeout=900)
        assert done.returncode != 0, "a node with another image id was not refused"
        assert f"{name} differs between nodes" in done.stdout and "node2" in done.stdout, failures(done)
        assert "Start vLLM on every node" not in done.stdout.split("differs between nodes")[1], "serve ran"
        now = {n.name: {c: _started(n.name, c) for c in _containers(n.name)} for n in containers.nodes}
        assert now == started, "a container restarted"
    finally:
        _ssh("node2", f"docker tag {original} {name}")
