"""The catalog's 2026 models (vllm_fleet/model/catalog_2026.py and the gpt-oss entries).

Every name loads; the text models the planner already models (MoE, MLA, sliding window)
get an estimate and a parameter count within 3 % of their model card's; the hybrid
(linear attention, Mamba-2) and multimodal ones, whose modelling other work adds, are
checked for the config.json keys that modelling reads and for the relations between them.
"""

from __future__ import annotations

from typing import Any

import pytest

from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.model.catalog import MODELS, lookup_model
from vllm_fleet.model.catalog_2026 import ALIASES_2026, MODELS_2026
from vllm_fleet.model.spec import DTYPE_BYTES, load_model, spec_from_config

GPT_OSS = ("openai/gpt-oss-20b", "openai/gpt-oss-120b")
NEW_NAMES = sorted([*MODELS_2026, *ALIASES_2026, *GPT_OSS])

# Text-only models of families the planner models today.
TEXT = (
    *GPT_OSS,
    "deepseek-ai/DeepSeek-V3.1",
    "deepseek-ai/DeepSeek-V3.2",
    "deepseek-ai/DeepSeek-V3.2-Exp",
    "moonshotai/Kimi-K2-Instruct",
    "zai-org/GLM-4.5-Air",
    "intfloat/e5-mistral-7b-instruct",
)
HYBRID = ("Qwen/Qwen3-Next-80B-A3B-Thinking", "Qwen/Qwen3-Next-80B-A3B-Instruct", "nvidia/Nemotron-H-56B-Base-8K")
MULTIMODAL = (
    "Qwen/Qwen3-VL-8B-Instruct",
    "Qwen/Qwen3-VL-30B-A3B-Instruct",
    "Qwen/Qwen3-VL-235B-A22B-Instruct",
    "Qwen/Qwen2.5-VL-7B-Instruct",
    "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
    "google/gemma-3-4b-it",
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
)

# Total parameters as each model card publishes them (where the card's words were read).
CARD_PARAMS: dict[str, tuple[float, str]] = {
    # OpenAI's gpt-oss model card (arXiv 2508.10925), as quoted on lephongphu.site/?p=726:
    # "gpt-oss-120b: 116.8B total parameters", "gpt-oss-20b: 20.9B total parameters".
    "openai/gpt-oss-20b": (20.9e9, "gpt-oss model card, arXiv 2508.10925"),
    "openai/gpt-oss-120b": (116.8e9, "gpt-oss model card, arXiv 2508.10925"),
    # DeepSeek-V3.1's Hugging Face card, "Model Downloads" table (#Total Params 671B), as mirrored
    # on nirman.online/model/deepseek-ai/DeepSeek-V3.1; excludes the 14B MTP module vLLM skips.
    "deepseek-ai/DeepSeek-V3.1": (671e9, "DeepSeek-V3.1 card, Model Downloads table"),
    # Kimi K2's card, "Model Summary: Total Parameters 1T", as quoted on news.cgast.org/news/17259.
    "moonshotai/Kimi-K2-Instruct": (1.0e12, "Kimi-K2 card, Model Summary"),
    # GLM-4.5's card: "GLM-4.5-Air ... 106 billion total parameters" (fitmyllm.com/model/glm-4.5-air
    # quoting it; deepwiki.com/zai-org/GLM-4.5 from the repository's README: 106B-A12B).
    "zai-org/GLM-4.5-Air": (106e9, "GLM-4.5 card / zai-org/GLM-4.5 README"),
}

# config.json keys the hybrid and multimodal modelling reads, per family (vLLM's model classes:
# Qwen3NextGatedDeltaNet, NemotronHMamba2Mixer via MambaStateShapeCalculator, the vision towers).
TEXT_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")
HYBRID_KEYS: dict[str, tuple[str, ...]] = {
    "qwen3_next": (
        "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
        "linear_value_head_dim", "linear_conv_kernel_dim", "head_dim", "num_experts", "moe_intermediate_size",
        "shared_expert_intermediate_size", "partial_rotary_factor", "max_position_embeddings",
    ),
    "nemotron_h": (
        "hybrid_override_pattern", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
        "conv_kernel", "expand", "chunk_size", "attention_head_dim", "intermediate_size", "max_position_embeddings",
    ),
}  # fmt: skip
VISION_KEYS: dict[str, tuple[str, ...]] = {
    "qwen3_vl": (
        "depth", "hidden_size", "intermediate_size", "num_heads", "patch_size", "spatial_merge_size",
        "temporal_patch_size", "out_hidden_size", "deepstack_visual_indexes", "num_position_embeddings",
    ),
    "qwen2_5_vl": (
        "depth", "hidden_size", "intermediate_size", "num_heads", "patch_size", "spatial_merge_size",
        "temporal_patch_size", "out_hidden_size", "window_size", "fullatt_block_indexes",
    ),
    "llama4": (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size",
        "patch_size", "pixel_shuffle_ratio", "projector_input_dim", "projector_output_dim", "vision_output_dim",
    ),
    "gemma3": (
        "hidden_size", "image_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "patch_size",
    ),
    "mistral3": (
        "hidden_size", "image_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "patch_size",
        "head_dim",
    ),
}  # fmt: skip


def _text(cfg: dict[str, Any]) -> dict[str, Any]:
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) else cfg


