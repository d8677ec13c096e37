"""vllm-fleet status against stand-in vLLM servers (stdlib http.server on 127.0.0.1) that
serve the /metrics vLLM 0.32 wrote (data/), an unreachable port, a failing /health."""

from __future__ import annotations

import email.utils
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from vllm_fleet.cli import main
from vllm_fleet.errors import PlanError
from vllm_fleet.ops import status

DATA = Path(__file__).parent / "data"
FIRST = (DATA / "vllm_metrics_0_32.txt").read_bytes()
LATER = (DATA / "vllm_metrics_0_32_later.txt").read_bytes()
DP2 = (DATA / "vllm_metrics_0_32_dp2.txt").read_bytes()
START = 1796148298.7  # process_start_time_seconds of FIRST / LATER


class StandIn:
    """A vLLM look-alike: /health answers ``health``; /metrics serves ``pages`` in turn (the last one repeats)."""

    def __init__(self, pages: list[bytes], health: int = 200, uptime: float = 3723.0, delay: float = 0.0) -> None:
        self.pages, self.health, self.delay = pages, health, delay
        self.served = 0
        self.auth: list[str | None] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def date_time_string(self, timestamp: float | None = None) -> str:
                # The server's clock, START + uptime: uptime is read against it, not ours.
                return email.utils.formatdate(START + uptime, usegmt=True)

            def do_GET(self) -> None:
                time.sleep(stand_in.delay)
                stand_in.auth.append(self.headers.get("Authorization"))
                if self.path == "/health":
                    self.send_response(stand_in.health)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.path == "/metrics":
                    body = stand_in.pages[min(stand_in.served, len(stand_in.pages) - 1)]
                    stand_in.served += 1
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_error(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_ins() -> Iterator[list[StandIn]]:
    made: list[StandIn] = []
    yield made
    for s in made:
        s.close()


def _serve(made: list[StandIn], *pages: bytes, **kwargs: Any) -> StandIn:
    s = StandIn(list(pages), **kwargs)
    made.append(s)
    return s


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"


def _target(endpoint: str, name: str = "tiny-llama-0") -> status.Target:
    return status.Target(name, endpoint, "tiny-llama", 14695)


def test_two_scrapes_give_rates_and_the_numbers_of_the_latest(stand_ins: list[StandIn]) -> None:
    s = _serve(stand_ins, FIRST, LATER)
    t = _target(s.endpoint)
    before = status.scrape(t)
    time.sleep(0.05)
    now = status.scrape(t)
    row = status.summarize(t, now, before)
    seconds = now.at - before.at
    assert row.healthy and row.health == "ok"
    assert (row.running, row.waiting, row.kv_cache_usage_pct) == (5, 0, 50.0)  # LATER's gauges
    # The counters grew by what make_vllm_metrics.py recorded between the scrapes.
    assert row.generation_tokens_per_s == pytest.approx(900 / seconds)
    assert row.prompt_tokens_per_s == pytest.approx(200 / seconds)
    assert row.prefix_cache_hit_rate == pytest.approx((600 + 450) / (1000 + 500))
    assert row.prefix_cache_hit_rate_interval == pytest.approx(450 / 500)
    assert row.preemptions == 1
    assert row.uptime_s == pytest.approx(3723, abs=1)  # HTTP dates have whole seconds
    assert row.num_gpu_blocks == [14695] and row.planned_num_gpu_blocks == 14695
    assert row.notes is None
    text = status.render([row])
    assert "1h02m" in text and "90.0%" in text and "70.0%" in text and "14,695" in text
    assert "1/1 healthy" in text
    assert status.exit_code([row]) == 0


def test_one_scrape_says_dash_for_rates(stand_ins: list[StandIn]) -> None:
    s = _serve(stand_ins, FIRST)
    t = _target(s.endpoint)
    row = status.summarize(t, status.scrape(t))
    assert row.generation_tokens_per_s is None and row.prefix_cache_hit_rate_interval is None
    assert row.prefix_cache_hit_rate == pytest.approx(0.6)
    assert "rates: '-' (no two scrapes" in status.render([row])


def test_a_restart_between_scrapes_gives_no_rate(stand_ins: list[StandIn]) -> None:
    s = _serve(stand_ins, LATER, FIRST)  # counters went down: a new process
    t = _target(s.endpoint)
    before = status.scrape(t)
    row = status.summarize(t, status.scrape(t), before)
    assert row.generation_tokens_per_s is None and row.prompt_tokens_per_s is None


def test_data_parallel_engines_are_summed(stand_ins: list[StandIn]) -> None:
    s = _serve(stand_ins, DP2)
    t = _target(s.endpoint)
    row = status.summarize(t, status.scrape(t))
    assert row.engines == 2
    assert row.running == 2 + 3
    assert row.kv_cache_usage_pct == pytest.approx((25 + 35) / 2)
    assert row.num_gpu_blocks == [14695, 14695]
    assert row.uptime_s is None  # multiprocess registry: no process_start_time_seconds
    assert "14,695 x2" in status.render([row])


def test_unreachable_instance_is_a_row_not_a_crash(stand_ins: list[StandIn]) -> None:
    s = _serve(stand_ins, FIRST)
    targets = [_target(s.endpoint, "up"), _target(_closed_port(), "down")]
    up, down = status.scrape_all(targets)
    rows = [status.summarize(t, n) for t, n in zip(targets, (up, down), strict=True)]
    assert rows[0].healthy
    assert not rows[1].healthy and rows[1].health == "unreachable: connection refused"
    assert rows[1].running is None
    assert status.exit_code(rows) == 1
    assert "1/2 healthy" in status.render(rows)


def test_health_500_is_unhealthy_and_metrics_still_read(stand_ins: list[StandIn]) -> None:
    s = _serve(stand_ins, FIRST, health=500)
    t = _target(s.endpoint)
    row = status.summarize(t, status.scrape(t))
    assert (row.healthy, row.health) == (False, "HTTP 500")
    assert row.running == 2
    assert status.exit_code([row]) == 1


def test_a_slow_instance_times_out_in_parallel(stand_ins: list[StandIn]) -> None:
    slow = [_serve(stand_ins, FIRST, delay=2.0) for _ in range(3)]
    began = time.monotonic()
    got = status.scrape_all([_target(s.endpoint) for s in slow], timeout=0.3)
    assert time.monotonic() - began < 1.5  # three at once, not 3 x 0.3 s in a row
    assert [g.health for g in got] == ["unreachable: timed out"] * 3


def test_a_page_that_is_not_the_text_format_is_a_note(stand_ins: list[StandIn]) -> None:
    s = _serve(stand_ins, b"<html>oops</html>\n")
    t = _target(s.endpoint)
    row = status.summarize(t, status.scrape(t))
    assert row.healthy and row.running is None
    assert row.notes and row.notes[0].startswith("/metrics: line 1: invalid metric name")


def test_another_served_model_and_fewer_blocks_are_said(stand_ins: list[StandIn]) -> None:
    s = _serve(stand_ins, FIRST)
    t = status.Target("x-0", s.endpoint, "other-model", 20000)
    text = status.render([status.summarize(t, status.scrape(t))])
    assert "x-0: serves tiny-llama, the plan says other-model" in text
    assert "x-0: vLLM has 14,695 KV blocks, the plan expected 20,000" in text


def test_the_api_key_comes_from_the_environment_only(stand_ins: list[StandIn], monkeypatch: pytest.MonkeyPatch) -> None:
    s = _serve(stand_ins, FIRST)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    status.run([_target(s.endpoint)], out=io.StringIO(), first_gap=0)
    assert s.auth == [None, None]
    monkeypatch.setenv("VLLM_API_KEY", "sekrit")
    status.run([_target(s.endpoint)], out=io.StringIO(), first_gap=0)
    assert s.auth[2:] == ["Bearer sekrit"] * 2
    with pytest.raises(SystemExit):
        main(["status", "--plan", "x.json", "--api-key", "sekrit"])


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _stop_after(refreshes: int) -> Any:
    calls = {"n": 0}

    def sleep(seconds: float) -> None:
        calls["n"] += 1
        if calls["n"] > refreshes:
            raise KeyboardInterrupt

    return sleep


def test_watch_redraws_until_ctrl_c(stand_ins: list[StandIn]) -> None:
    s = _serve(stand_ins, FIRST, LATER)
    out = io.StringIO()
    # sleep 1 is the first gap; 2 and 3 come after the refreshes; the 3rd is Ctrl-C.
    assert status.run([_target(s.endpoint)], watch=2.0, out=out, sleep=_stop_after(2)) == 0
    text = out.getvalue()
    assert text.count("\n--- ") + text.startswith("--- ") == 2 and "\x1b[" not in text
    tty = _Tty()
    s.served = 0
    assert status.run([_target(s.endpoint)], watch=2.0, out=tty, sleep=_stop_after(2)) == 0
    assert tty.getvalue().count(status.CLEAR) == 2


def test_watch_json_is_one_line_per_refresh(stand_ins: list[StandIn]) -> None:
    s = _serve(stand_ins, FIRST, LATER)
    out = io.StringIO()
    status.run([_target(s.endpoint)], watch=1.0, as_json=True, out=out, sleep=_stop_after(3))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    docs = [json.loads(line) for line in lines]
    assert docs[0]["instances"][0]["generation_tokens_per_s"] > 0
    assert docs[1]["instances"][0]["generation_tokens_per_s"] == 0  # LATER twice: nothing grew


def _plan(tmp_path: Path, *endpoints: str) -> Path:
    """A plan.json as playbooks/plan.yml writes it (the fields status reads, and a few more)."""
    instances = [
        {
            "name": f"tiny-llama-{i}",
            "endpoint": endpoint,
            "port": int(endpoint.rsplit(":", 1)[1]),
            "served_model_name": "tiny-llama",
            "tensor_parallel_size": 1,
            "memory": {"num_gpu_blocks": 14695, "block_size": 128, "kv_cache_tokens": 1880960},
        }
        for i, endpoint in enumerate(endpoints)
    ]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"model": "tiny-llama", "instances": instances, "gateway": {"upstreams": []}}))
    return path


