"""Secrets and names rendered into files on the nodes, by Ansible itself (on this
machine only, into a temporary folder): the gateway's key file and nginx.conf, the
launch's environment file and the unit. Each value must come out exactly as it went
in, and never break out of the line it is written on."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from typing import Any

import pytest

from tests.conftest import PLAYBOOK, ROOT, run_playbook
from vllm_fleet.agents.envfile import parse_env

pytestmark = pytest.mark.skipif(PLAYBOOK is None, reason="ansible-playbook not installed")

KEY = "k-$key ${x} \"dq\" 'sq' \\bs\\ #h; ^a.*$ {y} %z"
TRICKY = " a \"b\" 'c' $HOME ${PATH} #d ;e `f` \\g\\ 100% "
# Keys for the gateway, each rendered into its own folder; "" is no key.
KEYS = {
    "metacharacters": KEY, "plain": "plain-key-123", "one-letter": "a", "backslash": "\\", "quote": "'",
    "double-quote": '"', "dollar": "$", "tilde": "~x", "bearer-inside": "Bearer x", "escaped-quote": "x\\'y",
    "none": "",
}  # fmt: skip

# Template lookups on the controller: the same Jinja as the template module, one fast run.
PLAY = """
- name: Render the files that carry secrets and names
  hosts: localhost
  gather_facts: false
  vars:
    __vllm_server_mode: process
  tasks:
    - name: Render the gateway's files for each key
      ansible.builtin.set_fact:
        rendered: >-
          {{ rendered | default({}) | combine({file.0.key ~ '/' ~ file.1: lookup('ansible.builtin.template',
             root ~ '/roles/llm_gateway/templates/' ~ file.1 ~ '.j2',
             template_vars={'llm_gateway_api_key': file.0.value, 'ansible_managed': 'Ansible managed'})}) }}
      loop: "{{ keys | dict2items | product(['api_key.conf', 'nginx.conf']) | list }}"
      loop_control:
        loop_var: file
        label: "{{ file.0.key }}/{{ file.1 }}"

    - name: Render the launch's files
      ansible.builtin.set_fact:
        rendered: >-
          {{ rendered | combine({file.dest: lookup('ansible.builtin.template',
             root ~ '/roles/vllm_server/templates/' ~ file.src,
             template_vars={'item': launch, '__vllm_server_mode': file.mode, 'ansible_managed': 'Ansible managed'})}) }}
      loop:
        - {src: launch.env.j2, dest: process.env, mode: process}
        - {src: launch.env.j2, dest: container.env, mode: container}
        - {src: launch.secrets.j2, dest: container.secrets, mode: container}
        - {src: vllm.service.j2, dest: vllm.service, mode: systemd}
      loop_control:
        loop_var: file
        label: "{{ file.dest }}"

    - name: Write them down
      ansible.builtin.copy:
        dest: "{{ out }}/rendered.json"
        content: "{{ rendered | to_json }}"
        mode: "0600"
