"""The Ray Serve LLM config vllm_fleet/deploy/rayserve.py renders from a multi-model plan, checked by
Ray Serve's own pydantic models (ServeDeploySchema for the application, LLMConfig for each
model) in an interpreter with Ray Serve: ``VLLM_FLEET_RAY_SERVE_PYTHON`` (CI builds it from
PyPI: ``python -m tests.hosts ray-serve``). Without one the test skips, unless
``VLLM_FLEET_ORACLE_REQUIRED=1`` (CI), where it fails."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from tests.hosts.common import CACHE
from vllm_fleet.deploy.rayserve import RAY_ACCELERATORS, serve_config
from vllm_fleet.planning.allocate import allocate, combined_plan, load_wishes
from vllm_fleet.planning.cluster import cluster_from_data, load_cluster

CHECK = """
import json, sys
import yaml
from ray.serve.schema import ServeDeploySchema
from ray.llm._internal.serve.core.configs.llm_config import LLMConfig
config = yaml.safe_load(open(sys.argv[1]))
apps = ServeDeploySchema.model_validate(config).applications
rows = []
for app in config["applications"]:
    for raw in app["args"]["llm_configs"]:
        try:
            c = LLMConfig.model_validate(raw)
        except Exception as exc:  # pydantic's ValidationError, and Ray's ValueErrors
            rows.append({"error": " ".join(str(exc).split())})
            continue
        rows.append({"model_id": c.model_id, "accelerator_type": c.accelerator_type,
                     "kind": c.accelerator_config.kind, "engine_kwargs": c.engine_kwargs,
                     "bundles": len(c.placement_group_config["bundles"])})
print(json.dumps({"applications": [a.import_path for a in apps], "configs": rows}))
"""


def _python() -> Path:
    named = os.environ.get("VLLM_FLEET_RAY_SERVE_PYTHON")
    found = Path(named) if named else next((v / "bin/python" for v in sorted(CACHE.glob("rayserve-*"))), None)
    if found is None or not found.exists():
        if os.environ.get("VLLM_FLEET_ORACLE_REQUIRED") == "1":
            pytest.fail("no Ray Serve interpreter: run `python -m tests.hosts ray-serve`")
        pytest.skip("no Ray Serve interpreter (python -m tests.hosts ray-serve builds one)")
    return found


def _check(tmp_path: Path, config: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [str(_python()), "-c", CHECK, str(path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_seeds_three_models_give_a_config_ray_serve_accepts(tmp_path: Path) -> None:
    wishes = yaml.safe_load((ROOT / "inventories/example-models/group_vars/all.yml").read_text())
    models = tmp_path / "models.yml"
    models.write_text(yaml.safe_dump({"vllm_fleet_models": wishes["vllm_fleet_models"]}))
    plan = combined_plan(allocate(load_wishes(models), load_cluster(ROOT / "tests/unit/fixtures/2x8xa800.yml")))
    config, notes = serve_config(plan)
    checked = _check(tmp_path, config)
    assert checked["applications"] == ["ray.serve.llm:build_openai_app"]
    by_id = {c["model_id"]: c for c in checked["configs"]}
    assert sorted(by_id) == ["e5-mistral", "llama-70b", "llama-8b"], checked
    for model in plan["models"]:
        row = by_id[model["name"]]
        inst = next(i for i in plan["instances"] if i["served_model_name"] == model["name"])
        # The engine gets the plan's layout and limits; Ray Serve sets host, port and the name.
        assert row["engine_kwargs"]["tensor_parallel_size"] == inst["tensor_parallel_size"]
        assert row["engine_kwargs"]["max_model_len"] == inst["max_model_len"]
        assert row["bundles"] == inst["tensor_parallel_size"] * inst["pipeline_parallel_size"]
        assert not {"host", "port", "served_model_name"} & set(row["engine_kwargs"])
        assert row["kind"] == "gpu" and row["accelerator_type"] is None  # Ray has no name for the A800
    assert any("no accelerator type for A800" in n for n in notes)


def test_ray_names_the_gpus_it_knows_and_refuses_one_it_does_not(tmp_path: Path) -> None:
    nodes = cluster_from_data(
        {"nodes": [{"name": "h", "gpu": "H100-SXM", "gpu_count": 8}, {"name": "l", "gpu": "L4", "gpu_count": 4}]}
    )
    models = tmp_path / "models.yml"
    models.write_text(
        yaml.safe_dump(
            {
                "vllm_fleet_models": [
                    {"model": "meta-llama/Llama-3.1-8B-Instruct", "served_model_name": "a", "max_model_len": 8192},
                    {"model": "meta-llama/Llama-3.1-8B-Instruct", "served_model_name": "b", "max_model_len": 4096},
                ]
            }
        )
    )
    config, _ = serve_config(combined_plan(allocate(load_wishes(models), nodes)))
    checked = _check(tmp_path, config)
    assert {c["accelerator_type"] for c in checked["configs"]} <= {RAY_ACCELERATORS["H100-SXM"], RAY_ACCELERATORS["L4"]}
    assert all(c["accelerator_type"] for c in checked["configs"]), checked
    # The check itself can fail: a name Ray does not know is refused by LLMConfig.
    config["applications"][0]["args"]["llm_configs"][0]["accelerator_type"] = "A800"
    refused = _check(tmp_path, config)["configs"][0]
    assert "error" in refused and "A800" in refused["error"], refused
