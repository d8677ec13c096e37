from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT
from vllm_fleet import tools
from vllm_fleet.cli import main

REQUIRED = {
    "weights_gib",
    "activation_gib",
    "non_torch_gib",
    "cuda_graph_gib",
    "kv_cache_gib",
    "kv_bytes_per_token",
    "kv_cache_tokens",
    "max_concurrency",
    "fits",
    "ranks",
}


def test_estimate_json_has_the_contract_fields(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "estimate",
            "--model",
            "meta-llama/Llama-3.1-70B",
            "--gpu",
            "H100-SXM",
            "-tp",
            "4",
            "-pp",
            "2",
            "--max-model-len",
            "32768",
            "--json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= REQUIRED
    assert len(data["ranks"]) == 8 and REQUIRED - {"ranks", "max_concurrency", "fits"} <= set(data["ranks"][0])
    assert data["fits"] is True and data["kv_cache_tokens"] > 32768


def test_estimate_table_shows_bars(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--model", "Qwen/Qwen3-8B", "--gpu-memory-gib", "79.2"]) == 0
    out = capsys.readouterr().out
    assert "W=weights O=overheads K=KV" in out and "WWW" in out and "KKK" in out and "FITS: fits" in out


def test_estimate_reads_a_model_folder(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--model", str(tiny_model), "--gpu-memory-gib", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kv_bytes_per_token"] == 2 * 4 * 2 * 32 * 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--model", "Qwen/Qwen3-8B", "--gpu", "Z9000"], "--gpu: unknown GPU 'Z9000'", id="unknown-gpu"),
        pytest.param(["--model", "nope/nope", "--gpu", "H100"], "--model: 'nope/nope' is neither", id="unknown-model"),
        pytest.param(
            ["--model", "Qwen/Qwen3-8B", "--gpu", "H100", "-tp", "3"],
            "--tensor-parallel-size: TP=3 does not divide the 32 attention heads",
            id="tp-heads",
        ),
        pytest.param(
            ["--model", "Qwen/Qwen3-8B", "--gpu", "H100", "--gpu-memory-utilization", "1.5"],
            "must be in (0, 1]",
            id="util",
        ),
        pytest.param(
            ["--model", "Qwen/Qwen3-8B", "--gpu", "H100", "--max-model-len", "-5"],
            "must be a positive integer",
            id="negative",
        ),
        pytest.param(["--model", "Qwen/Qwen3-8B", "--gpu-memory-gib", "0"], "must be positive", id="zero-memory"),
        pytest.param(
            ["--model", "Qwen/Qwen3-8B"], "one of the arguments --gpu-memory-gib --gpu is required", id="no-gpu"
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        code = main(["estimate", *argv])
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_plan_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "plan",
                "--cluster",
                str(FIXTURES / "a800_l20.yml"),
                "--model",
                "deepseek-ai/DeepSeek-R1",
                "--max-model-len",
                "32768",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert {"instances", "rejected", "gateway"} <= set(data)
    inst = data["instances"][0]
    for key in (
        "nodes",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "enable_expert_parallel",
        "stages",
        "layer_partition",
        "placement",
        "vllm_args",
        "env",
        "memory",
    ):
        assert key in inst
    assert {"layout", "reason", "tensor_parallel_size"} <= set(data["rejected"][0])


def test_plan_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "plan",
                "--cluster",
                str(FIXTURES / "2x8xa800.yml"),
                "--model",
                "Qwen/Qwen2.5-72B-Instruct",
                "--max-model-len",
                "8192",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("Plan for Qwen/Qwen2.5-72B-Instruct") and "Rejected layouts:" in out


def test_plan_nothing_fits_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Does not fit: its own exit code (3), not a bad input's (2), so scripts tell them apart."""
    cluster = tmp_path / "c.yml"
    cluster.write_text("nodes:\n  - {name: small, gpu: T4, gpu_count: 1}\n")
    assert main(["plan", "--cluster", str(cluster), "--model", "meta-llama/Llama-3.1-405B"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "no layout fits meta-llama/Llama-3.1-405B" in err and "fix:" in err


def test_plan_bad_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "c.yml"
    cluster.write_text("nodes: [\n")
    assert main(["plan", "--cluster", str(cluster), "--model", "Qwen/Qwen3-8B"]) == 2
    assert "is not valid YAML" in capsys.readouterr().err


def test_catalog_listings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0 and "deepseek-ai/DeepSeek-R1" in capsys.readouterr().out
    assert main(["gpus"]) == 0 and "H200" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["status", "doctor"])
def test_an_inventory_that_is_not_there_is_exit_2_in_every_command(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not the checkout's artifacts (another deployment's status), not a traceback."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for inventory, said in ((tmp_path / "nope", "does not exist"), (empty, "is an empty folder")):
        assert main([command, "-i", str(inventory)]) == 2
        err = capsys.readouterr().err.strip()
        assert f"--inventory: {inventory} {said}" in err and len(err.splitlines()) == 1, err


def test_a_missing_ansible_tool_names_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.executable", str(tmp_path / "python3"))  # no ansible-playbook beside it
    monkeypatch.setenv("PATH", str(tmp_path))
    for command in ("doctor", "status"):
        assert main([command, "-i", str(ROOT / "inventories/local")]) == 2
        err = capsys.readouterr().err.strip()
        assert "is not installed; fix: install ansible-core" in err and len(err.splitlines()) == 1, err


def test_a_comma_list_of_hosts_is_an_inventory() -> None:
    assert tools.inventory("gpu-1,gpu-2,") == "gpu-1,gpu-2,"
