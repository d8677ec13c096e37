"""No secret at any verbosity: the plan and preview phases of a copy of the local default at
-vvv, with the API key, the Hub token and the Ray token from an Ansible Vault file (the router's
key is the API key). Every byte of the output and of the artifacts is scanned for each value.
(The full site run at -vvv, on a real deployment: tests/system/test_local_default.py.)"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PLAYBOOK, ROOT, run_site

pytestmark = pytest.mark.skipif(PLAYBOOK is None, reason="ansible-playbook not installed")


def vault_file(path: Path, values: dict[str, str]) -> tuple[Path, Path]:
    """``values`` as a Vault-encrypted YAML file at ``path``, and its password file (0600)."""
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    password = path.with_name(path.name + ".password")
    password.write_text(secrets.token_hex(16))
    password.chmod(0o600)
    encrypt = Path(str(PLAYBOOK)).with_name("ansible-vault")
    done = subprocess.run(
        [str(encrypt), "encrypt", "--vault-password-file", str(password), str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "$ANSIBLE_VAULT" in path.read_text()
    return path, password


def vault_inventory(tmp_path: Path, values: dict[str, str]) -> tuple[Path, Path]:
    """A copy of inventories/local whose group_vars/all/vault.yml is Vault-encrypted ``values``;
    returns the inventory and the vault password file."""
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventories/local", inventory)
    (inventory / "group_vars/all").mkdir()
    (inventory / "group_vars/all.yml").rename(inventory / "group_vars/all/main.yml")
    _, password = vault_file(inventory / "group_vars/all/vault.yml", values)
    return inventory, password


def leaks(values: dict[str, str], output: str, folder: Path) -> list[str]:
    """Where each secret value shows: ``name in output`` or ``name in file``."""
    found = [f"{name} in the output" for name, value in values.items() if value in output]
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found += [f"{name} in {path}" for name, value in values.items() if value.encode() in data]
    return found


def test_plan_and_preview_at_vvv_show_no_secret(tmp_path: Path) -> None:
    values = {
        "vllm_fleet_api_key": f"key-{secrets.token_hex(12)}",
        "vllm_fleet_hf_token": f"hf_{secrets.token_hex(12)}",
        "ray_cluster_auth_token": secrets.token_hex(32),
    }
    inventory, password = vault_inventory(tmp_path, values)
    password.rename(tmp_path / "vault-password")  # not in the inventory folder
    password = tmp_path / "vault-password"
    artifacts = tmp_path / "artifacts"
    result = run_site(inventory, artifacts, "--tags", "plan,preview", "-vvv", "--vault-password-file", str(password))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    # The scan is meaningful: the plan phase wrote every node's settings, with the role variables
    # that once carried the Ray token, and the Vault file was read (the settings know there is a
    # key, and the gateway opens with it).
    settings = json.loads((artifacts / "plan-inputs.json").read_text())["settings"]
    (node,) = settings["nodes"]
    assert settings["role_vars"][node]["ray_cluster_num_cpus"] == 1
    assert settings["nodes"][node]["api_key"] is True and settings["nodes"][node]["hf_token"] is True
    assert "listens on 127.0.0.1" not in output, "the Vault key did not reach the plan"
    assert (artifacts / "plan.json").is_file() and (artifacts / "preview.json").is_file()
    assert leaks(values, output, artifacts) == []