"""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One ansible-playbook run renders every file of this module: {"<key name>/api_key.conf": text, ...}."""
    tmp = tmp_path_factory.mktemp("rendered")
    launch = {
        "name": "vllm-t-0", "instance": "t-0\nExecStartPre=/bin/false 100%", "role": "head", "node_rank": 0,
        "serves": True, "argv": ["vllm", "serve", "/m"], "env": {"TRICKY": TRICKY, "PORT": 8000},
    }  # fmt: skip
    variables: dict[str, Any] = {
        "out": str(tmp), "root": str(ROOT), "keys": KEYS, "launch": launch,
        "llm_gateway_config_dir": "/etc/vllm-fleet/gateway", "llm_gateway_service": "vllm-fleet-gateway",
        "llm_gateway_upstreams": ["10.0.0.2:8000"], "llm_gateway_models": [], "llm_gateway_listen_address": "0.0.0.0",
        "llm_gateway_port": 8080, "llm_gateway_max_fails": 2, "llm_gateway_fail_timeout": "10s",
        "llm_gateway_keepalive": 32, "llm_gateway_connect_timeout": "5s", "llm_gateway_read_timeout": "3600s",
        "llm_gateway_client_max_body_size": "32m", "llm_gateway_client_body_buffer_size": "4m",
        "llm_gateway_tls_certificate": "",
        "llm_gateway_state_dir": "/var/lib/vllm-fleet/gateway", "llm_gateway_status_allow": [],
        "__llm_gateway_routers": [],
        "vllm_server_api_key": KEY, "vllm_server_hf_token": "", "vllm_server_env": {},
        # As roles/vllm_server/vars/main.yml computes it for this launch.
        "__vllm_server_launch_secrets": {"vllm-t-0": {"VLLM_API_KEY": KEY}},
        "vllm_server_config_dir": "/etc/vllm-fleet/vllm", "vllm_server_state_dir": "/var/lib/vllm-fleet/vllm",
        "vllm_server_venv": "/opt/vllm-fleet/vllm", "vllm_server_nofile": 65536,
        "__vllm_server_agents": "/var/lib/vllm-fleet/vllm/vllm_fleet_agents",
    }  # fmt: skip
    (tmp / "vars.json").write_text(json.dumps(variables))
    (tmp / "hosts").write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    (tmp / "render.yml").write_text(PLAY)
    done = run_playbook(tmp / "render.yml", tmp / "hosts", "-e", f"@{tmp / 'vars.json'}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    files: dict[str, str] = json.loads((tmp / "rendered.json").read_text())
    return files


def _nginx_unquote(token: str) -> str:
    """What nginx's configuration parser makes of a quoted token's inside (ngx_conf_read_token)."""
    out, i = [], 0
    while i < len(token):
        if token[i] == "\\" and i + 1 < len(token) and token[i + 1] in "\"'\\trn":
            out.append({"t": "\t", "r": "\r", "n": "\n"}.get(token[i + 1], token[i + 1]))
            i += 2
        else:
            out.append(token[i])
            i += 1
    return "".join(out)


def _key_pattern(api_key_conf: str) -> re.Pattern[str]:
    [line] = [ln.strip() for ln in api_key_conf.splitlines() if ln.strip().startswith("'~")]
    assert line.endswith("' 1;"), line
    regex = _nginx_unquote(line[1 : -len("' 1;")])
    # "~": a case-sensitive PCRE; a backslash before ASCII punctuation is a literal in PCRE and in Python.
    assert regex.startswith("~")
    return re.compile(regex[1:])


@pytest.mark.parametrize("name", [k for k in KEYS if KEYS[k]])
def test_the_gateway_matches_exactly_the_key(rendered: dict[str, str], name: str) -> None:
    key = KEYS[name]
    pattern = _key_pattern(rendered[f"{name}/api_key.conf"])
    assert pattern.search(f"Bearer {key}")
    for other in (f"Bearer {key}x", f"Bearer x{key}", f"bearer {key}", f"Bearer  {key}", "Bearer ", "Bearer .*"):
        assert not pattern.search(other), other
    if key.swapcase() != key:
        assert not pattern.search(f"Bearer {key.swapcase()}")


def test_nginx_conf_never_holds_the_key_and_does_not_change_with_it(rendered: dict[str, str]) -> None:
    conf = rendered["metacharacters/nginx.conf"]
    assert "k-$key" not in conf and "bs" not in conf
    assert "include /etc/vllm-fleet/gateway/api_key.conf;" in conf
    assert "if ($llm_gateway_key_ok = 0) {" in conf
    assert conf == rendered["none/nginx.conf"]


def test_without_a_key_every_request_passes(rendered: dict[str, str]) -> None:
    text = rendered["none/api_key.conf"]
    body = text[text.index("map $http_authorization $llm_gateway_key_ok {") :]
    assert [ln.strip() for ln in body.splitlines()] == [
        "map $http_authorization $llm_gateway_key_ok {",
        "default 1;",
        "}",
    ]


def test_the_env_file_carries_values_as_they_are(rendered: dict[str, str]) -> None:
    # systemd and the supervise agent read the same file the same way; a name cannot break out of its comment.
    assert parse_env(rendered["process.env"]) == {"TRICKY": TRICKY, "PORT": "8000", "VLLM_API_KEY": KEY}
    # community.docker reads KEY=VALUE literally (and strips the line).
    # It holds no secret: a container's environment is part of its configuration (docker inspect).
    container = [ln for ln in rendered["container.env"].splitlines() if not ln.startswith("#")]
    assert container == ["PORT=8000", f"TRICKY={TRICKY}"]
    # The key is in the secrets file, which the container's entry point reads with sh.
    script = 'set -a; . "$0"; set +a; printf %s "$VLLM_API_KEY"'
    with tempfile.NamedTemporaryFile("w", suffix=".secrets") as secrets:
        secrets.write(rendered["container.secrets"])
        secrets.flush()
        done = subprocess.run(["sh", "-c", script, secrets.name], capture_output=True, text=True, check=True, env={})
    assert done.stdout == KEY


def test_a_single_node_launch_backs_off_when_it_keeps_failing(rendered: dict[str, str]) -> None:
    [start] = [ln for ln in rendered["vllm.service"].splitlines() if ln.startswith("ExecStart=")]
    assert " reap --backoff-state /var/lib/vllm-fleet/vllm/vllm-t-0.backoff -- " in start, start


def test_the_unit_description_stays_one_line(rendered: dict[str, str]) -> None:
    unit = rendered["vllm.service"].splitlines()
    [description] = [ln for ln in unit if ln.startswith("Description=")]
    assert (
        description == "Description=vLLM t-0 ExecStartPre=/bin/false 100%% (head, node rank 0), started by vllm-fleet"
    )
    assert not any(ln.startswith("ExecStartPre") for ln in unit)
