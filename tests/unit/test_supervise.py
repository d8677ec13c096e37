"""The vllm_server role's supervisor for hosts without systemd, with real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT

SCRIPT = ROOT / "roles/vllm_server/files/supervise.py"


def _call(state: Path, *args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args[:1], "--state", str(state), "--name", "t", *args[1:]],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _wait_for(predicate, timeout: float = 15) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_start_is_idempotent_restarts_on_change_and_stop_ends_the_group(tmp_path: Path) -> None:
    env = tmp_path / "t.env"
    env.write_text("GREETING=hello\n")
    cmd = [sys.executable, "-c", "import os, time; print(os.environ['GREETING'], flush=True); time.sleep(60)"]
    first = _call(tmp_path, "start", "--env-file", str(env), "--", *cmd)
    assert first["changed"] is True
    log = tmp_path / "t.log"
    assert _wait_for(lambda: log.exists() and "hello" in log.read_text())
    assert _call(tmp_path, "start", "--env-file", str(env), "--", *cmd)["changed"] is False
    child = _call(tmp_path, "status")["child"]

    env.write_text("GREETING=again\n")  # a changed environment restarts it
    assert _call(tmp_path, "start", "--env-file", str(env), "--", *cmd)["changed"] is True
    assert _wait_for(lambda: "again" in log.read_text())
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split(")")[1][:3]

    status = _call(tmp_path, "status")
    assert status["running"] is True and status["restarts"] == 0
    assert _call(tmp_path, "stop")["changed"] is True
    assert _call(tmp_path, "status")["running"] is False
    assert _wait_for(lambda: not Path(f"/proc/{status['child']}").exists())


def test_a_failing_command_is_restarted_and_counted(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import sys; print('boom', flush=True); sys.exit(3)"]
    _call(tmp_path, "start", "--", *cmd)
    assert _wait_for(lambda: int(_call(tmp_path, "status")["restarts"]) >= 1)  # type: ignore[call-overload]
    assert "exited with 3, restarting" in (tmp_path / "t.log").read_text()
    _call(tmp_path, "stop")
    assert _call(tmp_path, "status")["running"] is False
