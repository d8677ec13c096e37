"""The two watchers that run on the hosts, against real local HTTP servers whose /health answers
200, 500, or hangs (accepts, never answers):

- the gateway_watch agent (vllm_fleet/agents/gateway_watch.py): up/ejected/drained with fall and rise, the upstream
  list it renders for nginx, status.json, SIGHUP to nginx's master exactly when the list changes,
  and --once (an unhealthy replica stays in rotation before nginx's first start).
- the watchdog agent (vllm_fleet/agents/watchdog.py): a launch is watched only after its first healthy answer
  since its current start (MainPID); ``failures`` failed checks in a row kill and restart it once;
  a launch that is not running is left alone."""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import agent
from vllm_fleet.agents import gateway_watch as gw
from vllm_fleet.agents import watchdog as wd

TIMEOUT = 0.3  # the watchers' per-check timeout in these tests; a hung /health costs this much
SERVER_ARGS = "max_fails=1 fail_timeout=10s"


class HealthServer(ThreadingHTTPServer):
    """A replica: /health answers 200 ("ok"), 500 ("error"), or nothing ("hung": the handler
    holds the connection until the test ends, far past the watchers' timeout)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _HealthHandler)
        self.mode = "ok"
        self.metrics = ""  # what /metrics answers (vLLM's Prometheus page); "" is 404
        self.requests: list[tuple[float, str]] = []  # (when, the mode it was answered in)
        self.release = threading.Event()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _HealthHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        server = self.server
        assert isinstance(server, HealthServer)
        server.requests.append((time.time(), server.mode))
        if server.mode == "hung":
            server.release.wait(10)
            return  # the client gave up long ago
        if self.path == "/metrics" and server.metrics:
            page = server.metrics.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        code = 200 if server.mode == "ok" else 500
        body = b"{}" if self.path == "/health" else b"not found"
        self.send_response(code if self.path == "/health" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def replicas() -> Iterator[Callable[[], HealthServer]]:
    """A factory of running HealthServers, all shut down (hung handlers released) at the end."""
    started: list[HealthServer] = []

    def make() -> HealthServer:
        httpd = HealthServer()
        threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
        started.append(httpd)
        return httpd

    yield make
    for httpd in started:
        httpd.release.set()
        httpd.shutdown()
        httpd.server_close()


def closed_port() -> str:
    """An address where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def not_http_server() -> Iterator[str]:
    """Something on the port that is not HTTP (say an SSH server after a port clash)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()

    def answer() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    yield f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture
def garbage() -> Iterator[str]:
    yield from not_http_server()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# --------------------------------------------------------------------------- gateway_watch.py


@pytest.fixture
def gw_config(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    (tmp_path / "drain").mkdir()

    def config(upstreams: list[str], **extra: Any) -> dict[str, Any]:
        return {
            "upstreams": upstreams,
            "interval": 0.1,
            "timeout": TIMEOUT,
            "fall": 2,
            "rise": 2,
            "server_args": SERVER_ARGS,
            "upstream_conf": str(tmp_path / "upstreams.conf"),
            "drain_dir": str(tmp_path / "drain"),
            "status": str(tmp_path / "status.json"),
            "pidfile": str(tmp_path / "nginx.pid"),
            **extra,
        }

    return config


def states(watch: Any) -> dict[str, str]:
    return {u: st["state"] for u, st in watch.state.items()}


def server_lines(watch: Any) -> list[str]:
    return [line for line in Path(watch.conf).read_text().splitlines() if not line.startswith("#")]


def up_line(address: str) -> str:
    return f"server {address} {SERVER_ARGS};"


def down_line(address: str, why: str) -> str:
    return f"server {address} down;  # {why}"


def test_gateway_fall_ejects_and_rise_brings_back(
    replicas: Callable[[], HealthServer], gw_config: Callable[..., dict[str, Any]]
) -> None:
    a, b = replicas(), replicas()
    watch = gw.Watch(gw_config([a.address, b.address]))
    assert states(watch) == {a.address: "up", b.address: "up"}

    watch.check()
    assert watch.write(reload=False) is True  # first write: the file did not exist
    assert server_lines(watch) == [up_line(a.address), up_line(b.address)]

    a.mode = "error"
    watch.check()  # one failure: still in rotation (fall=2)
    assert states(watch)[a.address] == "up"
    assert watch.state[a.address]["fails"] == 1
    assert watch.write(reload=False) is False
    watch.check()  # two in a row: ejected
    assert states(watch) == {a.address: "ejected", b.address: "up"}
    assert watch.write(reload=False) is True
    assert server_lines(watch) == [down_line(a.address, "ejected"), up_line(b.address)]

    a.mode = "ok"
    watch.check()  # one pass: still out (rise=2)
    assert states(watch)[a.address] == "ejected"
    assert watch.write(reload=False) is False
    a.mode = "error"
    watch.check()  # a failure resets the passes
    a.mode = "ok"
    watch.check()
    assert states(watch)[a.address] == "ejected"
    watch.check()  # two passes in a row: back
    assert states(watch) == {a.address: "up", b.address: "up"}
    assert watch.write(reload=False) is True
    assert server_lines(watch) == [up_line(a.address), up_line(b.address)]


def test_gateway_hung_and_unreachable_replicas_fail_their_checks(
    replicas: Callable[[], HealthServer], gw_config: Callable[..., dict[str, Any]]
) -> None:
    hung, ok = replicas(), replicas()
    hung.mode = "hung"
    refused = closed_port()
    watch = gw.Watch(gw_config([hung.address, refused, ok.address]))
    for _ in range(2):
        started = time.monotonic()
        watch.check()
        # The checks run in parallel, each bounded by the timeout: a round is not the sum.
        assert time.monotonic() - started < 2 * TIMEOUT + 0.5
    assert states(watch) == {hung.address: "ejected", refused: "ejected", ok.address: "up"}
    assert [watch.state[u]["healthy"] for u in watch.upstreams] == [False, False, True]


def test_gateway_a_non_http_answer_is_a_failed_check(garbage: str, gw_config: Callable[..., dict[str, Any]]) -> None:
    watch = gw.Watch(gw_config([garbage], fall=1))
    watch.check()  # must not raise (http.client.BadStatusLine is no OSError)
    assert states(watch) == {garbage: "ejected"}


def test_gateway_drain_and_undrain(
    replicas: Callable[[], HealthServer], gw_config: Callable[..., dict[str, Any]]
) -> None:
    a, b = replicas(), replicas()
    config = gw_config([a.address, b.address])
    drain = Path(config["drain_dir"])
    watch = gw.Watch(config)

    (drain / a.address).touch()
    (drain / "10.9.9.9:8000").touch()  # not one of ours: ignored
    watch.check()  # healthy, but drained at once (no fall to wait for)
    assert states(watch) == {a.address: "drained", b.address: "up"}
    watch.write(reload=False)
    assert server_lines(watch) == [down_line(a.address, "drained"), up_line(b.address)]
    a.mode = "error"
    for _ in range(3):
        watch.check()
        assert states(watch)[a.address] == "drained"  # drained is not ejected, failing or not

    (drain / a.address).unlink()
    watch.check()  # undrained while it does not answer (still restarting): ejected
    assert states(watch)[a.address] == "ejected"
    watch.write(reload=False)
    assert server_lines(watch) == [down_line(a.address, "ejected"), up_line(b.address)]

    (drain / a.address).touch()
    a.mode = "ok"
    watch.check()
    assert states(watch)[a.address] == "drained"
    (drain / a.address).unlink()
    watch.check()  # undrained and answering: back at once, no rise to wait for
    assert states(watch)[a.address] == "up"

    # A drain folder that is gone drains nothing.
    shutil.rmtree(drain)
    watch.check()
    assert states(watch) == {a.address: "up", b.address: "up"}


def test_gateway_render_without_server_args(
    replicas: Callable[[], HealthServer], gw_config: Callable[..., dict[str, Any]]
) -> None:
    a = replicas()
    watch = gw.Watch(gw_config([a.address], server_args=""))
    text = watch.render()
    assert text.splitlines() == [
        "# Written by gateway_watch (vllm-fleet): the replicas and which are in rotation.",
        f"server {a.address};",
    ]
    assert text.endswith("\n")


def test_gateway_status_json(replicas: Callable[[], HealthServer], gw_config: Callable[..., dict[str, Any]]) -> None:
    a, b = replicas(), replicas()
    config = gw_config([a.address, b.address])
    watch = gw.Watch(config)
    b.mode = "error"
    before = time.time()
    watch.check()
    watch.check()
    watch.write(reload=False)
    status = json.loads(Path(config["status"]).read_text())
    assert set(status) == {"updated", "upstreams"}
    assert before <= status["updated"] <= time.time()
    assert set(status["upstreams"]) == {a.address, b.address}
    sa, sb = status["upstreams"][a.address], status["upstreams"][b.address]
    assert set(sa) == set(sb) == {"state", "since", "fails", "healthy"}  # no "passes"
    assert (sa["state"], sa["fails"], sa["healthy"]) == ("up", 0, True)
    assert (sb["state"], sb["fails"], sb["healthy"]) == ("ejected", 2, False)
    assert sa["since"] < before <= sb["since"]  # a: since the start; b: since its ejection
    assert stat.S_IMODE(os.stat(config["status"]).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(config["upstream_conf"]).st_mode) == 0o644
    assert not list(Path(config["status"]).parent.glob(".*.tmp"))  # replaced atomically


@pytest.fixture
def fake_nginx(tmp_path: Path) -> Iterator[tuple[Path, Callable[[], int]]]:
    """A child process standing in for nginx's master: it notes every SIGHUP in a file.
    Yields its pidfile and a function counting the SIGHUPs seen so far."""
    hups, ready = tmp_path / "hups", tmp_path / "ready"
    code = (
        "import signal, time\n"
        f"signal.signal(signal.SIGHUP, lambda *a: open({str(hups)!r}, 'a').write('hup\\n'))\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_for(ready.exists, what="the fake nginx to install its SIGHUP handler")
        pidfile = tmp_path / "nginx.pid"
        pidfile.write_text(f"{child.pid}\n")

        def count() -> int:
            return hups.read_text().count("hup") if hups.exists() else 0

        yield pidfile, count
    finally:
        child.kill()
        child.wait()


def test_gateway_sighup_exactly_when_the_list_changes(
    replicas: Callable[[], HealthServer],
    gw_config: Callable[..., dict[str, Any]],
    fake_nginx: tuple[Path, Callable[[], int]],
) -> None:
    pidfile, hups = fake_nginx
    a, b = replicas(), replicas()
    watch = gw.Watch(gw_config([a.address, b.address], pidfile=str(pidfile)))

    def write_and_expect(changed: bool, total: int) -> None:
        assert watch.write(reload=True) is changed
        if changed:
            wait_for(lambda: hups() >= total, what=f"SIGHUP number {total}")
        time.sleep(0.15)  # time for a stray SIGHUP to arrive (and not merge with the next one)
        assert hups() == total

    watch.check()
    write_and_expect(True, 1)  # the first list
    watch.check()
    write_and_expect(False, 1)
    a.mode = "error"
    watch.check()  # one failure: the list is the same
    write_and_expect(False, 1)
    watch.check()  # ejected
    write_and_expect(True, 2)
    watch.check()
    write_and_expect(False, 2)
    a.mode = "ok"
    watch.check()
    watch.check()  # back
    write_and_expect(True, 3)
    # write(reload=False) changes the file and sends nothing.
    (Path(watch.drain) / b.address).touch()
    watch.check()
    assert watch.write(reload=False) is True
    time.sleep(0.15)
    assert hups() == 3


def test_gateway_reload_without_nginx_says_so(
    replicas: Callable[[], HealthServer],
    gw_config: Callable[..., dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    a = replicas()
    config = gw_config([a.address])
    watch = gw.Watch(config)
    watch.check()
    assert watch.write(reload=True) is True  # no pidfile: no exception
    Path(config["pidfile"]).write_text("not a pid\n")
    a.mode = "error"
    watch.check()
    watch.check()
    assert watch.write(reload=True) is True
    out = capsys.readouterr().out
    assert out.count("cannot reload nginx") == 2
    assert Path(config["upstream_conf"]).exists()


@pytest.fixture
def keep_signal_handlers() -> Iterator[None]:
    """main() installs SIGTERM/SIGINT handlers in the process: put pytest's back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("keep_signal_handlers")
