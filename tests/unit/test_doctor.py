"""vllm-fleet doctor: each known failure mode that the bundle can show, and the CLI's exit codes."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vllm_fleet.cli import main
from vllm_fleet.ops import doctor


def _node(address: str, *, ib: bool = True) -> dict[str, Any]:
    return {
        "device": "cuda",
        "address": address,
        "interface": "ens1",
        "facts": {
            "gpu_count": 8,
            "gpu": "H100-SXM-80GB",
            "driver_version": "570.124.06",
            "cuda_version": "12.8",
            "shm_bytes": 64 << 30,
            "memlock_bytes": -1,
            "infiniband": [{"device": "mlx5_0", "port": "1", "gbps": 400.0, "state": "ACTIVE"}] if ib else [],
            "route_to_head": {"interface": "ens1", "address": address},
        },
        "fabric": {"nvswitches": 4, "service": "active", "version": "570.124.06"},
        "docker": {
            "runtimes": ["io.containerd.runc.v2", "nvidia", "runc"],
            "default_ulimits": {"memlock": {"Hard": -1}},
        },
        "image": {"id": "sha256:" + "a" * 64, "cuda_version": "12.8.1"},
        "model": {"files": 5, "bytes": 16 << 30, "problems": []},
        "versions": {"ray": "2.60.0", "vllm": "0.11.0", "python": "3.12.3"},
        "reach": {},
    }


def healthy() -> dict[str, Any]:
    nodes = {"node1": _node("10.0.0.1"), "node2": _node("10.0.0.2")}
    nodes["node1"]["reach"] = {"node2:6379": True, "node2:29500": True}
    nodes["node2"]["reach"] = {"node1:6379": True, "node1:29500": True}
    return {
        "head": "node1",
        "runtime": "container",
        "image": "vllm-fleet/serving:1",
        "model_path": "/srv/models/m",
        "nodes": nodes,
    }


def _status(bundle: dict[str, Any], name: str) -> doctor.Check:
    return next(c for c in doctor.evaluate(bundle) if c.name == name)


def test_a_healthy_cluster_passes_every_check() -> None:
    checks = doctor.evaluate(healthy())
    assert [c.status for c in checks] == ["PASS"] * len(checks), doctor.render(checks)
    assert doctor.exit_code(checks) == 0


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(bundle: dict[str, Any]) -> None:
        *keys, last = path.split(".")
        target = bundle
        for key in keys:
            target = target[key]
        target[last] = value

    return change


@pytest.mark.parametrize(
    ("change", "check", "words"),
    [
        (_set("nodes.node2.facts.gpu_count", 0), "gpu driver", "no GPU on node2"),
        (
            _set("nodes.node2.facts.cuda_version", "12.4"),
            "driver vs image CUDA",
            "node2 (driver supports CUDA 12.4, image has 12.8.1)",
        ),
        (
            _set("nodes.node2.fabric.service", "failed"),
            "fabric manager",
            "node2 (4 NVSwitches): nvidia-fabricmanager 570.124.06 is failed",
        ),
        (
            _set("nodes.node1.fabric", {"nvswitches": 4, "service": "inactive", "version": None}),
            "fabric manager",
            "node1 (4 NVSwitches): no nvidia-fabricmanager installed",
        ),
        (
            _set("nodes.node2.fabric.version", "570.86.15"),
            "fabric manager",
            "node2: nvidia-fabricmanager 570.86.15 beside driver 570.124.06",
        ),
        (_set("nodes.node1.docker.runtimes", ["runc"]), "container toolkit", "no nvidia runtime on node1"),
        (
            _set("nodes.node1.docker.default_ulimits", {"memlock": {"Hard": 8388608}}),
            "memlock / IPC_LOCK",
            "node1 (Docker's default memlock 8388608)",
        ),
        (_set("nodes.node2.image.id", "sha256:" + "b" * 64), "one image digest", "differs between nodes"),
        (_set("nodes.node2.image", None), "one image digest", "is not on node2"),
        (
            _set(
                "nodes.node2.model",
                {
                    "files": 5,
                    "bytes": 1 << 30,
                    "problems": ["model-00002.safetensors: 10 bytes, expected 99 (truncated or corrupt)"],
                },
            ),
            "model files",
            "node2: model-00002.safetensors",
        ),
        (_set("nodes.node2.model", None), "model files", "missing on node2"),
        (_set("nodes.node2.model.bytes", 1), "model files", "differs between nodes"),
        (
            _set("nodes.node2.facts.route_to_head", {"interface": "eth0", "address": "192.168.1.2"}),
            "address = route to head",
            "node2 uses 10.0.0.2 but reaches the head from 192.168.1.2 (eth0)",
        ),
        (
            _set("nodes.node2.facts.route_to_head", {"interface": "eth0", "address": "10.0.0.2"}),
            "address = route to head",
            "node2 names interface ens1 but the route to the head leaves by eth0",
        ),
        (
            _set("nodes.node2.reach", {"node1:6379": True, "node1:29500": False}),
            "ports between members",
            "node2 -> node1:29500",
        ),
        (_set("nodes.node2.versions.ray", "2.49.0"), "same Ray/vLLM/Python", "ray: node1 2.60.0, node2 2.49.0"),
    ],
)
def test_each_failure_is_named_with_its_fix(change: Callable[[dict[str, Any]], None], check: str, words: str) -> None:
    bundle = healthy()
    change(bundle)
    result = _status(bundle, check)
    assert result.status == "FAIL" and words in result.detail and result.fix, result
    others = [c for c in doctor.evaluate(bundle) if c.name != check and c.status == "FAIL"]
    assert others == [], others


def test_systemd_runtime_checks_the_hosts_shm_and_memlock() -> None:
    bundle = healthy()
    bundle["runtime"] = "systemd"
    bundle["nodes"]["node1"]["facts"]["shm_bytes"] = 64 << 20
    bundle["nodes"]["node2"]["facts"]["memlock_bytes"] = 8 << 20
    assert "node1 64 MiB" in _status(bundle, "/dev/shm").detail
    assert "node2 (ulimit -l 8388608)" in _status(bundle, "memlock / IPC_LOCK").detail
    assert _status(bundle, "container toolkit").status == "SKIP"
    assert _status(bundle, "one image digest").status == "SKIP"


def test_without_infiniband_memlock_does_not_matter() -> None:
    bundle = healthy()
    for node in bundle["nodes"].values():
        node["facts"]["infiniband"] = []
        node["docker"]["default_ulimits"] = {}
    assert _status(bundle, "memlock / IPC_LOCK").status == "PASS"


@pytest.mark.parametrize(
    "fabric",
    [None, {"nvswitches": 0}, "absent"],
    ids=["not-probed", "pcie-board-no-nvswitch", "bundle-without-the-key"],
)
def test_without_nvswitches_no_fabric_manager_is_needed(fabric: dict[str, Any] | str | None) -> None:
    bundle = healthy()
    for node in bundle["nodes"].values():
        if fabric == "absent":
            del node["fabric"]
        else:
            node["fabric"] = fabric
    check = _status(bundle, "fabric manager")
    assert check.status == "SKIP" and "no node has NVSwitches" in check.detail


def test_the_fabric_manager_fix_names_the_role_and_the_journal() -> None:
    bundle = healthy()
    bundle["nodes"]["node1"]["fabric"]["service"] = "failed"
    check = _status(bundle, "fabric manager")
    assert "system not yet initialized" in check.detail
    assert "nvidia_driver" in check.fix and "journalctl -u nvidia-fabricmanager" in check.fix
    assert _status(healthy(), "fabric manager").detail.endswith("on 2 NVSwitch node(s)")


def test_a_cpu_deployment_skips_the_gpu_checks() -> None:
    bundle = {
        "head": "localhost",
        "runtime": "systemd",
        "nodes": {"localhost": {"device": "cpu", "facts": {"gpu_count": 0}}},
    }
    statuses = {c.name: c.status for c in doctor.evaluate(bundle)}
    assert statuses["gpu driver"] == statuses["container toolkit"] == statuses["fabric manager"] == "SKIP"
    assert "FAIL" not in statuses.values()


def test_the_cli_exit_codes_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(healthy()))
    assert main(["doctor", "--bundle", str(good)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("PASS  gpu driver") and lines[-1] == "11 checks: no failure"

    bad = copy.deepcopy(healthy())
    bad["nodes"]["node2"]["versions"]["vllm"] = "0.10.2"
    broken = tmp_path / "bad.json"
    broken.write_text(json.dumps(bad))
    assert main(["doctor", "--bundle", str(broken), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and [c["name"] for c in report["checks"] if c["status"] == "FAIL"] == [
        "same Ray/vLLM/Python"
    ]

    (tmp_path / "empty.json").write_text("{}")
    assert main(["doctor", "--bundle", str(tmp_path / "empty.json")]) == 2
    assert "no 'nodes' mapping" in capsys.readouterr().err
    assert main(["doctor", "--bundle", str(tmp_path / "absent.json")]) == 2
    with pytest.raises(SystemExit) as usage:
        main(["doctor"])
    assert usage.value.code == 2


@pytest.mark.parametrize(
    ("bundle", "words"),
    [
        ({"head": "a", "nodes": {"a": "not a node"}}, "nodes a are not mappings"),
        ({"head": "a", "nodes": {"a": {"facts": {"gpu_count": 8, "infiniband": "mlx5_0"}}}}, "malformed bundle"),
        ({"head": "b", "nodes": {"a": {}}}, "'head' (b) is not one of its nodes"),
    ],
)
def test_a_malformed_bundle_is_one_line_not_a_traceback(
    bundle: dict[str, Any], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(bundle))
    assert main(["doctor", "--bundle", str(path)]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "--bundle" in err


def test_a_nodes_part_of_the_bundle_from_what_the_play_registered() -> None:
    """playbooks/doctor.yml registers each probe's result and hands them over unparsed: a skipped
    probe (the systemd runtime asks no Docker), a failed one (no image) and a Docker answer each
    give the part the checks read."""
    inputs = doctor.inputs_of(
        {"runtime": "container", "gpu": "H100-SXM", "interface": "eth1"},
        {"ray_cluster_image": "vllm-fleet/serving:1", "ray_cluster_venv": "/srv/ray"},
        "10.0.0.5",
        "n1",
    )
    assert inputs == {
        "runtime": "container", "image": "vllm-fleet/serving:1", "model_path": "", "ray_python": "/srv/ray/bin/python",
        "address": "10.0.0.5", "interface": "eth1", "device": "cuda",
    }  # fmt: skip
    daemon = base64.b64encode(json.dumps({"default-ulimits": {"memlock": {"Hard": -1, "Soft": -1}}}).encode())
    inspected = [{"Id": "sha256:abc", "Config": {"Env": ["PATH=/usr/bin", "CUDA_VERSION=12.8.1"]}}]
    results = {
        "pci": {"rc": 0, "stdout": '{"nvswitches": 4}'},
        "fabric": {"rc": 0, "stdout": '{"service": "active", "version": "570.124.06"}'},
        "docker": {"rc": 0, "stdout": '{"nvidia": {}, "runc": {}}'},
        "daemon": {"content": daemon.decode()},
        "image": {"rc": 0, "stdout": json.dumps(inspected)},
        "model": {"skipped": True},
        "versions": {"skipped": True},
        "reach": {"rc": 0, "stdout": '{"n2:29599": true}'},
    }
    part = doctor.gathered(results, inputs, {"gpu_count": 8})
    assert part["fabric"] == {"nvswitches": 4, "service": "active", "version": "570.124.06"}
    assert part["docker"] == {"runtimes": ["nvidia", "runc"], "default_ulimits": {"memlock": {"Hard": -1, "Soft": -1}}}
    assert part["image"] == {"id": "sha256:abc", "cuda_version": "12.8.1"}
    assert (part["model"], part["versions"], part["reach"]) == (None, {}, {"n2:29599": True})
    assert (part["device"], part["address"], part["facts"]) == ("cuda", "10.0.0.5", {"gpu_count": 8})

    systemd = doctor.inputs_of({"runtime": "systemd", "gpu": "cpu"}, {}, None, "n2")
    assert (systemd["device"], systemd["address"], systemd["ray_python"]) == (
        "cpu",
        "n2",
        "/opt/vllm-fleet/ray/bin/python",
    )
    bare = doctor.gathered(
        {"pci": {"skipped": True}, "fabric": {"skipped": True}, "docker": {"rc": 1, "stdout": ""},
         "daemon": {"failed": True, "msg": "file not found"}, "image": {"rc": 1, "stdout": ""},
         "model": {"rc": 0, "stdout": '{"files": 3, "bytes": 10, "problems": []}'},
         "versions": {"rc": 0, "stdout": '{"python": "3.11.2", "ray": "2.60.0"}'}, "reach": {"skipped": True}},
        systemd, {},
    )  # fmt: skip
    assert (bare["fabric"], bare["docker"], bare["image"], bare["reach"]) == (None, None, None, {})
    assert bare["model"]["files"] == 3 and bare["versions"]["ray"] == "2.60.0"
    bundle = {"head": "n2", "runtime": "systemd", "nodes": {"n2": bare}}
    assert doctor.evaluate(bundle), "the checks read the part as the playbook used to build it"
