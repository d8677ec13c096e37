"""The nvidia_driver role's fabric manager package for each distribution and branch, as Ansible
renders the role's own defaults and vars (one run on this machine). The test hosts are Debian 12
only, so this is where Ubuntu's and EL 9's names are checked."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
import yaml

from tests.conftest import PLAYBOOK, ROOT, run_playbook

pytestmark = pytest.mark.skipif(PLAYBOOK is None, reason="ansible-playbook not installed")

ROLE = ROOT / "roles/nvidia_driver"
# (os as the role names it, nvidia_driver_branch) -> the package; the sources are in vars/main.yml.
PACKAGES = {
    ("Ubuntu", "570"): "nvidia-fabricmanager-570",
    ("Ubuntu", "580"): "nvidia-fabricmanager-580",
    ("RedHat", "570"): "nvidia-fabric-manager",
    ("RedHat", "575"): "nvidia-fabric-manager",
    ("RedHat", "580"): "nvidia-fabricmanager",
    ("Debian", "570"): "nvidia-fabricmanager-535",  # Debian 12 has one branch: nvidia_driver_branch does not apply
}
# nvidia_driver_fabricmanager as an inventory may write it -> what the role decides with.
MODES: list[tuple[Any, str]] = [
    ("auto", "auto"),
    (True, "true"),
    (False, "false"),
    ("true", "true"),
    ("false", "false"),
]

PLAY = f"""
- name: Render the role's fabric manager choices
  hosts: localhost
  gather_facts: false
  vars_files:
    - {ROLE}/defaults/main.yml
    - {ROLE}/vars/main.yml
  tasks:
    - name: The package for each distribution and branch
      ansible.builtin.set_fact:
        packages: "{{{{ packages | default([]) + [nvidia_driver_fabricmanager_package_by_os[item.os]] }}}}"
      vars:
        nvidia_driver_branch: "{{{{ item.branch }}}}"
      loop: "{{{{ package_cases }}}}"

    - name: The mode for each way of writing nvidia_driver_fabricmanager
      ansible.builtin.set_fact:
        modes: "{{{{ modes | default([]) + [nvidia_driver_fabricmanager_mode] }}}}"
      vars:
        nvidia_driver_fabricmanager: "{{{{ item }}}}"
      loop: "{{{{ mode_cases }}}}"

    - name: Write them down
      ansible.builtin.copy:
        dest: "{{{{ out }}}}/rendered.json"
        content: "{{{{ {{'packages': packages, 'modes': modes}} | to_json }}}}"
        mode: "0600"
"""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    tmp = tmp_path_factory.mktemp("nvidia_driver")
    variables = {
        "out": str(tmp),
        "package_cases": [{"os": os, "branch": branch} for os, branch in PACKAGES],
        "mode_cases": [written for written, _ in MODES],
    }
    (tmp / "vars.json").write_text(json.dumps(variables))
    (tmp / "hosts").write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    (tmp / "render.yml").write_text(PLAY)
    done = run_playbook(tmp / "render.yml", tmp / "hosts", "-e", f"@{tmp / 'vars.json'}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    result: dict[str, list[str]] = json.loads((tmp / "rendered.json").read_text())
    return result


@pytest.mark.parametrize(("case", "package"), list(PACKAGES.items()), ids=[f"{os}-{branch}" for os, branch in PACKAGES])
def test_the_fabric_manager_package(rendered: dict[str, list[str]], case: tuple[str, str], package: str) -> None:
    assert rendered["packages"][list(PACKAGES).index(case)] == package


def test_the_fabric_manager_switch_as_yaml_booleans_or_strings(rendered: dict[str, list[str]]) -> None:
    assert rendered["modes"] == [mode for _, mode in MODES]


def test_every_new_variable_is_declared_and_documented() -> None:
    """defaults/main.yml, meta/argument_specs.yml and README.md name the same fabric manager variables."""
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    readme = (ROLE / "README.md").read_text()
    names = sorted(name for name in defaults if name.startswith("nvidia_driver_fabricmanager"))
    assert len(names) == 4, names
    assert all(name in specs for name in names)
    assert all(f"`{name}`" in readme for name in names)
    assert defaults["nvidia_driver_fabricmanager"] in specs["nvidia_driver_fabricmanager"]["choices"]
