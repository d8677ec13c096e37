from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import write_safetensors
from vllm_fleet.errors import PlanError
from vllm_fleet.model.catalog import MODELS, lookup_gpu, lookup_model
from vllm_fleet.model.files import read_safetensors_bytes
from vllm_fleet.model.quantread import quant_from_name
from vllm_fleet.model.spec import load_model, spec_from_config


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_catalog_model_parses(name: str) -> None:
    spec = load_model(name)
    assert spec.num_layers > 0
    assert spec.num_attention_heads % spec.num_kv_heads == 0 or spec.is_mla


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B", id="instruct-alias"),
        pytest.param("Qwen3-8B", "Qwen/Qwen3-8B", id="without-org"),
        pytest.param("qwen/qwen3-8b", "Qwen/Qwen3-8B", id="case-insensitive"),
    ],
)
def test_catalog_lookup(name: str, expected: str) -> None:
    assert lookup_model(name) == MODELS[expected]


def test_deepseek_is_mla_moe_fp8() -> None:
    spec = load_model("deepseek-ai/DeepSeek-R1")
    assert spec.is_mla and spec.is_moe
    assert spec.kv_elems_per_token_per_layer == 576
    assert spec.first_dense_layers == 3 and not spec.is_moe_layer(2) and spec.is_moe_layer(3)
    assert spec.quant is not None and spec.quant.method == "fp8" and spec.quant.group_size == 128 * 128


def test_gpt_oss_is_hybrid_with_mxfp4_experts() -> None:
    spec = load_model("openai/gpt-oss-120b")
    assert spec.layer_types.count("sliding") == 18 and spec.sliding_window == 128
    assert spec.quant is not None and spec.quant.experts_only


@pytest.mark.parametrize(
    ("method", "qcfg", "bytes_per_weight"),
    [
        pytest.param("fp8", {}, 1.0, id="fp8-per-tensor"),
        pytest.param("awq", {"bits": 4, "group_size": 128}, 0.5 + 2.5 / 128, id="awq-g128"),
        pytest.param("gptq", {"bits": 8, "group_size": 128}, 1 + 3 / 128, id="gptq-8bit"),
        pytest.param("mxfp4", {}, 0.5 + 1 / 32, id="mxfp4"),
        pytest.param(
            "compressed-tensors",
            {
                "config_groups": {
                    "g": {"targets": ["Linear"], "weights": {"num_bits": 4, "strategy": "group", "group_size": 128}}
                }
            },
            0.5 + 2 / 128,
            id="ct-w4a16",
        ),
        pytest.param("bitsandbytes", {"load_in_8bit": True}, 1.0, id="bnb-8bit"),
    ],
)
def test_quantization_bytes(method: str, qcfg: dict[str, object], bytes_per_weight: float) -> None:
    quant = quant_from_name(method, qcfg)
    assert quant is not None
    assert quant.bytes_per_weight == pytest.approx(bytes_per_weight)


def test_unknown_quantization_names_the_flag() -> None:
    with pytest.raises(PlanError, match=r"--quantization: unknown quantization method 'foo'; fix: use one of"):
        quant_from_name("foo")


def test_missing_config_key_names_the_field(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 9}))
    with pytest.raises(PlanError, match=r"config.json:num_hidden_layers: missing from config.json; fix: add"):
        load_model(str(tmp_path))


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"--model: .* is not a model folder \(no config.json\)"):
        load_model(str(tmp_path))


def test_unknown_model_name() -> None:
    with pytest.raises(PlanError, match=r"--model: 'no-such-model' is neither a folder"):
        load_model("no-such-model")


def test_safetensors_headers_are_summed_per_part(tiny_model: Path) -> None:
    parts = read_safetensors_bytes(tiny_model, 4)
    assert parts == {
        "embed": 1024 * 128 * 2,
        "head": 1024 * 128 * 2 + 128 * 2,
        "layer": 4 * 294_912 + 4 * 512,
        "vision": 0,
    }
    spec = load_model(str(tiny_model))
    assert spec.file_bytes == parts and "safetensors" in spec.source


def test_mtp_layers_are_not_counted(tmp_path: Path) -> None:
    write_safetensors(
        tmp_path / "a.safetensors",
        {
            "model.layers.0.mlp.weight": ("BF16", [4, 4]),
            "model.layers.61.mlp.weight": ("BF16", [4, 4]),
        },
    )
    assert read_safetensors_bytes(tmp_path, 61) == {"embed": 0, "head": 0, "layer": 32, "vision": 0}


def test_text_config_of_multimodal_models() -> None:
    cfg = {
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_hidden_layers": 6,
            "vocab_size": 100,
            "sliding_window": 16,
        },
    }
    spec = spec_from_config(cfg, "m")
    assert spec.layer_types.count("full") == 1


@pytest.mark.parametrize(("name", "memory"), [("H100-SXM", 79.19), ("NVIDIA A800-SXM4-80GB", 79.15), ("l20", 44.39)])
def test_gpu_lookup(name: str, memory: float) -> None:
    gpu = lookup_gpu(name)
    assert gpu is not None and gpu.memory_gib == memory


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param("[1, 2]", r"config.json: is not a JSON object", id="not-an-object"),
        pytest.param(
            '{"hidden_size": "big", "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 9}',
            r"config.json:hidden_size: 'big' is a string, not an integer",
            id="wrong-type",
        ),
        pytest.param("{", r"--model: .* is not valid JSON", id="broken-json"),
    ],
)
def test_broken_config_is_one_line(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(PlanError, match=message):
        load_model(str(tmp_path))


def test_safetensors_without_offsets(tmp_path: Path) -> None:
    raw = json.dumps({"w": {"dtype": "BF16", "shape": [2]}}).encode()
    (tmp_path / "a.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    with pytest.raises(PlanError, match=r"tensor 'w' has no valid data_offsets"):
        read_safetensors_bytes(tmp_path, 1)
