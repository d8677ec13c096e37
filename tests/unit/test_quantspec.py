"""ModelOpt checkpoints per layer (issue 32): excluded modules stay in the model dtype, a
MIXED_PRECISION table gives each module its algorithm and leaves unlisted ones unquantized, as
vLLM 0.32's modelopt.py builds them; the weights are checked against the bytes by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.errors import PlanError
from vllm_fleet.model.quantspec import module_part
from vllm_fleet.model.spec import load_model, spec_from_config

GIB = 1 << 30
LAYERS, H, INTER = 4, 1024, 4096
BASE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": LAYERS,
    "hidden_size": H,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": INTER,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}
ATTN = 4 * H * H  # q, k, v, o (8 heads x 128 = H)
MLP = 3 * H * INTER  # gate, up, down
BF16, FP8, NVFP4 = 2.0, 1.0, 0.5 + 1 / 16  # bytes per weight (NVFP4: one fp8 scale per 16)
H100 = Device("H100", 79.19)


def _weights(qcfg: dict[str, Any] | None) -> float:
    cfg = dict(BASE, quantization_config=qcfg) if qcfg is not None else BASE
    return estimate(spec_from_config(cfg, name="m"), H100, Settings(max_model_len=1024)).weights_gib * GIB


def _mixed(layers: dict[str, str]) -> dict[str, Any]:
    return {
        "producer": {"name": "modelopt"},
        "quantization": {
            "quant_algo": "MIXED_PRECISION",
            "quantized_layers": {name: {"quant_algo": algo} for name, algo in layers.items()},
        },
    }


def _every_layer(attn: str, mlp: str) -> dict[str, str]:
    table = {}
    for i in range(LAYERS):
        table.update({f"model.layers.{i}.self_attn.{p}": attn for p in ("q_proj", "k_proj", "v_proj", "o_proj")})
        table.update({f"model.layers.{i}.mlp.{p}": mlp for p in ("gate_proj", "up_proj", "down_proj")})
    return table


@pytest.mark.parametrize(
    ("name", "part"),
    [
        ("model.layers.3.self_attn.q_proj", (3, "attn")),
        ("model.language_model.layers.7.mlp.experts.12.down_proj", (7, "experts")),
        ("model.layers.2.mlp.shared_experts.gate_proj", (2, "shared")),
        ("backbone.layers.5.mixer.in_proj", (5, "mixer")),
        ("model.layers.0.linear_attn.in_proj_qkvz", (0, "mixer")),
        ("model.layers.1.mlp.down_proj", (1, "mlp")),
        ("backbone.layers.4.mixer.q_proj", (4, "attn")),  # Nemotron-H calls every block a mixer
        ("backbone.layers.6.mixer.up_proj", (6, "mlp")),
        ("model.layers.3.linear_attn.out_proj", (3, "mixer")),
        ("model.layers.2.self_attn.kv_a_proj_with_mqa", (2, "attn")),
        ("lm_head", (None, "head")),
        ("model.embed_tokens", (None, "other")),
    ],
)
def test_module_names_map_to_the_parts_the_planner_counts(name: str, part: tuple[int | None, str]) -> None:
    assert module_part(name) == part


def test_mixed_precision_counts_each_part_at_its_own_algorithm() -> None:
    bf16 = _weights(None)
    mixed = _weights(_mixed(_every_layer("FP8", "NVFP4")))
    assert bf16 - mixed == pytest.approx(LAYERS * (ATTN * (BF16 - FP8) + MLP * (BF16 - NVFP4)), rel=1e-9)
    # Read as all FP8 before: MLP at 1 byte, 0.44 byte per weight too many.
    fp8 = _weights({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}})
    assert fp8 - mixed == pytest.approx(LAYERS * MLP * (FP8 - NVFP4), rel=1e-9)


def test_a_module_the_table_leaves_out_stays_in_the_model_dtype() -> None:
    table = _every_layer("FP8", "NVFP4")
    for p in ("gate_proj", "up_proj", "down_proj"):
        del table[f"model.layers.0.mlp.{p}"]
    assert _weights(_mixed(table)) - _weights(_mixed(_every_layer("FP8", "NVFP4"))) == pytest.approx(
        MLP * (BF16 - NVFP4), rel=1e-9
    )


@pytest.mark.parametrize(
    ("exclude", "parts"),
    [
        (["lm_head"], 0.0),
        (["model.layers.*.self_attn*"], LAYERS * ATTN),
        (["model.layers.0*"], ATTN + MLP),
        (["model.layers.1.mlp.down_proj"], MLP),  # one projection named: the part counts unquantized
    ],
)
def test_excluded_modules_stay_in_the_model_dtype(exclude: list[str], parts: float) -> None:
    nvfp4 = {"quant_algo": "NVFP4", "group_size": 16}
    plain = _weights({"producer": {"name": "modelopt"}, "quantization": nvfp4})
    flat = _weights({"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": exclude})
    nested = _weights({"producer": {"name": "modelopt"}, "quantization": {**nvfp4, "exclude_modules": exclude}})
    assert flat - plain == pytest.approx(parts * (BF16 - NVFP4), rel=1e-9)
    assert nested == pytest.approx(flat, rel=1e-12)


def test_the_table_in_hf_quant_config_is_read_when_config_json_has_none(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(dict(BASE, quantization_config={"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}))
    )
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(_mixed(_every_layer("FP8", "NVFP4"))))
    from_file = estimate(load_model(str(tmp_path)), H100, Settings(max_model_len=1024)).weights_gib * GIB
    assert from_file == pytest.approx(_weights(_mixed(_every_layer("FP8", "NVFP4"))), rel=1e-12)


@pytest.mark.parametrize(
    ("quantization", "message"),
    [
        ({"quant_algo": "INT3"}, r"quant_algo: 'INT3' is not a ModelOpt algorithm vLLM knows"),
        ({"quant_algo": "MIXED_PRECISION", "quantized_layers": {}}, r"needs a non-empty quantized_layers"),
        (
            {"quant_algo": "MIXED_PRECISION", "quantized_layers": {"model.layers.0.mlp.up_proj": {"quant_algo": "X"}}},
            r"quantized_layers\.model\.layers\.0\.mlp\.up_proj\.quant_algo: 'X' is not a ModelOpt linear algorithm",
        ),
        ({"quant_algo": "NVFP4", "exclude_modules": "lm_head"}, r"exclude_modules: must be a list"),
    ],
)
def test_what_vllm_refuses_in_a_modelopt_config_is_refused_with_the_field(
    quantization: dict[str, Any], message: str
) -> None:
    with pytest.raises(PlanError, match=message):
        _weights({"producer": {"name": "modelopt"}, "quantization": quantization})


def _ct(groups: dict[str, tuple[list[str], dict[str, Any]]], ignore: list[str] | None = None) -> dict[str, Any]:
    return {
        "quant_method": "compressed-tensors",
        "config_groups": {name: {"targets": t, "weights": w} for name, (t, w) in groups.items()},
        "ignore": ignore or ["lm_head"],
    }


INT4_G128 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}
INT8_CHANNEL = {"num_bits": 8, "type": "int", "strategy": "channel"}
NVFP4_CT = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}
W4 = 0.5 + 2 / 128  # int4 with an fp16 scale per 128


def test_compressed_tensors_gives_each_part_its_groups_scheme() -> None:
    bf16 = _weights(None)
    one = _weights(_ct({"g0": (["Linear"], INT4_G128)}))
    assert bf16 - one == pytest.approx(LAYERS * (ATTN + MLP) * (BF16 - W4), rel=1e-9)
    # A named target wins over the class name, whatever the group order.
    two = _weights(_ct({"g0": (["Linear"], INT4_G128), "g1": (["re:.*self_attn.*"], INT8_CHANNEL)}))
    assert two - one == pytest.approx(LAYERS * ATTN * (FP8 - W4), rel=1e-9)
    ignored = _weights(_ct({"g0": (["Linear"], INT4_G128)}, ["lm_head", "re:.*self_attn.*"]))
    assert ignored - one == pytest.approx(LAYERS * ATTN * (BF16 - W4), rel=1e-9)
    # An Attention-class group is dropped, as vLLM drops it (KV-cache quantization).
    assert _weights(_ct({"g0": (["Linear"], INT4_G128), "a": (["LlamaAttention"], INT8_CHANNEL)})) == one


def test_compressed_tensors_nvfp4_counts_its_fp8_scale_per_16() -> None:
    assert _weights(None) - _weights(_ct({"g0": (["Linear"], NVFP4_CT)})) == pytest.approx(
        LAYERS * (ATTN + MLP) * (BF16 - NVFP4), rel=1e-9
    )
