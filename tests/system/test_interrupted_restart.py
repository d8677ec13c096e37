"""A run stopped after writing a service's files but before restarting it must not
leave the old process running: the next run restarts it, although it finds the
files already as wanted. Both tests write the new files by hand (what the stopped
run had written), check that nothing restarted, run the role, and check that the
process was restarted with the new settings; a further run changes nothing.

- dockerd on node1 (the docker role): daemon.json gets a label; `docker info`
  shows it only after the restart.
- two systemd units on node1 (the vllm_server role, systemd runtime) running a
  stand-in for the vllm CLI (a tiny /health server) from a venv path the test
  fills, so no vLLM is installed: a new API key written to the serving launch's
  environment file restarts that unit (its /proc/<pid>/environ has the new key)
  and leaves the other one alone.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path

import yaml

from tests.conftest import run_playbook
from tests.hosts import nodes
from tests.hosts.nodes import ssh_argv
from tests.system.conftest import Hosts
from tests.system.test_site_on_hosts import _recap

NODE = "node1"

# As roles/docker/molecule/default/converge.yml: what dockerd needs on these unprivileged hosts.
DOCKER_OPTIONS: dict[str, object] = {
    "default-ulimits": {
        "memlock": {"Name": "memlock", "Hard": 8388608, "Soft": 8388608},
        "nofile": {"Name": "nofile", "Hard": 20000, "Soft": 20000},
    },
    "ip-forward": False,
    "iptables": False,
    "bridge": "none",
}
LABEL = "vllm-fleet.test=interrupted"

VENV = "/opt/vf-interrupted/venv"
CONFIG_DIR = "/etc/vf-interrupted"
STATE_DIR = "/var/lib/vf-interrupted"
STAND_IN = '''#!/usr/bin/python3
"""A stand-in for the vllm CLI: --version, and `serve ... --port N` answering /health."""
import http.server
import sys

if "--version" in sys.argv:
    print("0.0.0+stand-in")
    sys.exit(0)
port = int(sys.argv[sys.argv.index("--port") + 1])


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''
# The serving launch gets VLLM_API_KEY in its environment file; the other one does not.
LAUNCHES = [
    {"name": f"vllm-vfint-{n}", "instance": f"vfint-{n}", "argv": ["vllm", "serve", "stand-in", "--port", str(port)],
     "env": {}, "port": port, "serves": serves, "role": "replica", "node_rank": 0, "predicted_kv_tokens": 0}
    for n, port, serves in (("a", 18311, True), ("b", 18312, False))
]  # fmt: skip


def _ssh(command: str, stdin: str | None = None, check: bool = True) -> str:
    result = subprocess.run(
        ssh_argv(NODE, command), input=stdin, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0 or not check, f"{command}: {result.stderr}"
    return result.stdout


def _main_pid(unit: str) -> int:
    return int(_ssh(f"systemctl show --property=MainPID --value {unit}").strip())


def _play(path: Path, body: Mapping[str, object], variables: Mapping[str, object]) -> Path:
    path.write_text(yaml.safe_dump([{"hosts": NODE, "gather_facts": True, "vars": dict(variables), **body}]))
    return path


def _run(play: Path) -> int:
    """Run the play on node1; return its changed= count."""
    result = run_playbook(play, nodes.INVENTORY, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return _recap(result.stdout)[NODE]["changed"]


def _docker_labels() -> list[str]:
    return json.loads(_ssh("docker info --format '{{json .Labels}}'"))  # type: ignore[no-any-return]


def _edit_daemon_json(code: str, then: str = "true", check: bool = True) -> None:
    """Change /etc/docker/daemon.json by hand (``d`` is its content) without restarting dockerd, then run ``then``."""
    script = f'import json; p = "/etc/docker/daemon.json"; d = json.load(open(p)); {code}; json.dump(d, open(p, "w"))'
    _ssh(f"python3 -c '{script}' && {then}", check=check)


def test_docker_restarts_for_a_daemon_json_an_interrupted_run_wrote(test_hosts: Hosts, tmp_path: Path) -> None:
    role = {"roles": ["docker"]}
    plain = _play(tmp_path / "plain.yml", role, {"docker_daemon_options": DOCKER_OPTIONS})
    labelled = _play(tmp_path / "labelled.yml", role, {"docker_daemon_options": {**DOCKER_OPTIONS, "labels": [LABEL]}})
    _run(plain)
    before = _main_pid("docker.service")
    try:
        # The stopped run wrote the label (what the role writes for this option) and did not restart dockerd.
        _edit_daemon_json(f'd["labels"] = ["{LABEL}"]')
        assert _main_pid("docker.service") == before and LABEL not in _docker_labels()

        assert _run(labelled) > 0
        after = _main_pid("docker.service")
        assert after != before, "dockerd was not restarted for the daemon.json on disk"
        assert LABEL in _docker_labels()

        assert _run(labelled) == 0
        assert _main_pid("docker.service") == after

        # An operator's hand edit (the label removed) restarts it too: the role keeps the file's own keys.
        _edit_daemon_json('d.pop("labels")')
        _run(plain)
        assert _main_pid("docker.service") != after and LABEL not in _docker_labels()
    finally:
        # Leave node1's dockerd without the label, whatever failed above.
        _edit_daemon_json('d.pop("labels", None)', then="systemctl restart docker", check=False)


def _vllm_vars(key: str, **extra: object) -> dict[str, object]:
    return {
        "vllm_server_launches": LAUNCHES,
        "vllm_server_runtime": "systemd",
        "vllm_server_supervisor": "systemd",
        "vllm_server_package": "",  # the venv holds the stand-in: nothing is installed
        "vllm_server_venv": VENV,
        "vllm_server_config_dir": CONFIG_DIR,
        "vllm_server_state_dir": STATE_DIR,
        "vllm_server_api_key": key,
        "vllm_server_hf_token": "",
        "vllm_server_wait": False,  # the stand-in prints no KV cache line
        **extra,
    }


def _api_key_of(pid: int) -> str:
    return _ssh(f"tr '\\0' '\\n' < /proc/{pid}/environ | sed -n 's/^VLLM_API_KEY=//p'").strip()


def test_a_unit_restarts_for_an_environment_file_an_interrupted_run_wrote(test_hosts: Hosts, tmp_path: Path) -> None:
    serving, other = (f"vllm-fleet-{launch['name']}.service" for launch in LAUNCHES)
    _ssh(f"install -D -m 0755 /dev/stdin {VENV}/bin/vllm", stdin=STAND_IN)
    role = {"roles": ["vllm_server"]}
    try:
        _run(_play(tmp_path / "a.yml", role, _vllm_vars("key-a-1f3e")))
        pids = _main_pid(serving), _main_pid(other)
        assert all(pids) and _api_key_of(pids[0]) == "key-a-1f3e"

        # The stopped run wrote the environment files for the new key (the role's own env.yml) and restarted nothing.
        env_only = {"tasks": [{"ansible.builtin.include_role": {"name": "vllm_server", "tasks_from": "env.yml"}}]}
        _run(_play(tmp_path / "env.yml", env_only, _vllm_vars("key-b-9c2d", __vllm_server_mode="systemd")))
        assert (_main_pid(serving), _main_pid(other)) == pids
        assert "key-b-9c2d" in _ssh(f"cat {CONFIG_DIR}/{LAUNCHES[0]['name']}.env")

        b = _play(tmp_path / "b.yml", role, _vllm_vars("key-b-9c2d"))
        assert _run(b) > 0
        restarted = _main_pid(serving)
        assert restarted not in (0, pids[0]), "the serving unit was not restarted for its environment file"
        assert _api_key_of(restarted) == "key-b-9c2d"
        assert _main_pid(other) == pids[1], "the unit whose files did not change was restarted"

        assert _run(b) == 0
        assert (_main_pid(serving), _main_pid(other)) == (restarted, pids[1])
    finally:
        run_playbook(_play(tmp_path / "absent.yml", role, _vllm_vars("", vllm_server_state="absent")), nodes.INVENTORY)
        _ssh(f"rm -rf /opt/vf-interrupted {CONFIG_DIR} {STATE_DIR}", check=False)
