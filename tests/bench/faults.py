"""Faults on a live deployment, measured: `make bench-faults` (root, the test hosts).

The deployment (one site.yml run, the host runtime): an 8-layer model whose planned
max_model_len does not fit one 1 GiB node, so the planner gives it two instances of
different shapes, both behind the nginx gateway on node3:

* tiny-0: one replica on node3 (2 GiB);
* tiny-1: PP=2 across node1 and node2 (1 GiB each), native executor, node2 headless;
* Prometheus on node3, the watchdogs and the gateway's watcher on.

A bounded load runs through the gateway for the whole bench: two clients, one streamed
and one not, each pausing 2 s between requests (tests/system/test_serve_on_hosts.py's
``Load`` says why the pause). Then one fault at a time, each followed by a site.yml run
whose changed count is the row's last column:

reboot    node2 (the PP group's headless rank) restarts: `podman restart`, systemd boots again
worker    the PP group's headless rank is stopped for 60 s (systemctl stop), then started
partition the gateway's host drops the PP group head's port for 90 s (iptables), then heals
killed   ansible-playbook is SIGKILLed in the middle of a serve phase that restarts every replica
disk      node2's model filesystem (the hosts' 16 MiB tmpfs, 4 MiB left) fills during the prepare
          phase's fetch of an 8 MiB model; then space is freed and the fetch runs again
refused   node3's replica gets a flag vLLM refuses; then the inventory is fixed
ray       Ray's head (ray_cluster on the three hosts, beside the deployment) restarts

Each row: seconds until the gateway took the instance out of rotation (detect), seconds
until it was back in rotation and answered directly (serving), requests and failures
(streams apart) from the fault until the next fault, and what was found lost or
inconsistent.

    python tests/bench/faults.py [--faults reboot,worker,...] [--keep]
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.conftest import failures, run_playbook, run_site  # noqa: E402
from tests.hosts import nodes  # noqa: E402
from tests.hosts.common import SMALL_FS, SSH_OPTIONS, Node  # noqa: E402
from tests.hosts.images import podman  # noqa: E402
from tests.hosts.nodes import ssh_argv  # noqa: E402
from tests.system.test_serve_on_hosts import _killed_at_first_change  # noqa: E402
from tests.system.test_site_on_hosts import _recap  # noqa: E402

API_KEY = "faults-bench-key-3c9e"
MODEL = ROOT / "tests/bench/files/tiny-llama-long"
MAX_MODEL_LEN = 98304  # more KV than one 1 GiB node holds, less than two or one 2 GiB node
STATUS = "/var/lib/vllm-fleet/gateway/status.json"
FAULTS = ("reboot", "worker", "partition", "killed", "disk", "refused", "ray")


def say(text: str) -> None:
    print(f"[faults] {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def ssh(node: str, command: str, timeout: float = 120, check: bool = True) -> str:
    done = subprocess.run(ssh_argv(node, command), capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{node}: {command}: rc {done.returncode}: {done.stderr[-1500:]}")
    return done.stdout


def inventory(path: Path, hosts: list[Node], node_vars: dict[str, dict[str, Any]] | None = None, **extra: Any) -> Path:
    memory = {"node1": 1, "node2": 1, "node3": 2}
    bind = {"node1": "0", "node2": "1", "node3": "1"}
    data = {
        "all": {
            "hosts": {"localhost": {"ansible_connection": "local"}},
            "children": {
                "vllm_nodes": {
                    "hosts": {
                        n.name: {
                            "ansible_host": n.address,
                            "vllm_fleet_gpu": "cpu",
                            "vllm_fleet_gpu_count": 1,
                            "vllm_fleet_gpu_memory_gib": memory[n.name],
                            # One core each, as if each node had its own (the hosts share two).
                            "vllm_fleet_extra_env": {"VLLM_CPU_OMP_THREADS_BIND": bind[n.name], **extra.get("env", {})},
                            **(node_vars or {}).get(n.name, {}),
                        }
                        for n in hosts
                    }
                }
            },
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(nodes.KEY),
                "ansible_ssh_common_args": SSH_OPTIONS,
                "vllm_fleet_models": [
                    {"model": str(MODEL), "served_model_name": "tiny", "max_model_len": MAX_MODEL_LEN, "replicas": 2}
                ],
                "vllm_fleet_build_model": True,
                "vllm_fleet_runtime": "systemd",
                "vllm_fleet_prepare_model": False,
                "vllm_fleet_gateway": True,
                "vllm_fleet_gateway_host": "node3",
                "vllm_fleet_monitoring_host": "node3",
                "vllm_fleet_monitoring_scrape_interval": 5,
                "vllm_fleet_api_key": API_KEY,
                "vllm_fleet_connect_timeout": 5,
                "vllm_server_installer": "uv",
                "vllm_server_pip_args": ["--no-index", "--find-links", "/opt/wheels"],
            },
        }
    }
    path.write_text(yaml.safe_dump(data))
    return path


Run = subprocess.CompletedProcess[str]


@dataclass
class Request:
    start: float
    end: float
    streamed: bool
    error: str | None


class Load:
    """One streamed and one non-streamed client through the gateway, each pausing 2 s."""

    def __init__(self, url: str) -> None:
        self.url, self.stop = url, threading.Event()
        self.done: list[Request] = []
        self.threads = [threading.Thread(target=self._run, args=(s,), daemon=True) for s in (True, False)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=150)

    def _one(self, streamed: bool) -> None:
        body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8, "stream": streamed}
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
        request = urllib.request.Request(self.url + "/v1/completions", data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(request, timeout=120) as resp:
            if streamed:
                if not any(line.strip() == b"data: [DONE]" for line in resp):
                    raise RuntimeError("stream ended without [DONE]")
            elif not json.loads(resp.read())["choices"][0]["text"]:
                raise RuntimeError("empty completion")

    def _run(self, streamed: bool) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            error = None
            try:
                self._one(streamed)
            except (urllib.error.URLError, OSError, RuntimeError, ValueError, KeyError) as exc:
                error = f"{type(exc).__name__}: {exc}"[:200]
            self.done.append(Request(start, time.monotonic(), streamed, error))
            self.stop.wait(2.0)

    def between(self, start: float, end: float) -> dict[str, Any]:
        mine = [r for r in self.done if start <= r.start < end or start <= r.end < end]
        failed = [r for r in mine if r.error]
        return {
            "requests": len(mine),
            "failed": sum(1 for r in failed if not r.streamed),
            "failed_streams": sum(1 for r in failed if r.streamed),
            "errors": sorted({r.error or "" for r in failed})[:4],
        }


@dataclass
class Bench:
    hosts: list[Node]
    tmp: Path
    inventory: Path
    artifacts: Path
    load: Load | None = None
    plan: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # extra environment of the inventory now deployed

    def address(self, name: str) -> str:
        return next(n.address for n in self.hosts if n.name == name)

    @property
    def gateway(self) -> str:
        return f"http://{self.address('node3')}:8080"

    def instance(self, name: str) -> dict[str, Any]:
        return next(i for i in self.plan["instances"] if i["name"] == name)

    def state(self, endpoint: str) -> str:
        """The gateway watcher's view of one upstream (up, ejected, drained), or why it is unknown."""
        try:
            return str(json.loads(ssh("node3", f"cat {STATUS}", timeout=20))["upstreams"][endpoint]["state"])
        except (RuntimeError, KeyError, ValueError, subprocess.TimeoutExpired) as exc:
            return f"unknown ({type(exc).__name__})"

    def answers(self, endpoint: str) -> bool:
        body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 2}).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
        request = urllib.request.Request(f"http://{endpoint}/v1/completions", data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return bool(json.loads(resp.read())["choices"])
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return False

    def site(
        self, inventory: Path | None = None, *extra: str, timeout: float = 1800
    ) -> subprocess.CompletedProcess[str]:
        return run_site(inventory or self.inventory, self.artifacts, *extra, timeout=timeout)

    def changed_after(self) -> dict[str, int] | str:
        """A site.yml run after recovery: each host's changed count, or why it failed."""
        again = self.site()
        if again.returncode != 0:
            return "failed: " + failures(again, tail=600)[-600:]
        return {h: c["changed"] for h, c in _recap(again.stdout).items() if c["changed"]}


def wait_until(what: Callable[[], bool], timeout: float, step: float = 1.0) -> float | None:
    """Seconds until ``what()`` held, or None after ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if what():
            return time.monotonic() - start
        time.sleep(step)
    return None


class Watch:
    """The gateway watcher's view of one upstream, polled each second from ``t0`` on in a thread:
    when it first left rotation, and (``back``) when it was in rotation again and answered."""

    def __init__(self, bench: Bench, endpoint: str) -> None:
        self.bench, self.endpoint = bench, endpoint
        self.t0 = time.monotonic()
        self.left: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set() and self.left is None:
            if self.bench.state(self.endpoint) != "up":
                self.left = time.monotonic() - self.t0
            self.stop.wait(1.0)

    def back(self, timeout: float = 900) -> tuple[float | None, float | None]:
        """(seconds until it left rotation, seconds until it served again), both from ``t0``."""

        def serving() -> bool:
            up = self.left is not None and self.bench.state(self.endpoint) == "up"
            return up and self.bench.answers(self.endpoint)

        wait_until(lambda: self.left is not None, timeout=120, step=0.5)
        served = wait_until(serving, timeout=timeout, step=2)
        self.stop.set()
        return self.left, None if served is None else time.monotonic() - self.t0


def fault_reboot(bench: Bench) -> dict[str, Any]:
    head = bench.instance("tiny-1")["endpoint"]
    node = next(n for n in bench.hosts if n.name == "node2")
    watch = Watch(bench, head)
    podman("restart", "--time", "0", node.container)
    booted = wait_until(lambda: ssh("node2", "systemctl is-system-running", timeout=20, check=False).strip()
                        in {"running", "degraded"}, timeout=300, step=2)  # fmt: skip
    detect, serve = watch.back()
    listed = "systemctl list-units --plain --no-legend 'vllm-fleet-*' | awk '{print $1 \"=\" $3}'"
    units = ssh("node2", listed, check=False)
    return {
        "detect_s": detect, "serving_s": serve, "booted_s": booted,
        "notes": f"node2 units after boot: {' '.join(units.split())}",
    }  # fmt: skip


def fault_worker(bench: Bench) -> dict[str, Any]:
    head = bench.instance("tiny-1")["endpoint"]
    unit = "vllm-fleet-vllm-tiny-1.service"
    before = int(ssh("node1", f"systemctl show -p NRestarts --value {unit}").strip() or 0)
    watch = Watch(bench, head)
    ssh("node2", f"systemctl stop {unit}")
    time.sleep(60)
    ssh("node2", f"systemctl start {unit}")
    detect, serve = watch.back()
    after = int(ssh("node1", f"systemctl show -p NRestarts --value {unit}").strip() or 0)
    log = ssh("node1", f"journalctl -u {unit} --no-pager -o cat | grep 'vllm-fleet group' | tail -4", check=False)
    return {
        "detect_s": detect, "serving_s": serve,
        "notes": f"head restarts: {after - before} (budget: 5 in 10 min); head said: "
                 + " / ".join(line.split(": ", 1)[-1][:90] for line in log.splitlines()[-2:]),
    }  # fmt: skip


IPTABLES = (
    "command -v iptables >/dev/null || "
    "(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables >/dev/null)"
)


def alert(bench: Bench, name: str, instance: str) -> bool:
    script = (
        "import json, urllib.request; a = json.load(urllib.request.urlopen('http://127.0.0.1:9090/api/v1/alerts'));"
        f"print(any(x['labels']['alertname'] == {name!r} and x['labels'].get('instance') == {instance!r}"
        " and x['state'] == 'firing' for x in a['data']['alerts']))"
    )
    return ssh("node3", "python3 -c " + shlex.quote(script), timeout=30, check=False).strip() == "True"


def fault_partition(bench: Bench) -> dict[str, Any]:
    head = bench.instance("tiny-1")["endpoint"]
    address, port = head.rsplit(":", 1)
    rule = f"OUTPUT -d {address} -p tcp --dport {port} -j DROP"
    ssh("node3", IPTABLES, timeout=600)
    watch = Watch(bench, head)
    t0 = watch.t0
    ssh("node3", f"iptables -I {rule}")
    fired = wait_until(lambda: alert(bench, "VllmInstanceDown", head), timeout=90, step=3)
    left = 90 - (time.monotonic() - t0)
    if left > 0:
        time.sleep(left)
    ssh("node3", f"iptables -D {rule}")
    healed = time.monotonic()
    detect, serve = watch.back()
    cleared = wait_until(lambda: not alert(bench, "VllmInstanceDown", head), timeout=300, step=3)
    return {
        "detect_s": detect, "serving_s": serve,
        "notes": f"90 s partition; VllmInstanceDown fired after {fired and round(fired)} s, "
                 f"cleared {cleared and round(time.monotonic() - healed)} s after the heal",
    }  # fmt: skip


def launches(bench: Bench) -> dict[str, str]:
    """Per node: whether each running vLLM's environment matches its launch record on disk."""
    out = {}
    for node in ("node1", "node2", "node3"):
        script = (
            "for f in /etc/vllm-fleet/vllm/*.env; do n=$(basename $f .env); "
            "pid=$(systemctl show -p MainPID --value vllm-fleet-$n.service); "
            "want=$(grep -c VLLM_FLEET_FAULT_RUN $f); "
            "have=$(tr '\\0' '\\n' < /proc/$pid/environ 2>/dev/null | grep -c VLLM_FLEET_FAULT_RUN); "
            "echo $n record=$want running=$have; done"
        )
        out[node] = " ".join(ssh(node, script, check=False).split())
    return out


def fault_killed(bench: Bench) -> dict[str, Any]:
    changed = inventory(bench.tmp / "changed.yml", bench.hosts, env={**bench.env, "VLLM_FLEET_FAULT_RUN": "1"})
    # The same kill as CI's (test_serve_on_hosts): at the first change the serve phase makes on a
    # node of the first batch (its launch's files written, the unit not restarted yet).
    killed = _killed_at_first_change(changed, bench.artifacts)
    killed_at, task = killed["killed_at"], killed["task"]
    state = launches(bench)
    rerun = bench.site(changed)
    converged = rerun.returncode == 0
    after = launches(bench)
    again = bench.site(changed)
    changed_again = {h: c["changed"] for h, c in _recap(again.stdout).items() if c["changed"]}
    bench.inventory, bench.env = changed, {**bench.env, "VLLM_FLEET_FAULT_RUN": "1"}
    return {
        "detect_s": None, "serving_s": None,
        "notes": f"killed {killed_at and round(killed_at)} s into the run, at {task!r}; after the kill: {state}; "
                 f"re-run {'converged' if converged else 'FAILED'}: {after}; the run after: changed {changed_again}",
    }  # fmt: skip


def fault_refused(bench: Bench) -> dict[str, Any]:
    replica = bench.instance("tiny-0")["endpoint"]
    # Only node3's launch changes: the rest as deployed now.
    broken = inventory(
        bench.tmp / "refused.yml", bench.hosts, {"node3": {"vllm_fleet_extra_args": ["--no-such-flag"]}}, env=bench.env
    )
    unit = "vllm-fleet-vllm-tiny-0.service"
    t0 = time.monotonic()
    run = bench.site(broken, "--tags", "serve", timeout=1200)
    run_s = time.monotonic() - t0
    said = [line for line in run.stdout.splitlines() if "did not answer /health" in line or "no-such-flag" in line]
    starts = [ssh("node3", f"systemctl show -p NRestarts --value {unit}").strip()]
    time.sleep(60)
    starts.append(ssh("node3", f"systemctl show -p NRestarts --value {unit}").strip())
    status = subprocess.run(
        [sys.executable, "-m", "vllm_fleet.cli", "status", "--plan", str(bench.artifacts / "plan.json"),
         "-i", str(broken)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    fired = alert(bench, "VllmInstanceDown", replica)
    fixed = bench.site()
    fixed_said = "" if fixed.returncode == 0 else " (" + failures(fixed, tail=0)[:700].replace("\n", " | ") + ")"
    serve = wait_until(lambda: bench.answers(replica), timeout=600, step=2)
    return {
        "detect_s": round(run_s), "serving_s": None if serve is None else round(time.monotonic() - t0),
        "notes": f"run rc {run.returncode} after {run_s:.0f} s, said: {said[:1]}; restarts in 60 s: "
                 f"{int(starts[1]) - int(starts[0])}; status: {why_lines(status.stdout)}; "
                 f"VllmInstanceDown firing: {fired}; the fixed inventory's run rc {fixed.returncode}{fixed_said}",
    }  # fmt: skip


def disk_model(folder: Path, mib: int = 8) -> Path:
    """The bench's model as files the prepare phase copies: its config.json and one shard of
    ``mib`` MiB (real safetensors framing, so the role's verification reads it)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text((MODEL / "config.json").read_text())
    count = mib * 1024 * 1024 // 4
    header = json.dumps({"w": {"dtype": "F32", "shape": [count], "data_offsets": [0, count * 4]}}).encode()
    with (folder / "model.safetensors").open("wb") as out:
        out.write(struct.pack("<Q", len(header)) + header)
        out.write(b"\0" * (count * 4))
    return folder


def fault_disk(bench: Bench) -> dict[str, Any]:
    """The model's folder fills up during the prepare phase's fetch: node2's /mnt/small (the test
    hosts' 16 MiB tmpfs) is filled to 4 MiB of room, then the prepare phase puts an 8 MiB model
    there on the nodes its plan uses (PP=2 on node1 and node2: the controller to node1, then
    node1 to node2). The deployment serving now is not touched: the load's requests keep going
    through the gateway."""
    model = disk_model(bench.tmp / "disk-model")
    where = f"{SMALL_FS}/{model.name}"
    data = yaml.safe_load(inventory(bench.tmp / "disk.yml", bench.hosts, env=bench.env).read_text())
    settings = data["all"]["vars"]
    settings.pop("vllm_fleet_models")
    settings.update({
        "vllm_fleet_model": str(model), "vllm_fleet_max_model_len": MAX_MODEL_LEN, "vllm_fleet_build_model": False,
        "vllm_fleet_prepare_model": True, "model_cache_dir": where, "model_cache_fanout": 1,
    })  # fmt: skip
    (bench.tmp / "disk.yml").write_text(yaml.safe_dump(data))
    prepare = ("--tags", "prepare", "-e", f"vllm_fleet_artifacts_dir={bench.tmp / 'artifacts-disk'}")
    room = f"$(( $(df --output=avail -B1 {SMALL_FS} | tail -n 1) - 4194304 ))"
    ssh("node2", f"rm -rf {SMALL_FS}/* && fallocate -l {room} {SMALL_FS}/filler")
    t0 = time.monotonic()
    full = run_playbook("site.yml", bench.tmp / "disk.yml", *prepare, timeout=1200)
    stopped_s = time.monotonic() - t0
    said = sorted({m.group(0) for m in re.finditer(r"node2: no room for the model at [^\n']*", full.stdout)})
    if not said:
        said = [failures(full, tail=300)[:600]]
    left = ssh("node2", f"find {SMALL_FS} -mindepth 1 -not -name filler", check=False).split()
    ssh("node2", f"rm -f {SMALL_FS}/filler")
    again = run_playbook("site.yml", bench.tmp / "disk.yml", *prepare, timeout=1200)
    whole = {n: ssh(n, f"stat -c %s {where}/model.safetensors", check=False).strip() for n in ("node1", "node2")}
    for name in ("node1", "node2", "node3"):
        ssh(name, f"rm -rf {SMALL_FS}/*", check=False)
    return {
        "detect_s": round(stopped_s), "serving_s": None,
        "notes": f"the run stopped (rc {full.returncode}) after {stopped_s:.0f} s, saying: {said[:1]}; "
                 f"on node2 after it: {left or 'nothing but the filler'}; "
                 f"once freed, the re-run rc {again.returncode}, "
                 f"the shard's bytes per node: {whole}; serving was not touched",
    }  # fmt: skip


def why_lines(text: str) -> list[str]:
    """What `vllm-fleet status -i` says of the unhealthy instances (its notes) and its last line."""
    lines = text.strip().splitlines()
    said = [line.strip() for line in lines if line.startswith(("tiny-", "    "))]
    return said[:8] + lines[-1:]


RAY_STATUS = (
    "RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=/etc/vllm-fleet/ray/auth_token /opt/vllm-fleet/ray/bin/python "
    "/etc/vllm-fleet/ray/ray_probe.py --address {head}:6379 status"
)


def ray_members(bench: Bench) -> dict[str, str]:
    """Ray's view from the head: each member node's IP and node id ({} while the head does not answer)."""
    out = ssh("node1", RAY_STATUS.format(head=bench.address("node1")), timeout=60, check=False)
    try:
        return {m["ip"]: m["id"] for m in json.loads(out)["members"]}
    except (ValueError, KeyError, TypeError):
        return {}


def ray_play(bench: Bench, state: str = "present") -> Run:
    """ray_cluster (systemd runtime, logical GPUs) on the three hosts: tests/bench/ray_join.yml."""
    env = {"VLLM_FLEET_BENCH_TOKEN": str(bench.tmp / "ray.token")}
    return run_playbook(ROOT / "tests/bench/ray_join.yml", nodes.INVENTORY, "-e", f"ray_cluster_state={state}",
                        env=env, timeout=1800)  # fmt: skip


def fault_ray(bench: Bench) -> dict[str, Any]:
    """Ray's head restarts (its unit on node1): every worker must join the new head on its own. The
    vLLM CPU build refuses the Ray executor, so this cluster is Ray's alone (ray_join.yml), beside
    the deployment above."""
    up = ray_play(bench)
    if up.returncode != 0:
        return {"detect_s": None, "serving_s": None, "notes": "Ray did not come up: " + failures(up, tail=400)[-400:]}
    before = ray_members(bench)
    ssh("node1", "systemctl restart vllm-fleet-ray.service")

    def rejoined() -> bool:
        now = ray_members(bench)
        return len(now) == len(before) and all(now.get(ip) not in (None, before[ip]) for ip in before)

    back = wait_until(rejoined, timeout=600, step=3)
    again = ray_play(bench)
    changed = {h: c["changed"] for h, c in _recap(again.stdout).items() if c["changed"]}
    gone = ray_play(bench, "absent")
    return {
        "detect_s": None, "serving_s": back,
        "notes": f"{len(before)} Ray nodes; every worker re-registered with the restarted head after "
                 f"{back and round(back)} s; the role's next run changed {changed or 0}; removed rc {gone.returncode}",
    }  # fmt: skip


RUNS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "ray": fault_ray,
    "reboot": fault_reboot,
    "worker": fault_worker,
    "partition": fault_partition,
    "killed": fault_killed,
    "disk": fault_disk,
    "refused": fault_refused,
}


def table(rows: list[dict[str, Any]]) -> str:
    head = ("fault", "detect s", "serving s", "requests", "failed", "failed streams", "next run changed")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        cells = (r["fault"], r.get("detect_s"), r.get("serving_s"), r["requests"], r["failed"],
                 r["failed_streams"], r["changed_after"])  # fmt: skip
        lines.append(" | ".join("-" if c is None else str(round(c) if isinstance(c, float) else c) for c in cells))
    notes = [f"- {r['fault']}: {r['notes']}" + (f" (errors: {r['errors']})" if r["errors"] else "") for r in rows]
    return "\n".join(["| " + line + " |" for line in lines] + ["", *notes])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    parser.add_argument("--keep", action="store_true", help="leave the deployment and the hosts up")
    args = parser.parse_args()
    chosen = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [f for f in chosen if f not in RUNS]
    if unknown:
        parser.error(f"unknown fault(s) {unknown}: choose from {', '.join(FAULTS)}")
    started = not nodes.active()
    hosts = nodes.up(3)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="vllm-fleet-faults-") as tmp:
        bench = Bench(hosts, Path(tmp), inventory(Path(tmp) / "hosts.yml", hosts), Path(tmp) / "artifacts")
        say("deploying (site.yml)")
        start = time.monotonic()
        first = bench.site()
        if first.returncode != 0:
            print(failures(first), file=sys.stderr)
            return 1
        say(f"deployed in {time.monotonic() - start:.0f} s")
        bench.plan = json.loads((bench.artifacts / "plan.json").read_text())
        placed = {i["name"]: (i["executor"], i["nodes"]) for i in bench.plan["instances"]}
        say(f"instances: {placed}")
        bench.load = Load(bench.gateway)
        bench.load.start()
        time.sleep(10)
        try:
            for name in chosen:
                say(f"fault: {name}")
                t0 = time.monotonic()
                row = {"fault": name, **RUNS[name](bench)}
                row["changed_after"] = bench.changed_after()
                row.update(bench.load.between(t0, time.monotonic()))
                say(json.dumps(row))
                rows.append(row)
        finally:
            bench.load.close()
            if not args.keep:
                down = run_playbook("playbooks/teardown.yml", bench.inventory, timeout=900)
                if down.returncode != 0:
                    say("teardown failed: " + failures(down, tail=800))
                if started:
                    nodes.down()
    print(f"\nFaults on the test hosts, {time.strftime('%Y-%m-%d')} (host runtime, 2 shared cores)\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
