"""llm_gateway's vllm-router balancer on this machine, with the real router (vllm-router from
PyPI, the release the role installs): the role's launcher starts it with the replicas' key
read from a 0600 file (never on its command line), and the gateway's watcher sets its
workers through the router's admin API: replicas in rotation are added, a drained or
failing one is removed, and a router that restarted gets its workers back in one round.
Upstreams are small HTTP servers that record what reaches them (the role's Molecule and
system tests put real nginx and real vLLM around the same router)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.hosts import images
from tests.hosts.common import HarnessError
from vllm_fleet.agents import gateway_watch as gw

LAUNCHER = ROOT / "roles/llm_gateway/files/router_launch.py"
KEY = "router-test-key-0b7c"


class Replica(ThreadingHTTPServer):
    """/health answers 200 while ``ok``, else 500; a POST answers JSON naming this replica and
    records (path, Authorization header)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ok = True
        self.posts: list[tuple[str, str | None]] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        server = self.server
        assert isinstance(server, Replica)
        self._send(200 if self.path == "/health" and server.ok else 500 if self.path == "/health" else 404, b"{}")

    def do_POST(self) -> None:
        server = self.server
        assert isinstance(server, Replica)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        server.posts.append((self.path, self.headers.get("Authorization")))
        if self.path.endswith("/render"):  # the cache-aware policy's tokenization: not offered here
            self._send(404, b"{}")
            return
        self._send(200, json.dumps({"served_by": server.address, "choices": [{"text": "x"}]}).encode())


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def router_python() -> Path:
    try:
        return images.router_venv() / "bin" / "python"
    except HarnessError as exc:  # no PyPI here
        if os.environ.get("VLLM_FLEET_ROUTER_REQUIRED"):
            raise
        pytest.skip(f"no vllm-router venv: {exc}")


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    started = [Replica(), Replica()]
    for httpd in started:
        threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    yield started
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


class Router:
    """One router started the way the role's unit starts it: the launcher and router-N.json."""

    def __init__(self, python: Path, work: Path) -> None:
        self.python, self.address = python, f"127.0.0.1:{_port()}"
        key = work / "router.key"
        key.write_text(KEY + "\n")
        key.chmod(0o600)
        argv = ["--host", "127.0.0.1", "--port", self.address.rsplit(":", 1)[1], "--prometheus-host", "127.0.0.1",
                "--prometheus-port", str(_port()), "--policy", "cache_aware", "--worker-startup-timeout-secs", "10",
                "--worker-startup-check-interval", "1", "--log-level", "warning"]  # fmt: skip
        self.config = work / "router-0.json"
        self.config.write_text(json.dumps({"model": "m", "argv": argv, "api_key_file": str(key)}))
        self.log = work / "router.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            env = dict(os.environ, NO_COLOR="1")
            self.proc = subprocess.Popen(
                [str(self.python), str(LAUNCHER), "--config", str(self.config)], stdout=log, stderr=log, env=env
            )
        _wait(lambda: "urls" in _get(f"http://{self.address}/list_workers"), "the router's admin API")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def workers(self) -> list[str]:
        return sorted(_get(f"http://{self.address}/list_workers")["urls"])


def test_the_watcher_sets_the_routers_workers_and_the_key_stays_off_argv(
    router_python: Path, replicas: list[Replica], tmp_path: Path
) -> None:
    a, b = replicas
    router = Router(router_python, tmp_path)
    router.start()
    try:
        assert router.proc is not None
        assert KEY.encode() not in Path(f"/proc/{router.proc.pid}/cmdline").read_bytes()
        assert router.workers() == []  # it starts empty: the watcher adds what is in rotation
        (tmp_path / "drain").mkdir()
        watch = gw.Watch(
            {
                "upstreams": [a.address, b.address], "fall": 1, "rise": 1, "timeout": 2,
                "upstream_conf": str(tmp_path / "upstream.conf"), "drain_dir": str(tmp_path / "drain"),
                "status": str(tmp_path / "status.json"), "pidfile": str(tmp_path / "none.pid"),
                "routers": [{"address": router.address, "upstreams": [a.address, b.address]}],
            }
        )  # fmt: skip

        def round_() -> dict[str, Any]:
            watch.check()
            watch.sync_routers()
            watch.write(reload=False)
            return json.loads((tmp_path / "status.json").read_text())  # type: ignore[no-any-return]

        both = sorted([f"http://{a.address}", f"http://{b.address}"])
        status = round_()
        assert router.workers() == both
        assert status["routers"][router.address] == {"workers": both, "error": None}

        # A request through the router: the client's own Authorization reaches the replica; the
        # router's own call (the cache-aware policy's /render) carries the key from the file.
        request = urllib.request.Request(
            f"http://{router.address}/v1/completions",
            data=json.dumps({"model": "m", "prompt": "hello there", "max_tokens": 1}).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer client-key"},
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            served_by = json.loads(resp.read())["served_by"]
        posts = (a if served_by == a.address else b).posts
        assert ("/v1/completions", "Bearer client-key") in posts, posts
        renders = [auth for path, auth in a.posts + b.posts if path.endswith("/render")]
        assert renders and set(renders) == {f"Bearer {KEY}"}, a.posts + b.posts

        # Drained (the rolling restart's file): out of the router, and back once undrained.
        (tmp_path / "drain" / b.address).touch()
        status = round_()
        assert router.workers() == [f"http://{a.address}"]
        assert status["upstreams"][b.address]["state"] == "drained"
        (tmp_path / "drain" / b.address).unlink()
        round_()
        assert router.workers() == both

        # Failing its health check: ejected, out of the router; then back.
        a.ok = False
        status = round_()
        assert status["upstreams"][a.address]["state"] == "ejected"
        assert router.workers() == [f"http://{b.address}"]
        a.ok = True
        round_()
        assert router.workers() == both

        # The router restarts empty: one round gives it its workers again.
        router.stop()
        status = round_()  # while it is down: recorded, and the watcher goes on
        assert status["routers"][router.address]["workers"] is None
        assert "URLError" in status["routers"][router.address]["error"]
        router.start()
        assert router.workers() == []
        round_()
        assert router.workers() == both
    finally:
        router.stop()
