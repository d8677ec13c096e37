"""The README's main command for real: site.yml on inventories/local starts a Ray
head, serves the tiny model with vLLM's CPU build on this machine behind nginx,
and verify passes. A second run changes nothing; teardown stops all three."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from tests.conftest import ROOT, run_playbook, run_site
from tests.system.test_site_on_hosts import _recap

INVENTORY = ROOT / "inventories/local"


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_local_default_serves_and_verifies(tmp_path: Path) -> None:
    first = run_site(INVENTORY, tmp_path, timeout=1800)
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]
    rows = json.loads((tmp_path / "verify.json").read_text())
    assert [(r["via"], r["ok"]) for r in rows] == [("gateway", True), ("direct", True)], rows
    assert rows[1]["kv"]["verdict"] == "match", rows[1]
    assert rows[1]["first_token_s"] is not None
    assert "2 endpoint(s) verified" in first.stdout
    # The cluster phase started a Ray head here (vllm_fleet_ray: always); verify showed its status.
    assert "Ray cluster vllm-fleet-ray: 1 nodes, 1.0 GPUs, head 127.0.0.1:6379" in first.stdout
    assert "0.0/1.0 GPU" in first.stdout

    again = run_site(INVENTORY, tmp_path, timeout=900)
    assert again.returncode == 0, again.stdout[-4000:]
    assert _recap(again.stdout)["localhost"]["changed"] == 0, again.stdout[-4000:]

    down = run_playbook("playbooks/teardown.yml", INVENTORY)
    assert down.returncode == 0, down.stdout[-3000:]
    assert not any(_listening(p) for p in (8000, 8080, 6379)), "vLLM, the gateway or Ray still listens after teardown"
