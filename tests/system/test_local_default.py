"""The README's main command for real: site.yml on inventories/local starts a Ray
head, serves the tiny model with vLLM's CPU build on this machine behind nginx,
and verify passes.

Secrets and exposure on the same deployment:
* the first run is `make run`'s (no API key), at -vvv, with a Hub token and a Ray token
  from an Ansible Vault file: no secret in its output, the artifacts, a world-readable file
  or the journal, and every listener of the deployment on loopback;
* the serve phase again with an API key (-vvv): the gateway opens beyond loopback, guarded,
  and the key shows nowhere;
* the verify phase at -vvv while every process's command line and environment are sampled
  (secrets_watch.py) never shows the key.
A second run changes nothing; an inventory turning on n-gram speculative decoding serves with
it and vLLM's KV tokens equal the plan's; teardown stops all three."""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from pathlib import Path

from tests.conftest import ROOT, failures, run_playbook
from tests.integration.test_secrets_verbose import leaks, vault_file
from tests.system.exposure import journal_with, listeners, world_readable_with
from tests.system.secrets_watch import Watch, holders
from tests.system.test_site_on_hosts import _recap

INVENTORY = ROOT / "inventories/local"
VLLM = b"/opt/vllm-fleet/vllm/bin/vllm"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _beyond_loopback() -> tuple[list[str], list[str]]:
    """The deployment's listeners (vLLM, nginx, Ray: by their unit or command line) as
    'address:port what': all of them, and those beyond loopback that are not Ray's. Ray's
    servers bind every interface whatever their node address (Ray has no setting for it); what
    guards them is Ray's token (RAY_AUTH_MODE=token, checked on every such process or its parent) and,
    where the inventory turns it on, ray_cluster_firewall."""
    held, beyond = set(), set()
    for x in listeners():
        if not x.ours:
            continue
        shown = f"{x.address}:{x.port} {x.unit or x.command[:60]}"
        held.add(shown)
        if x.loopback:
            continue
        if "ray" in (x.unit + x.command).lower():
            assert x.started_with(b"RAY_AUTH_MODE=token"), f"Ray listens beyond loopback without its token: {shown}"
        else:
            beyond.add(shown)
    return sorted(held), sorted(beyond)


