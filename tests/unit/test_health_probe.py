"""The health agent (vllm_fleet/agents/health.py): when the start-up wait calls a launch crashed."""

from __future__ import annotations

import json

import pytest

from vllm_fleet.agents import common, health


def _probe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], show: str, *args: str
) -> dict[str, object]:
    monkeypatch.setattr(health, "http_ok", lambda url, timeout: False)
    monkeypatch.setattr(common, "output", lambda argv, timeout=60: show)
    argv = ["--url", "http://127.0.0.1:8000/health", "--runtime", "systemd", "--name", "u", *args]
    assert health.main(argv) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("show", "regroups", "crashed"),
    [
        ("ActiveState=activating\nSubState=start\nNRestarts=0", 0, False),  # still loading
        ("ActiveState=activating\nSubState=auto-restart\nNRestarts=0", 0, True),  # one crash, single node
        ("ActiveState=failed\nSubState=failed\nNRestarts=0", 0, True),  # exited for good
        ("ActiveState=inactive\nSubState=dead\nNRestarts=0", 1, True),  # a group head that gave up
        # A group head re-forming its group once per member a re-run restarts after it: not a crash.
        ("ActiveState=activating\nSubState=auto-restart\nNRestarts=0", 1, False),
        ("ActiveState=active\nSubState=running\nNRestarts=1", 1, False),
        ("ActiveState=activating\nSubState=auto-restart\nNRestarts=1", 1, True),  # more than the members
    ],
)
def test_a_restart_is_a_crash_unless_it_is_a_group_re_forming(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], show: str, regroups: int, crashed: bool
) -> None:
    out = _probe(monkeypatch, capsys, show, "--regroups", str(regroups))
    assert out["crashed"] is crashed and out["healthy"] is False
