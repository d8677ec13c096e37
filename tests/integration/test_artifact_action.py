"""The action vllm_fleet_artifact (plugins/action) through ansible-playbook on this machine: it
writes a controller file once, changes nothing when the file already holds it, keeps its hands
off in check mode (unless the task says check_mode: false) and shows a diff."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests.conftest import PLAYBOOK, failures, run_playbook

pytestmark = pytest.mark.skipif(PLAYBOOK is None, reason="ansible-playbook not installed")

PLAY = """
- name: Write an artifact
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Write it
      vllm_fleet_artifact:
        dest: "{{ dest }}"
        content: "{{ content }}"
        mode: "0600"
      register: written

    - name: Write it in check mode too when asked
      vllm_fleet_artifact:
        dest: "{{ dest }}.forced"
        content: "{{ content }}"
      check_mode: false
      register: forced

    - name: Show what happened
      ansible.builtin.debug:
        msg: "RESULT {{ {'written': written.changed, 'forced': forced.changed} | to_json }}"
"""


def _run(tmp_path: Path, content: str, *extra: str) -> tuple[dict[str, bool], str]:
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    localhost:\n")
    dest = tmp_path / "out" / "verify.json"
    done = run_playbook(
        tmp_path / "play.yml", tmp_path / "hosts.yml", "-e", json.dumps({"dest": str(dest), "content": content}), *extra
    )
    assert done.returncode == 0, failures(done)
    line = next(x for x in done.stdout.splitlines() if "RESULT " in x)
    return json.loads(line.split("RESULT ", 1)[1].strip().strip("'\"")), done.stdout


def test_artifact_written_once_then_unchanged_and_check_mode_writes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "out" / "verify.json"
    # check mode first: nothing written (the folder neither), but reported as a change, with a diff
    result, stdout = _run(tmp_path, '{"a": 1}\n', "--check", "--diff")
    assert result == {"written": True, "forced": True}
    assert not dest.exists() and (tmp_path / "out" / "verify.json.forced").read_text() == '{"a": 1}\n'
    assert '+{"a": 1}' in stdout
    # written, with its mode, the folder created
    result, _ = _run(tmp_path, '{"a": 1}\n')
    assert result["written"] and dest.read_text() == '{"a": 1}\n'
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
    # the same again: no change
    result, _ = _run(tmp_path, '{"a": 1}\n')
    assert result == {"written": False, "forced": False}
    # new content in check mode: a change reported, the file as it was
    result, stdout = _run(tmp_path, '{"a": 2}\n', "--check", "--diff")
    assert result["written"] and dest.read_text() == '{"a": 1}\n'
    assert '-{"a": 1}' in stdout and '+{"a": 2}' in stdout
