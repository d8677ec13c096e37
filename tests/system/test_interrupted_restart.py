"""A run stopped after writing a service's files but before restarting it must not
leave the old process running: the next run restarts it, although it finds the
files already as wanted. Both tests write the new files by hand (what the stopped
run had written), check that nothing restarted, run the role, and check that the
process was restarted with the new settings; a further run changes nothing.

- dockerd on node1 (the docker role): daemon.json gets a label; `docker info`
  shows it only after the restart.
- vLLM's units are checked the same way on a real deployment:
  tests/system/test_multinode.py (both ranks' environment files written by hand,
  the re-run restarts the group although the files are unchanged).
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
