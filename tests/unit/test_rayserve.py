"""vllm_fleet/deploy/rayserve.py without Ray: what goes into each LLMConfig (Ray Serve's own models
check the result in tests/oracle/test_ray_serve_config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from vllm_fleet import cli
from vllm_fleet.deploy.rayserve import engine_kwargs, serve_config
from vllm_fleet.planning.allocate import allocate, combined_plan, load_wishes
from vllm_fleet.planning.cluster import cluster_from_data

A800 = ROOT / "tests/unit/fixtures/2x8xa800.yml"


def test_vllm_flags_become_engine_keywords_without_what_ray_serve_sets() -> None:
    argv = ["serve", "m", "--host", "h", "--port", "8000", "--served-model-name", "x", "--tensor-parallel-size", "2",
            "--gpu-memory-utilization", "0.9", "--enforce-eager", "--dtype", "bfloat16"]  # fmt: skip
    assert engine_kwargs(argv) == {
        "tensor_parallel_size": 2, "gpu_memory_utilization": 0.9, "enforce_eager": True, "dtype": "bfloat16",
    }  # fmt: skip


def _models(tmp_path: Path, entries: list[dict[str, object]]) -> Path:
    path = tmp_path / "models.yml"
    path.write_text(yaml.safe_dump({"vllm_fleet_models": entries}))
    return path


def test_autoscaling_spans_min_replicas_to_the_allocated_replicas(tmp_path: Path) -> None:
    nodes = cluster_from_data({"nodes": [{"name": "h", "gpu": "H100-SXM", "gpu_count": 8}]})
    wishes = [{"model": "meta-llama/Llama-3.1-8B-Instruct", "served_model_name": "a", "max_model_len": 8192,
               "min_replicas": 2, "replicas": 3}]  # fmt: skip
    plan = combined_plan(allocate(load_wishes(_models(tmp_path, wishes)), nodes))
    config, notes = serve_config(plan)
    (llm,) = config["applications"][0]["args"]["llm_configs"]
    auto = llm["deployment_config"]["autoscaling_config"]
    assert (auto["min_replicas"], auto["max_replicas"]) == (2, 3) and auto["target_ongoing_requests"] >= 1
    assert llm["accelerator_type"] == "H100" and notes == []
    assert llm["model_loading_config"] == {"model_id": "a", "model_source": "meta-llama/Llama-3.1-8B-Instruct"}
    assert llm["placement_group_config"] == {"bundles": [{"GPU": 1}], "strategy": "STRICT_PACK"}


def test_a_single_model_plan_is_refused() -> None:
    with pytest.raises(ValueError, match="multi-model plan"):
        serve_config({"strategy": "replicas", "instances": []})


def test_the_cli_writes_the_file_and_says_what_it_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = _models(tmp_path, [{"model": "meta-llama/Llama-3.1-8B-Instruct", "max_model_len": 8192}])
    out = tmp_path / "serve.yaml"
    assert cli.main(["plan", "--models", str(models), "--cluster", str(A800), "--ray-serve-config", str(out)]) == 0
    assert "no accelerator type for A800" in capsys.readouterr().err
    config = yaml.safe_load(out.read_text())
    assert config["applications"][0]["import_path"] == "ray.serve.llm:build_openai_app"
    # Without --models: one line naming the flag, exit 2.
    argv = [
        "plan",
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--cluster",
        str(A800),
        "--ray-serve-config",
        str(out),
    ]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ray-serve-config" in err
