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
from vllm_fleet.model.quantspec import modelopt_spec, module_part, part_excluded
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
HEAD = 32000 * H  # lm_head (the embeddings are not tied)
BF16, FP8, NVFP4 = 2.0, 1.0, 0.5 + 1 / 16  # bytes per weight (NVFP4: one fp8 scale per 16)
H100 = Device("H100", 79.19)


def _weights(qcfg: dict[str, Any] | None) -> float:
    cfg = dict(BASE, quantization_config=qcfg) if qcfg is not None else BASE
    return estimate(spec_from_config(cfg, name="m"), H100, Settings(max_model_len=1024)).weights_gib * GIB


def _mixed(layers: dict[str, Any]) -> dict[str, Any]:
    """config.json's flat form, as ModelOpt exports it (the producer form refuses MIXED_PRECISION)."""
    return {
        "quant_method": "modelopt",
        "quant_algo": "MIXED_PRECISION",
        "quantized_layers": {n: a if isinstance(a, dict) else {"quant_algo": a} for n, a in layers.items()},
    }


def _mixed_file(layers: dict[str, str]) -> dict[str, Any]:
    """hf_quant_config.json's nested form."""
    return {
        "producer": {"name": "modelopt"},
        "quantization": {
            "quant_algo": "MIXED_PRECISION",
            "quantized_layers": {name: {"quant_algo": algo} for name, algo in layers.items()},
        },
    }


def _every_layer(attn: Any, mlp: Any) -> dict[str, Any]:
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
        ("backbone.layers.7.mixer.fc1_latent_proj", (7, "latent")),  # Nemotron-H's latent MoE
        ("backbone.layers.7.mixer.experts.3.up_proj", (7, "experts")),
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
    # Read as all FP8 before: MLP at 1 byte, 0.44 byte per weight too many (and the head, which
    # ModelOpt FP8 quantizes unless excluded and this table leaves out, at 1 byte, not 2).
    fp8 = _weights({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}})
    assert fp8 - mixed == pytest.approx(LAYERS * MLP * (FP8 - NVFP4) - HEAD * (BF16 - FP8), rel=1e-9)


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
        (["lm_head"], HEAD),  # ModelOpt quantizes the LM head unless it is excluded
        (["model.layers.*.self_attn*"], LAYERS * ATTN),
        (["model.layers.0*"], ATTN + MLP),
        (["model.layers.1.mlp.down_proj"], MLP),  # one projection named: the part counts unquantized
    ],
)
def test_excluded_modules_stay_in_the_model_dtype(exclude: list[str], parts: float) -> None:
    nvfp4 = {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None}
    plain = _weights({"producer": {"name": "modelopt"}, "quantization": {**nvfp4, "exclude_modules": []}})
    flat = _weights({"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": exclude})
    nested = _weights({"producer": {"name": "modelopt"}, "quantization": {**nvfp4, "exclude_modules": exclude}})
    assert flat - plain == pytest.approx(parts * (BF16 - NVFP4), rel=1e-9)
    assert nested == pytest.approx(flat, rel=1e-12)