def test_gateway_once_keeps_an_unhealthy_replica_in_rotation(
    replicas: Callable[[], HealthServer],
    gw_config: Callable[..., dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b, c = replicas(), replicas(), replicas()
    b.mode = "error"
    config = gw_config([a.address, b.address, c.address], fall=1)  # fall=1: a plain round would eject b
    (Path(config["drain_dir"]) / c.address).touch()
    path = tmp_path / "watch.json"
    path.write_text(json.dumps(config))

    assert gw.main(["--config", str(path), "--once"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "changed"
    lines = [line for line in Path(config["upstream_conf"]).read_text().splitlines() if not line.startswith("#")]
    assert lines == [up_line(a.address), up_line(b.address), down_line(c.address, "drained")]
    status = json.loads(Path(config["status"]).read_text())["upstreams"]
    assert (status[b.address]["state"], status[b.address]["healthy"], status[b.address]["fails"]) == ("up", False, 1)

    assert gw.main(["--config", str(path), "--once"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "unchanged"

    (Path(config["drain_dir"]) / c.address).unlink()
    assert gw.main(["--config", str(path), "--once"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "changed"
    # Undrained but never checked as it: --once starts every replica up, c answers.
    assert Path(config["upstream_conf"]).read_text().count("down;") == 0


# --------------------------------------------------------------------------- watchdog.py

# systemd cannot run in a unit test: this executable stands in for `systemctl`, on PATH ahead of
# the real one. It answers `show -p ActiveState -p MainPID UNIT` from a JSON file of per-unit
# states, gives a unit a new MainPID on `restart` (as systemd would), and logs every call.
FAKE_SYSTEMCTL = """\
#!{python} -SI
import json, sys, time
STATE, LOG = {state!r}, {log!r}
args = sys.argv[1:]
with open(LOG, "a") as log:
    log.write(str(time.time()) + " " + " ".join(args) + "\\n")
with open(STATE) as f:
    units = json.load(f)
unit = units.get(args[-1], {{"ActiveState": "inactive", "MainPID": 0}})
if args[0] == "show" and "--value" in args:
    print(unit[args[args.index("-p") + 1]])
elif args[0] == "show":
    print(f"ActiveState={{unit['ActiveState']}}")
    print(f"MainPID={{unit['MainPID']}}")
elif args[0] == "restart":
    unit.update(ActiveState="active", MainPID=unit["MainPID"] + 1000)
    units[args[-1]] = unit
    with open(STATE + ".tmp", "w") as f:
        json.dump(units, f)
    import os
    os.replace(STATE + ".tmp", STATE)
"""


class FakeSystemd:
    def __init__(self, root: Path) -> None:
        self.bin, self.state, self.log = root / "bin", root / "systemd.json", root / "systemctl.log"
        self.bin.mkdir()
        self.log.touch()
        self.set({})
        script = self.bin / "systemctl"
        script.write_text(FAKE_SYSTEMCTL.format(python=sys.executable, state=str(self.state), log=str(self.log)))
        script.chmod(0o755)

    def set(self, units: dict[str, dict[str, Any]]) -> None:
        tmp = self.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(units))
        os.replace(tmp, self.state)

    def update(self, unit: str, **props: Any) -> None:
        units = json.loads(self.state.read_text())
        units.setdefault(unit, {}).update(props)
        self.set(units)

    def timed_calls(self, unit: str | None = None, *, show: bool = False) -> list[tuple[float, str]]:
        """(when, arguments) of every call, `show` left out unless asked for."""
        calls = [(float(when), c) for when, _, c in (line.partition(" ") for line in self.log.read_text().splitlines())]
        return [
            (when, c)
            for when, c in calls
            if (show or not c.startswith("show ")) and (unit is None or c.endswith(f" {unit}"))
        ]

    def calls(self, unit: str | None = None, *, show: bool = False) -> list[str]:
        return [c for _, c in self.timed_calls(unit, show=show)]


@pytest.fixture
def systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSystemd:
    fake = FakeSystemd(tmp_path)
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ.get('PATH', '')}")
    return fake


def systemd_launch(name: str, url: str = "http://127.0.0.1:1/health") -> dict[str, Any]:
    return {"name": name, "url": url, "runtime": "systemd", "unit": f"vllm-fleet-{name}.service"}


def test_watchdog_generation_is_the_main_pid_of_an_active_unit(systemd: FakeSystemd) -> None:
    systemd.set(
        {
            "vllm-fleet-a.service": {"ActiveState": "active", "MainPID": 4242},
            "vllm-fleet-b.service": {"ActiveState": "inactive", "MainPID": 0},
            "vllm-fleet-c.service": {"ActiveState": "deactivating", "MainPID": 77},
            "vllm-fleet-d.service": {"ActiveState": "active", "MainPID": 0},
        }
    )
    assert wd.generation(systemd_launch("a")) == "4242"
    assert wd.generation(systemd_launch("b")) is None
    assert wd.generation(systemd_launch("c")) is None
    assert wd.generation(systemd_launch("d")) is None
    assert wd.generation(systemd_launch("unknown")) is None
    assert systemd.calls(show=True)[0] == "show -p ActiveState -p MainPID vllm-fleet-a.service"


def test_watchdog_healthy(replicas: Callable[[], HealthServer], garbage: str) -> None:
    server = replicas()
    url = f"http://{server.address}/health"
    assert wd.http_ok(url, TIMEOUT) is True
    server.mode = "error"
    assert wd.http_ok(url, TIMEOUT) is False
    server.mode = "hung"
    started = time.monotonic()
    assert wd.http_ok(url, TIMEOUT) is False
    assert TIMEOUT * 0.9 <= time.monotonic() - started < TIMEOUT + 1
    assert wd.http_ok(f"http://{closed_port()}/health", TIMEOUT) is False
    assert wd.http_ok(f"http://{garbage}/health", TIMEOUT) is False  # not HTTP: a failure, not a crash


def test_watchdog_restart_kills_then_restarts(systemd: FakeSystemd) -> None:
    systemd.set({"vllm-fleet-a.service": {"ActiveState": "active", "MainPID": 10}})
    wd.restart(systemd_launch("a"))
    assert systemd.calls() == [
        "kill --signal=SIGKILL vllm-fleet-a.service",
        "restart vllm-fleet-a.service",
    ]
    assert wd.generation(systemd_launch("a")) == "1010"


def test_watchdog_restart_under_reap_kills_what_is_below_it(systemd: FakeSystemd) -> None:
    """Where the unit's main process is reap.py, the watchdog SIGKILLs what runs below it (a
    hung API server, stopped, and its own child) and not reap.py, which exits with the
    launch's status once it reaped them: systemd sees the unit empty at once."""
    hung = "import subprocess, time; subprocess.Popen(['sleep', '120']); time.sleep(120)"
    reaper = subprocess.Popen([*agent("reap"), "--grace", "30", "--", sys.executable, "-c", hung])
    try:
        wait_for(lambda: len(wd.descendants(reaper.pid)) == 2, what="the launch and its child below reap.py")
        launch_pid, _ = wd.descendants(reaper.pid)
        os.kill(launch_pid, signal.SIGSTOP)
        systemd.set({"vllm-fleet-a.service": {"ActiveState": "active", "MainPID": reaper.pid}})
        wd.restart(systemd_launch("a"))
        assert systemd.calls() == ["restart vllm-fleet-a.service"]  # no `systemctl kill` of the unit
        # reap.py ends as its launch did (SIGKILL), long before its 30 s grace: nothing was left.
        assert reaper.wait(timeout=10) == -signal.SIGKILL
        assert wd.descendants(reaper.pid) == []
    finally:
        reaper.kill()
        reaper.wait()


def test_watchdog_loop(replicas: Callable[[], HealthServer], systemd: FakeSystemd, tmp_path: Path) -> None:
    """One watchdog process, four launches:
    hung     - healthy, then hung: restarted once after `failures` checks; after the restart (new
               MainPID) not watched until healthy again, then hung again: restarted a second time;
    moved    - healthy, then restarted by someone else (new MainPID) and failing: left alone;
    never    - running, never healthy since its start (loading): left alone;
    stopped  - not running (inactive), its port failing: left alone, not even asked."""
    servers = {name: replicas() for name in ("hung", "moved", "never", "stopped")}
    servers["never"].mode = "error"
    servers["stopped"].mode = "error"
    launches = [systemd_launch(name, f"http://{s.address}/health") for name, s in servers.items()]
    units = {name: f"vllm-fleet-{name}.service" for name in servers}
    systemd.set(
        {
            units["hung"]: {"ActiveState": "active", "MainPID": 100},
            units["moved"]: {"ActiveState": "active", "MainPID": 200},
            units["never"]: {"ActiveState": "active", "MainPID": 300},
            units["stopped"]: {"ActiveState": "inactive", "MainPID": 0},
        }
    )
    status_path = tmp_path / "watchdog-status.json"
    config = tmp_path / "watchdog.json"
    config.write_text(
        json.dumps(
            {"interval": 0.1, "timeout": TIMEOUT, "failures": 3, "status": str(status_path), "launches": launches}
        )
    )

    def state() -> dict[str, dict[str, Any]]:
        try:
            result: dict[str, dict[str, Any]] = json.loads(status_path.read_text())["launches"]
        except (OSError, ValueError):
            return {}
        return result

    def written_since(mtime_ns: int) -> bool:
        return status_path.stat().st_mtime_ns != mtime_ns

    def rounds_later(n: int) -> None:
        """Wait until the watchdog wrote its status n more times."""
        for _ in range(n):
            wait_for(functools.partial(written_since, status_path.stat().st_mtime_ns), what="a watchdog round")

    proc = subprocess.Popen(
        [*agent("watchdog"), "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: state().get("hung", {}).get("watched") is True, what="hung to be watched")
        wait_for(lambda: state().get("moved", {}).get("watched") is True, what="moved to be watched")
        assert state()["hung"]["gen"] == "100"
        assert state()["never"] == {"gen": "300", "watched": False, "fails": 0, "restarts": 0}
        assert state()["stopped"] == {"gen": None, "watched": False, "fails": 0, "restarts": 0}

        # moved: started again by someone else, and not answering yet.
        systemd.update(units["moved"], MainPID=201)
        servers["moved"].mode = "error"
        servers["hung"].mode = "hung"
        wait_for(lambda: len(systemd.calls(units["hung"])) >= 2, timeout=6, what="the restart of hung")
        assert systemd.calls() == [f"kill --signal=SIGKILL {units['hung']}", f"restart {units['hung']}"]
        wait_for(lambda: state()["hung"]["restarts"] == 1, what="the restart in the status")
        assert state()["hung"]["gen"] == "1100"  # the new MainPID, not watched yet
        assert state()["hung"]["watched"] is False

        rounds_later(4)  # more than `failures` rounds of a hung /health since the restart
        assert len(systemd.calls(units["hung"])) == 2
        assert state()["hung"]["watched"] is False

        servers["hung"].mode = "ok"
        wait_for(lambda: state()["hung"]["watched"] is True, what="hung to be watched again")
        servers["hung"].mode = "error"
        wait_for(lambda: len(systemd.calls(units["hung"])) >= 4, timeout=6, what="the second restart of hung")
        assert systemd.calls(units["hung"])[2:] == [
            f"kill --signal=SIGKILL {units['hung']}",
            f"restart {units['hung']}",
        ]
        wait_for(lambda: state()["hung"]["restarts"] == 2, what="the second restart in the status")

        # The others were never restarted; the stopped one was never even asked for /health.
        assert systemd.calls(units["moved"]) == systemd.calls(units["never"]) == systemd.calls(units["stopped"]) == []
        assert state()["moved"] == {"gen": "201", "watched": False, "fails": 0, "restarts": 0}
        assert state()["never"]["restarts"] == state()["stopped"]["restarts"] == 0
        assert len(servers["never"].requests) > 3  # asked every round, never watched
        assert servers["stopped"].requests == []

        # Each restart came after exactly `failures` failed checks in a row (hung, then 500).
        kills = [when for when, c in systemd.timed_calls(units["hung"]) if c.startswith("kill ")]
        answers = servers["hung"].requests
        assert len([1 for when, mode in answers if mode == "hung" and when < kills[0]]) == 3
        assert len([1 for when, mode in answers if mode == "error" and when < kills[1]]) == 3
        assert any(c == f"show -p ActiveState -p MainPID {units['stopped']}" for c in systemd.calls(show=True))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out  # SIGTERM: it ends its round and exits cleanly
    assert out.count("killing and restarting it") == 2
    assert out.count("hung: /health did not answer 3 times in a row") == 2
    assert "never: answers" not in out
    assert "stopped: answers" not in out


def _vllm_metrics(running: float, waiting: float, tokens: float) -> str:
    """A /metrics page as vLLM 0.32 writes it (two engines: the samples add up)."""
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="tiny llama"}} {running}\n'
        'vllm:num_requests_running{engine="1",model_name="tiny llama"} 0.0\n'
        f'vllm:num_requests_waiting{{engine="0",model_name="tiny llama"}} {waiting}\n'
        "# TYPE vllm:generation_tokens counter\n"
        f'vllm:generation_tokens_total{{engine="0",model_name="tiny llama"}} {tokens}\n'
        'vllm:generation_tokens_total{engine="1",model_name="tiny llama"} 3.0\n'
        'vllm:generation_tokens_created{engine="0",model_name="tiny llama"} 1.7e+09\n'
    )


def test_watchdog_reads_progress_from_vllms_metrics() -> None:
    assert wd.progress(_vllm_metrics(1, 2, 40)) == (3.0, 43.0)
    assert wd.progress("# nothing of vLLM\nprocess_cpu_seconds_total 3\n") is None
    assert wd.progress('vllm:generation_tokens_total{a="b"} not-a-number\n') is None


def test_watchdog_stall_needs_busy_and_still_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Restarted only after stall_s of requests waiting or running with the token counter still;
    an idle engine, a moving counter or an unreadable page decide nothing."""
    pages: list[tuple[float, float] | None] = []
    monkeypatch.setattr(wd, "read_progress", lambda url, timeout: pages.pop(0))
    clock = [1000.0]
    monkeypatch.setattr(wd.time, "monotonic", lambda: clock[0])
    launch = {"name": "a", "metrics_url": "http://x/metrics"}
    seen: dict[str, Any] = {"tokens": None, "since": None, "stalls": 0}

    def step(page: tuple[float, float] | None, later: float) -> bool:
        clock[0] += later
        pages.append(page)
        return wd.stalled(launch, seen, 30, 1)

    assert not step((2, 10), 0)  # first look
    assert not step((2, 10), 20)  # 20 s still: not yet
    assert not step((2, 11), 20)  # a token: the clock starts again
    assert not step(None, 25)  # page unreadable: nothing decided
    assert not step((0, 11), 40)  # idle: nothing to generate
    assert not step((1, 11), 10)
    assert step((1, 11), 31)  # busy and still for 31 s
    assert seen == {"tokens": None, "since": None, "stalls": 1}


def test_watchdog_restarts_a_stuck_engine_that_answers_health(
    replicas: Callable[[], HealthServer], systemd: FakeSystemd, tmp_path: Path
) -> None:
    """The watchdog process itself: /health answers 200 on both launches; "stuck" has a request
    running and a still token counter, "idle" none running: only "stuck" is restarted, once."""
    servers = {name: replicas() for name in ("stuck", "idle")}
    servers["stuck"].metrics = _vllm_metrics(1, 0, 7)
    servers["idle"].metrics = _vllm_metrics(0, 0, 7)
    launches = [
        {**systemd_launch(n, f"http://{s.address}/health"), "metrics_url": f"http://{s.address}/metrics"}
        for n, s in servers.items()
    ]
    systemd.set(
        {f"vllm-fleet-{n}.service": {"ActiveState": "active", "MainPID": 100 + i} for i, n in enumerate(servers)}
    )
    status = tmp_path / "status.json"
    config = tmp_path / "watchdog.json"
    config.write_text(json.dumps({"interval": 0.1, "timeout": TIMEOUT, "failures": 3, "stall_s": 0.6,
                                  "status": str(status), "launches": launches}))  # fmt: skip
    proc = subprocess.Popen([*agent("watchdog"), "--config", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        wait_for(lambda: len(systemd.calls("vllm-fleet-stuck.service")) >= 2, timeout=10, what="the stuck restart")
        servers["stuck"].metrics = _vllm_metrics(0, 0, 0)  # restarted: nothing in flight
        time.sleep(1.5)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert systemd.calls("vllm-fleet-stuck.service") == ["kill --signal=SIGKILL vllm-fleet-stuck.service",
                                                         "restart vllm-fleet-stuck.service"]  # fmt: skip
    assert systemd.calls("vllm-fleet-idle.service") == []
    assert "stuck: 1 request(s) running or waiting and no token generated for" in out, out
    assert json.loads(status.read_text())["progress"]["stuck"]["stalls"] == 1


FAKE_DOCKER = """#!{python}
import json, re, sys
# docker inspect -f TEMPLATE NAME: each {{{{.A.B}}}} of TEMPLATE from the container's state file.
state = json.load(open({state!r}))
if sys.argv[1:2] != ["inspect"] or sys.argv[-1] not in state:
    sys.exit(1)
def field(match):
    value = state[sys.argv[-1]]
    for key in match.group(1).split("."):
        value = value[key]
    return str(value).lower() if isinstance(value, bool) else str(value)
print(re.sub(r"{{{{\\.([A-Za-z.]+)}}}}", field, sys.argv[3]))
"""


def test_container_state_keeps_values_with_spaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Podman's StartedAt holds spaces: the watchdog's start marker and the health probe's counts
    read each value whole (the template's fields are joined with |, not spaces)."""
    (tmp_path / "bin").mkdir()
    docker = tmp_path / "bin" / "docker"
    state = tmp_path / "containers.json"
    started = "2026-12-05 10:00:00.123456789 +0000 UTC"
    state.write_text(json.dumps({"vllm-a": {"State": {"Running": True, "StartedAt": started, "Restarting": False},
                                            "RestartCount": 2}}))  # fmt: skip
    docker.write_text(FAKE_DOCKER.format(python=sys.executable, state=str(state)))
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{docker.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert wd.generation({"runtime": "container", "unit": "vllm-a"}) == started
    assert wd.generation({"runtime": "container", "unit": "vllm-gone"}) is None
    from vllm_fleet.agents import health

    args = argparse.Namespace(runtime="container", name="vllm-a")
    assert health.process_state(args) == (True, 2, False)