def test_cli_status_plan_json(stand_ins: list[StandIn], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = _serve(stand_ins, FIRST, LATER)
    assert main(["status", "--plan", str(_plan(tmp_path, s.endpoint)), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (inst,) = doc["instances"]
    assert doc["healthy"] is True
    assert inst["name"] == "tiny-llama-0" and inst["planned_num_gpu_blocks"] == 14695
    assert 0.5 < inst["interval_s"] < 2.5  # two scrapes about a second apart
    assert inst["generation_tokens_per_s"] == pytest.approx(900 / inst["interval_s"], rel=0.01)


def test_cli_status_table_exit_1_when_one_is_down(
    stand_ins: list[StandIn], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = _serve(stand_ins, FIRST, LATER)
    assert main(["status", "--plan", str(_plan(tmp_path, s.endpoint, _closed_port()))]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["instance", "endpoint", "health"]
    assert "unreachable: connection refused" in out and "1/2 healthy" in out


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "--plan: cannot read"),
        ("{", "--plan: "),
        ("[]", "is not a plan"),
        ('{"instances": []}', "the plan has no instances"),
        ('{"instances": [{"name": "a", "endpoint": "http://x:1"}]}', "instances[0].endpoint"),
    ],
)
def test_cli_bad_plan_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, words: str
) -> None:
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    assert main(["status", "--plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "fix:" in err, err


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["status", "--plan", "p", "--watch", "0"])
    assert exc.value.code == 2
    capsys.readouterr()
    # Neither a plan nor an inventory: one line naming the flag. Both: the plan read from the file, the
    # nodes asked through the inventory (a bench or CI writes its plan elsewhere than the inventory says).
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--inventory" in err and "fix:" in err, err


def test_artifacts_dir_as_the_plan_playbook_sees_it(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text("")

    def listed(hostvars: dict[str, Any]) -> dict[str, Any]:
        return {"_meta": {"hostvars": hostvars}}

    assert status.artifacts_dir(str(inv), listed({"n1": {}})) == status.CHECKOUT / "artifacts"
    assert status.artifacts_dir(str(inv), listed({"localhost": {"vllm_fleet_artifacts_dir": "/a"}})) == Path("/a")
    shared = {"n1": {"vllm_fleet_artifacts_dir": "/b"}, "n2": {"vllm_fleet_artifacts_dir": "/b"}}
    assert status.artifacts_dir(str(inv), listed(shared)) == Path("/b")
    mixed = {"n1": {"vllm_fleet_artifacts_dir": "/b"}, "n2": {}}  # a group's, not all's: localhost has the default
    assert status.artifacts_dir(str(inv), listed(mixed)) == status.CHECKOUT / "artifacts"
    templated = listed({"localhost": {"vllm_fleet_artifacts_dir": "{{ inventory_dir }}/art"}})
    assert status.artifacts_dir(str(inv), templated) == tmp_path.resolve() / "art"
    with pytest.raises(PlanError, match="vllm_fleet_artifacts_dir"):
        status.artifacts_dir(str(inv), listed({"localhost": {"vllm_fleet_artifacts_dir": "{{ lookup('env', 'X') }}"}}))


def test_cli_status_from_an_inventory(
    stand_ins: list[StandIn], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real ansible-inventory (beside this Python) reads vllm_fleet_artifacts_dir."""
    s = _serve(stand_ins, FIRST, LATER)
    artifacts = tmp_path / "art"
    artifacts.mkdir()
    _plan(artifacts, s.endpoint)
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  vars:\n    vllm_fleet_artifacts_dir: " + str(artifacts) + "\n"
        "  children:\n    vllm_nodes:\n      hosts:\n        node1:\n"
    )
    assert main(["status", "-i", str(inv), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["instances"][0]["endpoint"] == s.endpoint
    (artifacts / "plan.json").unlink()
    assert main(["status", "-i", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "--inventory: cannot read" in err and "site.yml" in err
