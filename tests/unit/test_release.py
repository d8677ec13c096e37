"""The release: one version everywhere, the Ansible collection builds, installs and runs (its
filters' documentation in ansible-doc, its site playbook by FQCN), and the Python package
builds as sdist and wheel, the wheel working without the checkout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from vllm_fleet import __version__, cli, collection

BIN = Path(sys.executable).parent


def _run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, env={**os.environ, **env},
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, f"{argv[:3]}: {done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


def test_one_version_in_the_cli_the_changelog_and_the_collection(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"vllm-fleet {__version__}"
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases and releases[0][0] == __version__
    assert collection.galaxy()["version"] == __version__


def test_the_collection_builds_documents_its_filters_and_plans(tmp_path: Path) -> None:
    src = collection.build(tmp_path / "src")
    _run([str(BIN / "ansible-galaxy"), "collection", "build", str(src), "--output-path", str(tmp_path)], tmp_path)
    tarball = tmp_path / f"vllm_fleet-core-{__version__}.tar.gz"
    with tarfile.open(tarball) as tar:
        members = tar.getmembers()
    names = {m.name for m in members}
    assert not [m.name for m in members if m.issym()], "a symlink in the collection"
    assert {"roles/vllm_server/files/vllm_fleet_agents/reap.py", "playbooks/site.yml", "vllm_fleet/cli.py"} <= names
    installed = tmp_path / "collections"
    _run([str(BIN / "ansible-galaxy"), "collection", "install", "--no-deps", "-p", str(installed), str(tarball)],
         tmp_path)  # fmt: skip
    env = {"ANSIBLE_COLLECTIONS_PATH": str(installed), "ANSIBLE_CONFIG": ""}
    filters = sorted(f"vllm_fleet.core.{p.stem}" for p in (ROOT / "plugins/filter").glob("vllm_fleet_*.py"))
    docs = json.loads(_run([str(BIN / "ansible-doc"), "-t", "filter", "--json", *filters], tmp_path, **env).stdout)
    assert sorted(docs) == filters
    assert all(d["doc"]["short_description"] and d["examples"] for d in docs.values())
    # The site playbook by its FQCN, from a folder outside the checkout: the plan phase only (no host).
    art = tmp_path / "artifacts"
    _run([str(BIN / "ansible-playbook"), "vllm_fleet.core.site", "-i", str(ROOT / "inventories/example-2x8xa800"),
          "--tags", "plan", "-e", f"vllm_fleet_artifacts_dir={art}"], tmp_path, **env)  # fmt: skip
    plan = json.loads((art / "plan.json").read_text())
    assert plan["instances"][0]["pipeline_parallel_size"] == 2
    # The collection's own planner finds its site playbook (playbooks/site.yml) for `kubernetes -i`.
    root = installed / "ansible_collections/vllm_fleet/core"
    inventory = str(ROOT / "inventories/example-2x8xa800")
    done = _run([sys.executable, "-m", "vllm_fleet.cli", "kubernetes", "-i", inventory], tmp_path,
                PYTHONPATH=str(root), **env)  # fmt: skip
    assert "kind: LeaderWorkerSet" in done.stdout


def test_sdist_and_wheel_build_and_the_wheel_works_alone(tmp_path: Path) -> None:
    _run([sys.executable, "-m", "build", "--outdir", str(tmp_path / "dist"), str(ROOT)], tmp_path)
    (wheel,) = (tmp_path / "dist").glob(f"vllm_fleet-{__version__}-py3-none-any.whl")
    assert (tmp_path / "dist" / f"vllm_fleet-{__version__}.tar.gz").exists()
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)]
    _run(pip, tmp_path)
    env = {"PYTHONPATH": str(target)}
    where = _run([sys.executable, "-c", "import vllm_fleet.deploy.deployment as d; print(d.ROLES)"], tmp_path, **env)
    assert where.stdout.strip() == str(target / "vllm_fleet_roles")
    cluster = str(ROOT / "tests/unit/fixtures/2x8xa800.yml")
    plan = tmp_path / "plan.json"
    args = ["--cluster", cluster, "--model", "meta-llama/Llama-3.1-405B-Instruct", "--max-model-len", "8192"]
    plan.write_text(_run([sys.executable, "-m", "vllm_fleet.cli", "plan", *args, "--json"], tmp_path, **env).stdout)
    # What reads the roles' files: a node's record (their defaults) and the manifests (rules, route.js).
    _run([sys.executable, "-m", "vllm_fleet.cli", "plan", *args, "--node", "a800-2"], tmp_path, **env)
    done = _run([sys.executable, "-m", "vllm_fleet.cli", "kubernetes", "--plan", str(plan)], tmp_path, **env)
    assert "kind: PrometheusRule" in done.stdout
