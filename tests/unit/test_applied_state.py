"""The applied-state record (plugins/modules/vllm_fleet_applied.py) that lets a role skip a
re-run that can change nothing: every kind of drift it covers names itself, on real files,
commands and processes; and the module itself, run by Ansible, never writes in check mode."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import ROOT

MODULE = ROOT / "plugins/modules/vllm_fleet_applied.py"
ANSIBLE = shutil.which("ansible") or str(Path(sys.executable).parent / "ansible")


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_fleet_applied", MODULE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


applied = _load()


def _params(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "path": str(tmp_path / "applied.json"),
        "inputs": {"vars": {"port": 8000, "key": "secret"}, "role": "abc"},
        "files": [str(tmp_path / "conf" / "*"), str(tmp_path / "unit.service")],
        "probes": [["cat", str(tmp_path / "probe.txt")]],
        "pidfiles": [],
    }
    params.update(changes)
    return params


@pytest.fixture
def node(tmp_path: Path) -> Path:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "a.env").write_text("A=1\n")
    (tmp_path / "conf" / "b.json").write_text("{}\n")
    (tmp_path / "unit.service").write_text("[Service]\n")
    (tmp_path / "probe.txt").write_text("active\n")
    return tmp_path


def _record(params: dict[str, Any]) -> dict[str, Any]:
    state = applied.state_now(params)
    Path(params["path"]).write_text(json.dumps(state))
    return dict(state)


def _reason(params: dict[str, Any]) -> str:
    recorded = json.loads(Path(params["path"]).read_text())
    return str(applied.difference(recorded, applied.state_now(params)))


def test_a_node_as_recorded_is_current_and_the_record_is_not_one_of_its_files(node: Path) -> None:
    params = _params(node, files=[str(node / "*"), str(node / "conf" / "*")])
    _record(params)
    assert _reason(params) == ""
    assert str(node / "applied.json") not in applied.state_now(params)["files"]


@pytest.mark.parametrize(
    ("drift", "expected"),
    [
        (lambda n: (n / "conf" / "a.env").write_text("A=2\n"), "a.env differs from the last run"),
        (lambda n: (n / "conf" / "a.env").chmod(0o640), "a.env differs from the last run"),
        (lambda n: (n / "unit.service").unlink(), "unit.service is missing"),
        (lambda n: (n / "conf" / "c.conf").write_text("new\n"), "c.conf is new"),
        (lambda n: (n / "conf" / "b.json").unlink(), "the set of managed files changed"),
        (lambda n: (n / "probe.txt").write_text("inactive\n"), "reports something else than after the last run"),
    ],
    ids=["edited", "mode", "removed", "added", "glob-shrunk", "probe"],
)
def test_every_drift_names_itself(node: Path, drift: Any, expected: str) -> None:
    params = _params(node)
    _record(params)
    drift(node)
    assert expected in _reason(params)


def test_changed_inputs_or_probes_are_not_current(node: Path) -> None:
    params = _params(node)
    _record(params)
    assert _reason({**params, "inputs": {"vars": {"port": 8001, "key": "secret"}, "role": "abc"}}) == (
        "the role's inputs changed"
    )
    assert _reason({**params, "inputs": {"vars": {"port": 8000, "key": "other"}, "role": "abc"}}) == (
        "the role's inputs changed"
    )
    assert _reason({**params, "inputs": {"vars": {"port": 8000, "key": "secret"}, "role": "abd"}}) == (
        "the role's inputs changed"
    )
    assert _reason({**params, "probes": []}) == "the set of probes changed"
    assert "no record" in str(applied.difference({}, applied.state_now(params)))


def test_the_record_keeps_no_secret(node: Path) -> None:
    params = _params(node, inputs={"vars": {"api_key": "sk-very-secret-value"}})
    text = json.dumps(_record(params))
    assert "sk-very-secret-value" not in text


def test_a_process_that_died_or_was_replaced_is_not_current(node: Path) -> None:
    first = subprocess.Popen(["sleep", "60"])
    second = subprocess.Popen(["sleep", "60"])
    try:
        pidfile = node / "x.pid"
        pidfile.write_text(f"{first.pid}\n")
        params = _params(node, pidfiles=[str(pidfile)])
        _record(params)
        assert _reason(params) == ""
        pidfile.write_text(f"{second.pid}\n")  # restarted: another process
        assert "is not the one the last run started" in _reason(params)
        pidfile.write_text(f"{first.pid}\n")
        first.kill()
        first.wait()
        assert "not running" in _reason(params)
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()


def test_a_pidfile_of_a_dead_process_never_matches_even_when_recorded_dead(node: Path) -> None:
    params = _params(node, pidfiles=[str(node / "none.pid")])
    _record(params)
    assert "not running" in _reason(params)


def _ansible(args: dict[str, Any], *, check: bool = False) -> dict[str, Any]:
    argv = [ANSIBLE, "localhost", "-c", "local", "-m", "vllm_fleet_applied", "-a", json.dumps(args), "-o"]
    env = dict(os.environ, ANSIBLE_LIBRARY=str(MODULE.parent), ANSIBLE_NOCOLOR="1")
    done = subprocess.run(
        [*argv, *(["--check"] if check else [])], capture_output=True, text=True, env=env, check=False, cwd=ROOT
    )
    assert " | " in done.stdout, done.stdout + done.stderr
    return dict(json.loads(done.stdout.split("=> ", 1)[1]))


@pytest.mark.skipif(not Path(ANSIBLE).exists(), reason="ansible not installed")
def test_the_module_records_only_outside_check_mode_and_never_returns_the_inputs(node: Path) -> None:
    args = _params(node, inputs={"api_key": "sk-module-secret"})
    assert _ansible(args)["current"] is False
    recorded = _ansible({**args, "state": "record"}, check=True)
    assert recorded["changed"] is True and not (node / "applied.json").exists()
    recorded = _ansible({**args, "state": "record"})
    assert recorded["changed"] is True and (node / "applied.json").stat().st_mode & 0o777 == 0o600
    assert _ansible({**args, "state": "record"})["changed"] is False
    now = _ansible(args)
    assert now["current"] is True and now["reason"] == ""
    assert "sk-module-secret" not in json.dumps(now) + (node / "applied.json").read_text()
    (node / "conf" / "a.env").write_text("A=3\n")
    assert _ansible(args, check=True)["reason"].endswith("a.env differs from the last run")