def test_local_default_serves_verifies_and_never_shows_the_key(tmp_path: Path) -> None:
    # Shell and nginx metacharacters on purpose: the env files and the gateway's key file must carry them.
    # The random part is what is looked for: a shell-quoted copy of the key still holds it in one piece.
    token = secrets.token_hex(12)
    key = f"vf-{token}-$a\"b'c\\d#e%f"
    vaulted = {"vllm_fleet_hf_token": f"hf_{secrets.token_hex(12)}", "ray_cluster_auth_token": secrets.token_hex(32)}
    vault, password = vault_file(tmp_path / "secrets.yml", vaulted)
    scanned = {"api key": token.encode(), **{k: v.encode() for k, v in vaulted.items()}}
    with_vault = ("-e", f"@{vault}", "--vault-password-file", str(password))
    env = {"VLLM_API_KEY": key}
    artifacts = f"vllm_fleet_artifacts_dir={tmp_path / 'artifacts'}"
    since = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        # make run: no API key. Every secret it has stays out of everything it writes and prints.
        first = run_playbook("site.yml", INVENTORY, "-vvv", "-e", artifacts, *with_vault, timeout=1800)
        assert first.returncode == 0, failures(first)
        output = first.stdout + first.stderr
        # The scans are meaningful: -vvv printed each node's record, and the plan phase wrote every
        # node's settings with the role variables that once carried the Ray token (a fact printed at -v).
        assert "vllm_fleet_node:" in output, "-vvv did not print the record it should"
        settings = json.loads((tmp_path / "artifacts/plan-inputs.json").read_text())["settings"]
        assert [v.get("ray_cluster_num_cpus") for v in settings["role_vars"].values()] == [1], settings["role_vars"]
        assert leaks(vaulted, output, tmp_path / "artifacts") == []
        assert world_readable_with(scanned) == [] and journal_with(scanned, since) == []
        rows = json.loads((tmp_path / "artifacts/verify.json").read_text())
        assert [(r["via"], r["ok"]) for r in rows] == [("gateway", True), ("direct", True)], rows
        assert rows[1]["kv"]["verdict"] == "match", rows[1]
        assert rows[1]["first_token_s"] is not None
        assert "2 endpoint(s) verified" in first.stdout
        # The cluster phase started a Ray head here (vllm_fleet_ray: always); verify showed its status.
        assert "Ray cluster vllm-fleet-ray: 1 nodes, 1.0 GPUs, head 127.0.0.1:6379" in first.stdout
        assert "0.0/1.0 GPU" in first.stdout
        # Without a key nothing of the deployment listens beyond loopback (the gateway included),
        # but Ray's servers, which its token guards.
        held, beyond = _beyond_loopback()
        assert "127.0.0.1:8080" in " ".join(held) and "127.0.0.1:8000" in " ".join(held), held
        assert beyond == [], held

        # With an API key the gateway opens (guarded by the key); the key shows nowhere.
        keyed = run_playbook("site.yml", INVENTORY, "--tags", "serve", "-vvv", "-e", artifacts, *with_vault, env=env)
        assert keyed.returncode == 0, failures(keyed)
        assert leaks({"api key": token}, keyed.stdout + keyed.stderr, tmp_path / "artifacts") == []
        assert world_readable_with(scanned) == [] and journal_with(scanned, since) == []
        _, beyond = _beyond_loopback()
        assert [x.split()[0] for x in beyond] == ["0.0.0.0:8080"], beyond

        # What may hold the key in its environment: vLLM (VLLM_API_KEY by design) and the processes
        # that held it before, and ansible-playbook with what it starts on a local connection
        # (this test gave it the key); the verify probe never, and no command line ever.
        before = holders(token.encode())
        assert any(VLLM in p.cmdline for p in before.values()), "vLLM does not run with this key (VLLM_API_KEY)"
        with Watch(token.encode(), allowed_roots=set(before) | {os.getpid()}) as watch:
            verified = run_playbook(
                "site.yml", INVENTORY, "--tags", "verify", "-vvv", "-e", artifacts, *with_vault, env=env
            )
        assert verified.returncode == 0, failures(verified)
        assert "endpoint(s) verified" in verified.stdout
        output = verified.stdout + verified.stderr
        assert token not in output, [line.replace(token, "<KEY>") for line in output.splitlines() if token in line][:5]
        assert watch.rounds >= 10 and watch.probe_seen > 0, f"{watch.rounds} samples, probe seen {watch.probe_seen}x"
        assert watch.findings == [], sorted(set(watch.findings))[:20]

        again = run_playbook("site.yml", INVENTORY, "-e", artifacts, *with_vault, env=env, timeout=900)
        assert again.returncode == 0, failures(again)
        assert _recap(again.stdout)["localhost"]["changed"] == 0, again.stdout[-4000:]

        # An option only the CLI reached before issue 30, now from an inventory (one more source
        # next to the local one): n-gram speculative decoding. It plans, serves (vLLM runs with
        # the rendered --speculative-config) and vLLM's KV tokens are the plan's.
        ngram = tmp_path / "ngram.yml"
        ngram.write_text(json.dumps({"all": {"vars": {"vllm_fleet_speculative_config": NGRAM}}}))
        spec = run_playbook(
            "site.yml", INVENTORY, "-i", str(ngram), "--tags", "serve,verify", "-e", artifacts, *with_vault, env=env
        )
        assert spec.returncode == 0, failures(spec)
        planned = json.loads((tmp_path / "artifacts/plan.json").read_text())["instances"][0]["vllm_args"]
        rendered = json.dumps(NGRAM, sort_keys=True, separators=(",", ":"))
        assert planned[planned.index("--speculative-config") + 1] == rendered, planned
        assert any(rendered.encode() in p.cmdline for p in holders(token.encode()).values()), "vLLM runs without it"
        rows = json.loads((tmp_path / "artifacts/verify.json").read_text())
        assert [(r["via"], r["ok"]) for r in rows] == [("gateway", True), ("direct", True)], rows
        assert rows[1]["kv"]["verdict"] == "match", rows[1]
    finally:
        down = run_playbook("playbooks/teardown.yml", INVENTORY)
        assert down.returncode == 0, failures(down)
    assert not any(_listening(p) for p in (8000, 8080, 6379)), "vLLM, the gateway or Ray still listens after teardown"
