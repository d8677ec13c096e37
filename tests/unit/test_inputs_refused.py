"""Inputs that used to pass and that vLLM or the deployment cannot run (issue 46, part 2): one
class a test, each refused with one line naming the field and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fleet.cli import EXIT_DOES_NOT_FIT, main
from vllm_fleet.errors import PlanError
from vllm_fleet.model.spec import load_model
from vllm_fleet.planning.checks import block_size_multiple, check_release
from vllm_fleet.planning.cluster import cluster_from_data
from vllm_fleet.planning.strategy import Wishes, plan_cluster

ESTIMATE = ["estimate", "--gpu", "H100-SXM", "--model", "Qwen/Qwen3-8B"]
TINY = Path(__file__).resolve().parents[2] / "inventories/local/files/tiny-llama"


def _exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("version", ["", "garbage", "0.32.0 beta", "v0.32.0-latest", "latest", "0.4.3", "1"])
def test_a_version_that_is_no_known_release_is_exit_2(version: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _exit([*ESTIMATE, "--vllm-version", version], capsys)
    assert code == 2 and err.count("\n") == 1 and "--vllm-version" in err, err


@pytest.mark.parametrize("version", ["0.32.0", "v0.32.0", "0.11", "0.32.0rc1", "0.10.1.post1", "0.5.4"])
def test_a_known_release_plans_without_a_word(version: str) -> None:
    assert check_release(version) is None


def test_a_newer_release_plans_with_the_newest_accounting_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert "newer than the newest accounting" in str(check_release("0.40.0"))
    assert main([*ESTIMATE, "--vllm-version", "0.40.0", "--json"]) == 0
    assert "newer than the newest accounting" in json.loads(capsys.readouterr().out)["warnings"][0]


def test_a_plan_refuses_a_bad_version_by_its_field() -> None:
    nodes = cluster_from_data({"nodes": [{"name": "n", "gpu": "H100-SXM", "gpu_count": 1}]})
    with pytest.raises(PlanError) as err:
        plan_cluster(load_model("Qwen/Qwen3-8B"), nodes, Wishes(vllm_version="0.32.0 beta"))
    assert err.value.field == "--vllm-version"  # the filter renames it vllm_fleet_vllm_version


@pytest.mark.parametrize(
    ("gpu", "model", "size", "refused"),
    [
        ("--gpu H100-SXM", "Qwen/Qwen3-8B", 24, True),  # FlashAttention, FlashInfer, Triton: multiples of 16
        ("--gpu H100-SXM", "Qwen/Qwen3-8B", 48, False),
        ("--gpu H100-SXM", "deepseek-ai/DeepSeek-V3.2", 32, True),  # sparse MLA's indexer: multiples of 64
        ("--gpu-memory-gib 8", "Qwen/Qwen3-8B", 128, False),
    ],
)
def test_block_sizes_vllm_refuses_are_refused(
    gpu: str, model: str, size: int, refused: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _exit(["estimate", *gpu.split(), "--model", model, "--block-size", str(size), "--json"], capsys)
    if refused:
        assert code == 2 and "--block-size" in err and "multiples of" in err, err
    else:
        assert code in (0, EXIT_DOES_NOT_FIT) and err == "", err


def test_the_cpu_build_takes_multiples_of_32() -> None:
    tiny = load_model(str(TINY))
    assert block_size_multiple(tiny, "cpu") == 32
    nodes = cluster_from_data({"nodes": [{"name": "c", "gpu": "cpu", "gpu_count": 1, "gpu_memory_gib": 2}]})
    with pytest.raises(PlanError, match="vLLM's CPU build, which take multiples of 32"):
        plan_cluster(tiny, nodes, Wishes(block_size=16, max_model_len=2048))
    assert plan_cluster(tiny, nodes, Wishes(block_size=64, max_model_len=2048))["instances"]


def test_estimate_exit_codes_tell_refused_from_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    # fits: 0; does not fit: 3 (the table still says why); vLLM refuses: 2 with vLLM's reason.
    assert main([*ESTIMATE]) == 0
    assert main(["estimate", "--gpu", "H100-SXM", "--model", "meta-llama/Llama-3.1-405B"]) == EXIT_DOES_NOT_FIT
    assert "DOES NOT FIT" in capsys.readouterr().out
    code, err = _exit(["estimate", "--gpu", "T4", "--model", "Qwen/Qwen3-8B", "--dtype", "bfloat16"], capsys)
    assert code == 2 and err.count("\n") == 1, err


def test_the_cluster_file_refuses_two_names_for_one_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "c.yml"
    cluster.write_text(
        "nodes:\n  - {name: a, gpu: H100-SXM, gpu_count: 8, address: 10.0.0.5}\n"
        "  - {name: b, gpu: H100-SXM, gpu_count: 8, address: 10.0.0.5}\n"
    )
    code, err = _exit(["plan", "--cluster", str(cluster), "--model", "Qwen/Qwen3-8B"], capsys)
    assert code == 2 and "nodes[1].address: a and b are one machine (10.0.0.5)" in err, err
