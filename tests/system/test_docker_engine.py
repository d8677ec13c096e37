"""The test Docker Engine runs the containers our roles will run: host network, large /dev/shm."""

from __future__ import annotations

import os
import time
import urllib.request
import uuid

from tests.hosts.engine import docker


def test_host_network_and_large_shm(docker_engine: str) -> None:
    out = docker(
        "run", "--rm", "--network", "host", "--shm-size", "2g", docker_engine,
        "sh", "-c", "readlink /proc/self/ns/net; df -k /dev/shm | tail -n 1",
    )  # fmt: skip
    netns, shm = out.strip().splitlines()
    assert netns == os.readlink("/proc/self/ns/net"), "the container does not share the host's network namespace"
    assert int(shm.split()[1]) >= 2 * 1024 * 1024, f"/dev/shm is smaller than 2 GiB: {shm}"


def test_service_on_host_network_answers_on_loopback(docker_engine: str) -> None:
    name = f"vf-test-{uuid.uuid4().hex[:8]}"
    port = 18731
    docker(
        "run", "--detach", "--name", name, "--network", "host", "--restart", "unless-stopped", docker_engine,
        "python3", "-m", "http.server", str(port), "--bind", "127.0.0.1",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as response:
                    assert response.status == 200
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        policy = docker("inspect", "--format", "{{.HostConfig.RestartPolicy.Name}}", name).strip()
        assert policy == "unless-stopped"
    finally:
        docker("rm", "--force", name, check=False)