def _missing(cfg: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    return [k for k in keys if cfg.get(k) is None]


def test_the_families_cover_every_new_name() -> None:
    assert sorted({*TEXT, *HYBRID, *MULTIMODAL}) == NEW_NAMES
    assert set(NEW_NAMES) - set(ALIASES_2026) <= set(MODELS)


@pytest.mark.parametrize("name", NEW_NAMES)
def test_every_new_name_loads(name: str) -> None:
    spec = load_model(name)
    cfg = lookup_model(name)
    assert cfg is not None
    text = _text(cfg)
    # load_model reads the text model's own sizes, from text_config where the file nests them.
    assert (spec.num_layers, spec.hidden_size, spec.vocab_size) == (
        text["num_hidden_layers"],
        text["hidden_size"],
        text["vocab_size"],
    )
    assert spec.source == f"catalog:{name}"


@pytest.mark.parametrize("name", TEXT)
def test_text_models_estimate(name: str) -> None:
    spec = load_model(name)
    est = estimate(spec, Device("test", 2048.0), Settings(max_model_len=8192))
    assert est.fits
    assert est.weights_gib > 0 and est.kv_cache_tokens > 0


@pytest.mark.parametrize("name", sorted(CARD_PARAMS))
def test_parameter_count_matches_the_model_card(name: str) -> None:
    published, where = CARD_PARAMS[name]
    cfg = lookup_model(name)
    assert cfg is not None
    # The checkpoint's own format (fp8 blocks, mxfp4 experts) is taken off so that the weights are
    # counted at 2 bytes each: weights_gib of a TP=1 estimate * 2**30 / 2 is then the parameter
    # count, plus the rotary cos/sin cache and MLA's absorbed copies (under 0.2 % here).
    cfg.pop("quantization_config", None)
    spec = spec_from_config(cfg, name)
    est = estimate(spec, Device("test", 4096.0), Settings(max_model_len=4096, enforce_eager=True))
    derived = est.weights_gib * 2**30 / DTYPE_BYTES[spec.torch_dtype]
    assert derived == pytest.approx(published, rel=0.03), f"{name}: {derived / 1e9:.2f}B vs {where}"


def test_checkpoint_formats_are_the_official_ones() -> None:
    # gpt-oss ships mxfp4 experts, DeepSeek and Kimi fp8 e4m3 in 128x128 blocks (their config.json).
    for name in GPT_OSS:
        assert load_model(name).quant_method == "mxfp4"
    for name in ("deepseek-ai/DeepSeek-V3.1", "deepseek-ai/DeepSeek-V3.2", "moonshotai/Kimi-K2-Instruct"):
        qcfg = (lookup_model(name) or {})["quantization_config"]
        assert (qcfg["quant_method"], qcfg["fmt"], qcfg["weight_block_size"]) == ("fp8", "e4m3", [128, 128])
        assert load_model(name).quant_method == "fp8"


def test_mla_and_indexer_fields() -> None:
    for name in ("deepseek-ai/DeepSeek-V3.1", "deepseek-ai/DeepSeek-V3.2", "moonshotai/Kimi-K2-Instruct"):
        cfg = lookup_model(name) or {}
        missing = _missing(
            cfg,
            ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
             "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", "num_nextn_predict_layers"),
        )  # fmt: skip
        assert not missing, f"{name}: {missing}"
        assert load_model(name).is_mla
    v32 = lookup_model("deepseek-ai/DeepSeek-V3.2") or {}
    assert not _missing(v32, ("index_topk", "index_head_dim", "index_n_heads"))


@pytest.mark.parametrize("name", HYBRID)
def test_hybrid_configs_are_complete(name: str) -> None:
    cfg = lookup_model(name) or {}
    keys = HYBRID_KEYS[cfg["model_type"]]
    assert not _missing(cfg, TEXT_KEYS + keys)
    layers = cfg["num_hidden_layers"]
    if cfg["model_type"] == "qwen3_next":
        # One full-attention layer every full_attention_interval layers (Qwen3NextConfig.layer_types).
        assert layers % cfg["full_attention_interval"] == 0
        assert cfg["linear_num_value_heads"] % cfg["linear_num_key_heads"] == 0
    else:
        pattern = cfg["hybrid_override_pattern"]
        assert len(pattern) == layers and set(pattern) <= {"M", "*", "-"}
        # Mamba-2's d_inner = expand * hidden_size = mamba_num_heads * mamba_head_dim.
        assert cfg["expand"] * cfg["hidden_size"] == cfg["mamba_num_heads"] * cfg["mamba_head_dim"]


@pytest.mark.parametrize("name", MULTIMODAL)
def test_multimodal_configs_are_complete(name: str) -> None:
    cfg = lookup_model(name) or {}
    text, vision = _text(cfg), cfg["vision_config"]
    family = "qwen3_vl" if cfg["model_type"].startswith("qwen3_vl") else cfg["model_type"]
    assert not _missing(text, TEXT_KEYS), name
    assert not _missing(vision, VISION_KEYS[family]), name
    if family in ("qwen3_vl", "qwen2_5_vl"):
        # The merger projects the vision tower straight into the text model's width.
        assert vision["out_hidden_size"] == text["hidden_size"]
    if family == "gemma3":
        # 896 / 14 = 64 patches a side, pooled 4x4 to the 256 tokens per image.
        assert (vision["image_size"] // vision["patch_size"] // 4) ** 2 == cfg["mm_tokens_per_image"]
    if family == "mistral3":
        assert vision["head_dim"] * vision["num_attention_heads"] == vision["hidden_size"]
    if family == "llama4":
        assert not _missing(text, ("num_local_experts", "interleave_moe_layer_step", "intermediate_size_mlp"))
