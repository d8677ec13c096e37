"""The gateway's routing by model with real nginx and its njs module, on this machine: the
llm_gateway role's own templates (nginx.conf, route.js, api_key.conf) rendered by Ansible,
the upstream files written by the role's gateway_watch.py (--once), and two local HTTP
servers as the replicas of two models. What the system test (test_models_on_hosts) proves
with vLLM on the test hosts, checked here in seconds: the body reaches the named model's
replica intact, streaming passes through, an unknown model gets vLLM's 404, a body that is
not JSON or names no model gets 400, no key gets 401, and /v1/models merges both lists
(and still answers when one model's replicas are down)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import PLAYBOOK, ROOT, run_playbook

NJS = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
REQUIRED = os.environ.get("VLLM_FLEET_NJS_REQUIRED") == "1"
KEY = "routing-test-key"

if NGINX is None or not NJS.exists() or PLAYBOOK is None:
    if REQUIRED:
        raise RuntimeError("nginx with njs is required (apt-get install nginx libnginx-mod-http-js)")
    pytest.skip("nginx or its njs module is not installed", allow_module_level=True)


class _Replica(BaseHTTPRequestHandler):
    model = ""

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _json(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        else:
            self._json(404, {"error": "no route"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(3):
                self.wfile.write(f"data: {json.dumps({'model': self.model, 'i': i})}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True
            return
        self._json(200, {"model": self.model, "echo": body, "path": self.path})


def _serve(model: str) -> ThreadingHTTPServer:
    handler = type(f"Replica_{model}", (_Replica,), {"model": model})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PLAY = """
- name: Render the gateway's files for several models
  hosts: localhost
  gather_facts: false
  vars_files:
    - "{{ root }}/roles/llm_gateway/defaults/main.yml"
    - "{{ root }}/roles/llm_gateway/vars/main.yml"
  tasks:
    - name: Render each file
      ansible.builtin.copy:
        content: "{{ lookup('ansible.builtin.template', root ~ '/roles/llm_gateway/templates/' ~ item ~ '.j2') }}"
        dest: "{{ llm_gateway_config_dir }}/{{ item }}"
        mode: "0600"
      loop: [nginx.conf, route.js, api_key.conf]
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("gateway")
    replicas = {name: _serve(name) for name in ("alpha", "beta")}
    upstreams = {name: f"127.0.0.1:{s.server_address[1]}" for name, s in replicas.items()}
    port = _free_port()
    service = f"vllm-fleet-gateway-test-{port}"
    variables = {
        "root": str(ROOT),
        "ansible_managed": "Ansible managed",
        "llm_gateway_config_dir": str(tmp),
        "llm_gateway_state_dir": str(tmp),
        "llm_gateway_service": service,
        "llm_gateway_listen_address": "127.0.0.1",
        "llm_gateway_port": port,
        "llm_gateway_api_key": KEY,
        "llm_gateway_upstreams": list(upstreams.values()),
        "llm_gateway_models": [{"model": n, "upstreams": [u]} for n, u in upstreams.items()],
    }
    (tmp / "vars.yml").write_text(yaml.safe_dump(variables))
    (tmp / "hosts").write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    (tmp / "render.yml").write_text(PLAY)
    done = run_playbook(tmp / "render.yml", tmp / "hosts", "-e", f"@{tmp / 'vars.yml'}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    # The role's watcher writes the upstream files, one per model besides the full list.
    watch = {
        "upstreams": list(upstreams.values()),
        "upstream_conf": str(tmp / "upstream.conf"),
        "groups": [
            {"conf": str(tmp / f"upstream-{i}.conf"), "upstreams": [u]} for i, u in enumerate(upstreams.values())
        ],
        "server_args": "max_fails=2 fail_timeout=10s",
        "drain_dir": str(tmp / "drain"),
        "status": str(tmp / "status.json"),
        "pidfile": str(tmp / "none.pid"),
    }
    (tmp / "watch.json").write_text(json.dumps(watch))
    script = ROOT / "roles/llm_gateway/files/gateway_watch.py"
    subprocess.run([sys.executable, str(script), "--config", str(tmp / "watch.json"), "--once"], check=True)
    conf = tmp / "nginx.conf"
    # This machine's paths for the pid and logs (the role's are /run and /var/log/nginx).
    text = conf.read_text().replace(f"/run/{service}.pid", str(tmp / "nginx.pid"))
    conf.write_text(text.replace("/var/log/nginx/", f"{tmp}/"))
    check = subprocess.run([NGINX, "-t", "-q", "-c", str(conf)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen([NGINX, "-c", str(conf)], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    try:
        yield {"url": url, "replicas": replicas, "error_log": tmp / f"{service}.error.log"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for server in replicas.values():
            server.shutdown()


def _request(url: str, body: bytes | None, key: str | None = KEY) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_each_request_reaches_the_replica_of_the_model_it_names(gateway: dict[str, Any]) -> None:
    for name in ("alpha", "beta"):
        body = {"model": name, "prompt": "x" * 5000, "max_tokens": 4}  # larger than nginx's default buffer
        status, raw = _request(gateway["url"] + "/v1/completions", json.dumps(body).encode())
        assert status == 200, raw
        answer = json.loads(raw)
        assert (answer["model"], answer["echo"], answer["path"]) == (name, body, "/v1/completions")


def test_a_streamed_answer_passes_through(gateway: dict[str, Any]) -> None:
    body = json.dumps({"model": "beta", "messages": [], "stream": True}).encode()
    status, raw = _request(gateway["url"] + "/v1/chat/completions", body)
    assert status == 200 and raw.count(b"data: ") == 4 and raw.endswith(b"data: [DONE]\n\n"), raw


def test_bad_requests_get_the_openai_errors(gateway: dict[str, Any]) -> None:
    url = gateway["url"] + "/v1/completions"
    status, raw = _request(url, json.dumps({"model": "gamma", "prompt": "x"}).encode())
    assert status == 404
    assert json.loads(raw) == {
        "error": {
            "message": "The model `gamma` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    status, raw = _request(url, b"not json")
    assert status == 400 and json.loads(raw)["error"]["type"] == "BadRequestError"
    status, raw = _request(url, json.dumps({"prompt": "x"}).encode())
    assert status == 400 and "served: alpha, beta" in json.loads(raw)["error"]["message"]
    assert _request(url, json.dumps({"model": "alpha"}).encode(), key=None)[0] == 401
    assert _request(gateway["url"] + "/v1/models", None, key=None)[0] == 401


def test_the_model_list_merges_every_model_and_survives_one_down(gateway: dict[str, Any]) -> None:
    status, raw = _request(gateway["url"] + "/v1/models", None)
    assert status == 200
    assert [m["id"] for m in json.loads(raw)["data"]] == ["alpha", "beta"]
    gateway["replicas"]["beta"].shutdown()
    gateway["replicas"]["beta"].server_close()
    status, raw = _request(gateway["url"] + "/v1/models", None)
    assert status == 200 and [m["id"] for m in json.loads(raw)["data"]] == ["alpha"]
    assert "/v1/models without beta (no replica answered)" in gateway["error_log"].read_text()
