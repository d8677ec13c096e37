"""The llm_gateway role's nginx on this machine, for tests and benchmarks that need no
test host: the role's own templates (nginx.conf, route.js, api_key.conf) rendered by
Ansible with the role's defaults and vars, the upstream files written by the role's
the gateway_watch agent (--once), nginx in the foreground on a free loopback port, and local
HTTP servers standing in as replicas (tests/integration/test_gateway_routing.py,
tests/bench/routing_overhead.py). Needs nginx and, for several models, its njs module."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT, agent, run_playbook

NJS = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)

PLAY = """
- name: Render the gateway's files
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
      loop: "{{ ['nginx.conf', 'api_key.conf'] + (['route.js'] if llm_gateway_models else []) }}"
"""


class Replica(BaseHTTPRequestHandler):
    """A stand-in replica: /health, /v1/models (its model), and POST answered with the model,
    the request's JSON body and path; ``"stream": true`` gets three SSE events and [DONE];
    ``down`` (set on the server's handler class) answers 503 to everything."""

    model = ""
    down = False  # True: every request gets 503 (a replica that fails)
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's server
    disable_nagle_algorithm = True  # headers and body in two writes must not wait for a delayed ACK

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if self.down:
            self._json(503, {"error": "down"})
        elif self.path == "/health":
            self._json(200, {})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        else:
            self._json(404, {"error": "no route"})

    def do_POST(self) -> None:
        if self.down:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._json(503, {"error": "down"})
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(3):
                self.wfile.write(f"data: {json.dumps({'model': self.model, 'i': i})}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True
            return
        self._json(200, {"model": self.model, "echo": body, "path": self.path})


def replica(model: str) -> ThreadingHTTPServer:
    handler = type(f"Replica_{model}", (Replica,), {"model": model})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def gateway(
    tmp: Path, models: dict[str, list[str]], key: str = "", route_by_model: bool = True
) -> Iterator[dict[str, Any]]:
    """nginx with the role's configuration in front of ``models`` (served name -> upstreams).
    ``route_by_model``: the several-models configuration (njs); else one upstream group."""
    if NGINX is None:
        raise RuntimeError("nginx is not installed")
    upstreams = [u for ups in models.values() for u in ups]
    port = free_port()
    service = f"vllm-fleet-gateway-local-{port}"
    routes = [{"model": n, "upstreams": u} for n, u in models.items()] if route_by_model else []
    variables = {
        "root": str(ROOT),
        "ansible_managed": "Ansible managed",
        "llm_gateway_config_dir": str(tmp),
        "llm_gateway_state_dir": str(tmp),
        "llm_gateway_service": service,
        "llm_gateway_listen_address": "127.0.0.1",
        "llm_gateway_port": port,
        "llm_gateway_api_key": key,
        "llm_gateway_upstreams": upstreams,
        "llm_gateway_models": routes,
    }
    (tmp / "vars.yml").write_text(yaml.safe_dump(variables))
    (tmp / "hosts").write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    (tmp / "render.yml").write_text(PLAY)
    done = run_playbook(tmp / "render.yml", tmp / "hosts", "-e", f"@{tmp / 'vars.yml'}")
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-3000:] + done.stderr[-2000:])
    # The role's watcher writes the upstream files: the full list, and one per model.
    watch = {
        "upstreams": upstreams,
        "upstream_conf": str(tmp / "upstream.conf"),
        "groups": [
            {"conf": str(tmp / f"upstream-{i}.conf"), "upstreams": r["upstreams"]} for i, r in enumerate(routes)
        ],
        "server_args": "max_fails=2 fail_timeout=10s",
        "drain_dir": str(tmp / "drain"),
        "status": str(tmp / "status.json"),
        "pidfile": str(tmp / "none.pid"),
    }
    (tmp / "watch.json").write_text(json.dumps(watch))
    subprocess.run(
        [*agent("gateway_watch"), "--config", str(tmp / "watch.json"), "--once"], check=True, capture_output=True
    )
    conf = tmp / "nginx.conf"
    # This machine's paths for the pid and logs (the role's are /run and /var/log/nginx).
    text = conf.read_text().replace(f"/run/{service}.pid", str(tmp / "nginx.pid"))
    conf.write_text(text.replace("/var/log/nginx/", f"{tmp}/"))
    check = subprocess.run([NGINX, "-t", "-q", "-c", str(conf)], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise RuntimeError(f"nginx -t: {check.stderr}")
    proc = subprocess.Popen([NGINX, "-c", str(conf)], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    try:
        yield {"url": url, "port": port, "error_log": tmp / f"{service}.error.log"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