def test_the_table_in_hf_quant_config_is_read_when_config_json_has_none(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(dict(BASE, quantization_config={"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}))
    )
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(_mixed_file(_every_layer("FP8", "NVFP4"))))
    from_file = estimate(load_model(str(tmp_path)), H100, Settings(max_model_len=1024)).weights_gib * GIB
    assert from_file == pytest.approx(_weights(_mixed(_every_layer("FP8", "NVFP4"))), rel=1e-12)


@pytest.mark.parametrize(
    ("qcfg", "message"),
    [
        ({"quant_algo": "INT3"}, r"quantization_config\.quant_algo: 'INT3' is not a ModelOpt algorithm vLLM knows"),
        ({"quant_algo": "FP8_BLOCK_SCALES"}, r"'FP8_BLOCK_SCALES' is not a ModelOpt algorithm"),  # a table's only
        ({}, r"quantization_config\.quant_algo: None is not a ModelOpt algorithm"),  # Missing 'quant_algo'
        ({"quant_algo": "MIXED_PRECISION", "quantized_layers": {}}, r"needs a non-empty quantized_layers"),
        (
            {"quant_algo": "MIXED_PRECISION", "quantized_layers": {"model.layers.0.mlp.up_proj": {"quant_algo": "X"}}},
            r"quantized_layers\.model\.layers\.0\.mlp\.up_proj\.quant_algo: 'X' is not a ModelOpt linear algorithm",
        ),
        (
            {
                "quant_algo": "MIXED_PRECISION",
                "quantized_layers": {"model.layers.0.mlp.up_proj": {"quant_algo": "Q8_0"}},
            },
            r"up_proj: unsupported Q8_0 block contract",
        ),
        (
            {
                "quant_algo": "MIXED_PRECISION",
                "quantized_layers": {
                    "model.layers.0.mlp.experts.0.up_proj": {"quant_algo": "FP8_PB_WO", "group_size": 128},
                    "model.layers.1.mlp.experts.0.up_proj": {"quant_algo": "FP8_BLOCK_SCALES", "group_size": 64},
                },
            },
            r"all block-FP8 MoE layers to use one group_size, got \[64, 128\]",
        ),
        ({"quant_algo": "NVFP4", "ignore": "lm_head"}, r"quantization_config\.ignore: must be a list"),
        ({"quant_algo": "NVFP4", "group_size": "sixteen"}, r"group_size: 'sixteen' is not a group size"),
    ],
)
def test_what_vllm_refuses_in_a_modelopt_config_is_refused_with_the_field(qcfg: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        _weights({"quant_method": "modelopt", **qcfg})


@pytest.mark.parametrize(
    ("quantization", "message"),
    [
        # _normalize_quantization_config: the producer form takes FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4.
        ({"quant_algo": "MIXED_PRECISION", "quantized_layers": {"x": {"quant_algo": "FP8"}}}, r"vLLM refuses"),
        ({"quant_algo": "W4A16_NVFP4"}, r"quantization\.quant_algo: 'W4A16_NVFP4': vLLM refuses this ModelOpt"),
        ({"quant_algo": "MXFP8"}, r"'MXFP8': vLLM refuses this ModelOpt algorithm in config\.json's producer form"),
        # ModelOpt's from_config on the nested form.
        (
            {"quant_algo": "NVFP4", "group_size": 16},
            r"NVFP4 quantization requires the fields \['kv_cache_quant_algo', ",
        ),
        ({"quant_algo": "NVFP4", "exclude_modules": "lm_head"}, r"quantization\.exclude_modules: must be a list"),
        ({"quant_algo": "FP8", "kv_cache_quant_algo": 8}, r"quantization\.kv_cache_quant_algo: must be a string"),
    ],
)
def test_config_jsons_producer_form_is_refused_where_vllm_refuses_it(
    quantization: dict[str, Any], message: str
) -> None:
    with pytest.raises(PlanError, match=message):
        _weights({"producer": {"name": "modelopt"}, "quantization": quantization})


def test_a_list_for_the_nested_quantization_is_refused() -> None:
    with pytest.raises(PlanError, match=r"quantization_config\.quantization: must be an object, got a list"):
        _weights({"quant_method": "modelopt", "quantization": ["FP8"]})


def test_nvfp4_takes_the_configs_group_size() -> None:
    def nvfp4(group: int) -> float:
        return _weights({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": group, "ignore": ["lm_head"]})

    assert nvfp4(32) - nvfp4(16) == pytest.approx(LAYERS * (ATTN + MLP) * (1 / 32 - 1 / 16), rel=1e-9)


def test_the_gguf_block_codecs_count_their_block_bytes() -> None:
    q8 = {"quant_algo": "Q8_0", "group_size": 32, "block_payload_bytes": 34, "packing": "ggml"}
    iq2 = {"quant_algo": "IQ2_XS", "group_size": 256, "block_payload_bytes": 74, "packing": "ggml"}
    got = _weights(_mixed(_every_layer(q8, iq2)))
    assert _weights(None) - got == pytest.approx(LAYERS * (ATTN * (BF16 - 34 / 32) + MLP * (BF16 - 74 / 256)), rel=1e-9)


def test_block_fp8_in_a_table_quantizes_experts_only_under_its_old_name() -> None:
    table = modelopt_spec(
        _mixed(
            {
                "model.layers.0.mlp.experts.3.down_proj": {"quant_algo": "FP8_BLOCK_SCALES", "group_size": 64},
                "model.layers.0.self_attn.q_proj": {"quant_algo": "FP8_BLOCK_SCALES", "group_size": 64},
                # Linear layers take 128 x 128 blocks whatever the group_size (which must agree).
                "model.layers.1.self_attn.q_proj": {"quant_algo": "FP8_PB_WO", "group_size": 64},
            }
        ),
        "config.json",
    )
    experts = table.for_part(0, "experts")
    assert experts is not None and experts.bytes_per_weight == pytest.approx(1 + 4 / (64 * 64))
    assert table.for_part(0, "attn") is None  # not a linear algorithm: unquantized
    attn = table.for_part(1, "attn")
    assert attn is not None and attn.bytes_per_weight == pytest.approx(1 + 4 / (128 * 128))


@pytest.mark.parametrize(
    ("pattern", "index", "part"),
    [
        ("backbone.layers.4.mixer.o_proj", 4, "attn"),  # Nemotron-H's attention block
        ("backbone.layers.6.mixer.down_proj", 6, "mlp"),  # and its MLP block
        ("model.layers.2.self_attn.kv_b_proj", 2, "attn"),  # MLA
        ("model.layers.2.self_attn.q_a_proj", 2, "attn"),
    ],
)
def test_exclusions_name_the_projections_of_every_family(pattern: str, index: int, part: str) -> None:
    assert part_excluded((pattern,), index, part)
    assert not part_excluded((pattern,), index + 1, part)


def test_minimax_style_mxfp8_reads_its_ignored_layers() -> None:
    mxfp8 = 1 + 1 / 32
    plain = _weights({"quant_method": "mxfp8"})
    ignored = _weights({"quant_method": "mxfp8", "ignored_layers": ["model.layers.0*", "lm_head"]})
    assert ignored - plain == pytest.approx((ATTN + MLP + HEAD) * (BF16 - mxfp8), rel=1e-9)


def test_mixed_precision_without_a_table_anywhere_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(dict(BASE, quantization_config={"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}))
    )
    with pytest.raises(
        PlanError, match=r"no hf_quant_config\.json \(vLLM: Cannot find the config file for modelopt_mixed"
    ):
        estimate(load_model(str(tmp_path)), H100, Settings(max_model_len=1024))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "other"}, "quantization": {}}))
    with pytest.raises(PlanError, match=r"hf_quant_config\.json: is not a ModelOpt config"):
        estimate(load_model(str(tmp_path)), H100, Settings(max_model_len=1024))
    table = _mixed_file({})
    table["quantization"]["quant_algo"] = "FP8"
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(table))
    with pytest.raises(PlanError, match=r"hf_quant_config\.json\.quantization\.quantized_layers: is missing"):
        estimate(load_model(str(tmp_path)), H100, Settings(max_model_len=1024))


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


def test_compressed_tensors_groups_as_vllm_reads_them() -> None:
    bf16, one = _weights(None), _weights(_ct({"g0": (["Linear"], INT4_G128)}))
    assert _weights({"quant_method": "compressed-tensors", "config_groups": {}}) == bf16  # no group: unquantized
    assert _weights(_ct({"g0": (["linear"], INT4_G128)})) == one  # class names in any case
    # A target named twice keeps its place and takes the later group's scheme.
    assert _weights(_ct({"g0": (["Linear"], INT8_CHANNEL), "g1": (["Linear"], INT4_G128)})) == one


@pytest.mark.parametrize(
    ("group", "message"),
    [
        ({"weights": INT4_G128}, r"config_groups\.g0\.targets: is missing"),
        ({"targets": ["Linear"], "weights": None}, r"g0\.weights: must be an object, got null"),
        (
            {"targets": ["Linear"], "weights": {**INT4_G128, "actorder": "group"}},
            r"actorder: 'group': compressed-tensors group/dynamic activation ordering is no longer supported",
        ),
        (
            {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "block",
                                                "block_structure": ["a", 128]}},
            r"weights\.block_structure: 'a' is a string, not an integer",
        ),
        (
            {"targets": ["Linear"], "weights": {**INT4_G128, "group_size": -128}},
            r"weights\.group_size: -128 is not a group size",
        ),
    ],
)  # fmt: skip
def test_compressed_tensors_groups_vllm_refuses_are_refused(group: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        _weights({"quant_method": "compressed-tensors", "config_groups": {"g0": group}})
