"""The Ansible filters (plugins/filter/): one file per filter, as community.general ships them, each
with DOCUMENTATION, EXAMPLES and RETURN that ansible-doc reads, its options matching the function,
and each one used by a playbook or a role."""

from __future__ import annotations

import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, load_script

pytest.importorskip("ansible")

FILTERS = sorted((ROOT / "plugins" / "filter").glob("[!_]*.py"))
# Filters no playbook calls, each kept for a reason.
OPERATOR_ONLY = {
    # The NCCL transport check (vllm_fleet/ops/nccl.py) for an operator's own play on a rank's log; the
    # verify phase does not read NCCL logs yet.
    "vllm_fleet_nccl_check",
    # The plan phase's steps, for an operator's own play: site.yml runs them as one Python pass (the
    # action plugins/action/vllm_fleet_plan_phase.py; issue 48), and tests/unit/test_plan_phase.py
    # checks that both give the same plan, deployment and records.
    "vllm_fleet_plan_nodes",
    "vllm_fleet_plan_models",
    "vllm_fleet_check_ports",
    "vllm_fleet_deployment",
    "vllm_fleet_records",
    "vllm_fleet_plan_table",
}


def _used_by() -> str:
    texts = [p.read_text() for p in [ROOT / "site.yml", *ROOT.glob("playbooks/**/*.yml"), *ROOT.glob("roles/**/*.yml")]]
    return "\n".join(texts)


@pytest.mark.parametrize("path", FILTERS, ids=[p.stem for p in FILTERS])
def test_each_filter_is_one_documented_file(path: Path) -> None:
    module = load_script(path)
    (name,) = module.FilterModule().filters()
    assert name == path.stem, "the file is named after its filter (ansible-doc finds the docs by that name)"
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert doc["name"] == name and doc["short_description"] and doc["description"]
    params = list(inspect.signature(module.FilterModule().filters()[name]).parameters)
    assert list(doc["options"]) == ["_input", *params[1:]], "every argument documented, in order"
    for option in doc["options"].values():
        assert option["description"] and option["type"]
    positional = [p.strip() for p in str(doc.get("positional") or "").split(",") if p.strip()]
    assert positional == params[1 : 1 + len(positional)]
    examples = yaml.safe_load(module.EXAMPLES)
    assert examples and all(name in json.dumps(task) for task in examples)
    assert yaml.safe_load(module.RETURN)["_value"]["description"]


def test_ansible_doc_reads_every_filter() -> None:
    names = [p.stem for p in FILTERS]
    doc = shutil.which("ansible-doc", path=str(Path(sys.executable).parent)) or "ansible-doc"
    done = subprocess.run(
        [doc, "-t", "filter", "--json", *names], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert sorted(found) == names
    for name, entry in found.items():
        assert entry["doc"]["filename"].endswith(f"plugins/filter/{name}.py")
        assert entry["examples"] and entry["return"], name


def test_every_filter_is_used() -> None:
    text = _used_by()
    unused = {p.stem for p in FILTERS if not re.search(rf"\|\s*{p.stem}\b", text)} - OPERATOR_ONLY
    assert not unused, f"filters no playbook or role calls: {sorted(unused)}; remove them"
    assert not OPERATOR_ONLY & {p.stem for p in FILTERS if re.search(rf"\|\s*{p.stem}\b", text)}
