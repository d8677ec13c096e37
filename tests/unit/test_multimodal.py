"""Multimodal towers (vllm_fleet/accounting/multimodal.py) in the estimate: configs shaped like the real
config.json files (text_config + vision_config), the options that shrink the encoder
profile, and the parts / assumptions the estimate reports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from vllm_fleet.accounting.base import GIB
from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.multimodal import encoder_profile, max_tokens_per_item, smart_resize, vision_weight_elements
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.errors import PlanError
from vllm_fleet.model.spec import ModelSpec, load_model, spec_from_config

# Qwen2.5-VL-7B-Instruct's config.json (the fields the planner reads).
QWEN25_VL_7B: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "hidden_size": 3584,
    "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "vocab_size": 152064, "max_position_embeddings": 128000, "torch_dtype": "bfloat16", "rope_theta": 1000000.0,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                      "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
}  # fmt: skip
QWEN25_PREPROCESSOR = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
                       "merge_size": 2, "image_processor_type": "Qwen2VLImageProcessor"}  # fmt: skip
# Gemma 3 27B's config.json.
GEMMA3_27B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "mm_tokens_per_image": 256,
    "torch_dtype": "bfloat16",
    "text_config": {"model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504,
                    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16, "head_dim": 128,
                    "sliding_window": 1024, "vocab_size": 262208, "max_position_embeddings": 131072},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "image_size": 896,
                      "intermediate_size": 4304, "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}  # fmt: skip
LLAVA_15_7B: dict[str, Any] = {
    "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default", "torch_dtype": "float16",
    "text_config": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                    "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32064,
                    "max_position_embeddings": 4096},
    "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "image_size": 336,
                      "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24,
                      "patch_size": 14, "projection_dim": 768},
}  # fmt: skip
H100 = Device("H100", 79.2)


def _qwen(processor: dict[str, Any] | None = QWEN25_PREPROCESSOR) -> ModelSpec:
    return spec_from_config(QWEN25_VL_7B, "Qwen2.5-VL-7B", processors=(processor, None))


def test_qwen25_vl_reads_the_tower_and_the_preprocessor() -> None:
    vision = _qwen().vision
    assert vision is not None
    assert (vision.family, vision.depth, vision.hidden, vision.out_hidden) == ("qwen2_5_vl", 32, 1280, 3584)
    assert vision.image_max_pixels == 12845056
    # Without preprocessor_config.json: the HF Qwen2VLImageProcessor's own default.
    default = _qwen(None).vision
    assert default is not None and default.image_max_pixels == 28 * 28 * 1280


def test_qwen25_vl_tower_weights_are_its_published_size() -> None:
    """Qwen2.5-VL-7B's tower at its real size: ~0.68 B parameters (the formula itself is checked
    against transformers' module in tests/oracle/test_mm_oracle.py)."""
    vision = _qwen().vision
    assert vision is not None
    shard, repl = vision_weight_elements(vision)
    assert shard + repl == pytest.approx(676.55e6, rel=2e-3)
    est1 = estimate(_qwen(), H100, Settings())
    est2 = estimate(_qwen(), H100, Settings(tensor_parallel_size=2))
    # The linears are TP-sharded: rank memory falls, but not by half (norms, patch embed replicated).
    v1, v2 = est1.parts()["weights.vision_gib"], est2.parts()["weights.vision_gib"]
    assert v1 / 2 < v2 < v1 * 0.55
    data = estimate(_qwen(), H100, Settings(tensor_parallel_size=2, mm_encoder_tp_mode="data"))
    assert data.parts()["weights.vision_gib"] == pytest.approx(v1)


def test_qwen25_video_dummy_grows_with_max_model_len_to_14_frames() -> None:
    vision = _qwen().vision
    assert vision is not None
    per_frame_pair = 16384  # 12845056 / 28**2 merged tokens per temporal patch
    assert max_tokens_per_item(vision, 4096)["video"][0] == per_frame_pair
    assert max_tokens_per_item(vision, 3 * per_frame_pair)["video"][0] == 3 * per_frame_pair
    assert max_tokens_per_item(vision, 10**6)["video"][0] == 7 * per_frame_pair  # 14 frames / 2
    assert max_tokens_per_item(vision, 10**6)["image"] == (per_frame_pair, 4 * per_frame_pair)


def test_encoder_profile_dominates_the_activation_and_shrinks_with_the_options() -> None:
    spec = _qwen()
    full = estimate(spec, H100, Settings(max_model_len=32768))
    parts = full.parts()
    assert parts["activation.encoder_profile_gib"] > 2.0
    assert full.ranks[0].activation_gib == pytest.approx(
        max(parts["activation.encoder_profile_gib"], full.ranks[0].activation_gib), rel=1e-9
    )
    assert any("1 dummy video item(s) of 32,768 tokens" in line for line in full.assumptions)
    images_only = estimate(spec, H100, Settings(max_model_len=32768, limit_mm_per_prompt={"video": 0}))
    smaller = estimate(spec, H100, Settings(max_model_len=32768, mm_max_pixels=1003520))
    skipped = estimate(spec, H100, Settings(max_model_len=32768, skip_mm_profiling=True))
    text_only = estimate(spec, H100, Settings(max_model_len=32768, limit_mm_per_prompt={"image": 0, "video": 0}))
    for est in (images_only, smaller, skipped, text_only):
        assert est.kv_cache_gib > full.kv_cache_gib
    assert "activation.encoder_profile_gib" not in skipped.parts()
    assert skipped.parts()["weights.vision_gib"] == parts["weights.vision_gib"]
    assert text_only.parts()["weights.vision_gib"] == 0
    assert text_only.weights_gib == pytest.approx(full.weights_gib - parts["weights.vision_gib"], abs=1e-3)
    assert text_only.kv_cache_gib > skipped.kv_cache_gib
    # --language-model-only is every modality's limit 0: the same plan, its own reason.
    lmo = estimate(spec, H100, Settings(max_model_len=32768, language_model_only=True))
    assert lmo.kv_cache_gib == text_only.kv_cache_gib and lmo.parts()["weights.vision_gib"] == 0
    assert any("not built, --language-model-only" in a for a in lmo.assumptions)


def test_gemma3_profiles_as_many_images_as_the_budget_holds() -> None:
    spec = spec_from_config(GEMMA3_27B, "gemma-3-27b-it")
    assert spec.vision is not None and spec.vision.family == "siglip"
    profile = encoder_profile(
        spec.vision, limits=None, max_model_len=131072, max_num_batched_tokens=8192, max_num_seqs=1024, tp=1,
        data_mode=False, db=2,
    )  # fmt: skip
    assert profile is not None
    assert (profile.items, profile.tokens_per_item, profile.patches_per_item) == (32, 256, 4096)
    assert profile.cache_bytes == 32 * 256 * 5376 * 2
    two = encoder_profile(
        spec.vision, limits={"image": 2}, max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=3, tp=1,
        data_mode=False, db=2,
    )  # fmt: skip
    assert two is not None and two.items == 6  # max_num_seqs x 2 images per prompt
    shard, repl = vision_weight_elements(spec.vision)
    # SigLIP-so400m at 896 px (~417 M) + Gemma 3's projector (1152 x 5376 and its norm)
    assert shard + repl == pytest.approx(417e6 + 1152 * 5376 + 1152, rel=0.002)
    one = estimate(spec, H100, Settings(max_model_len=32768)).parts()["weights.vision_gib"]
    two_ranks = estimate(spec, H100, Settings(tensor_parallel_size=2, max_model_len=32768))
    assert one / 2 < two_ranks.parts()["weights.vision_gib"] < one  # SigLIP's linears are TP-sharded in vLLM
    assert one * GIB == pytest.approx((shard + repl) * 2, rel=1e-4)  # parts() rounds to 4 decimals


def test_llava_builds_the_tower_up_to_the_feature_layer() -> None:
    spec = spec_from_config(LLAVA_15_7B, "llava-1.5-7b-hf")
    vision = spec.vision
    assert vision is not None and vision.depth == 23 and not vision.post_layernorm
    assert max_tokens_per_item(vision, 4096)["image"] == (576, 577)  # CLS dropped by the "default" strategy


def test_folder_preprocessor_config_sets_the_pixels(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_VL_7B))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**QWEN25_PREPROCESSOR, "max_pixels": 200704}))
    vision = load_model(str(tmp_path)).vision
    assert vision is not None and vision.image_max_pixels == 200704


def test_smart_resize_keeps_the_pixel_bounds() -> None:
    h, w = smart_resize(4000, 3000, 28, 3136, 1003520)
    assert h % 28 == 0 and w % 28 == 0 and h * w <= 1003520
    assert smart_resize(10, 10, 28, 3136, 1003520) == (56, 56)


@pytest.mark.parametrize(
    ("field", "value"),
    [("limit_mm_per_prompt", {"image": -1}), ("limit_mm_per_prompt", [1]), ("mm_max_pixels", 0),
     ("mm_encoder_tp_mode", "both")],
)  # fmt: skip
def test_bad_multimodal_options_are_refused(field: str, value: Any) -> None:
    with pytest.raises(PlanError):
        estimate(_qwen(), H100, Settings(**{field: value}))


def test_text_models_are_unchanged_by_the_options() -> None:
    cfg = {k: v for k, v in QWEN25_VL_7B.items() if k != "vision_config"} | {"model_type": "qwen2"}
    spec = spec_from_config(cfg, "qwen2")
    plain = estimate(spec, H100, Settings())
    limited = estimate(spec, H100, Settings(limit_mm_per_prompt={"image": 0}, skip_mm_profiling=True))
    assert plain.kv_cache_gib == limited.kv_cache_gib and plain.assumptions == [] and plain.parts() == {}


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"video": {"count": 1, "fps": 2}}, "video: unknown option 'fps'"),
        ({"image": {"num_frames": 4}}, "image: unknown option 'num_frames'"),
        ({"video": {"num_frames": 0}}, "video.num_frames must be a positive integer"),
        ({"audio": {"length": True}}, "audio.length must be a positive integer"),
    ],
)
def test_dummy_options_vllm_refuses_are_refused(limits: dict[str, Any], message: str) -> None:
    """vLLM's MultiModalDummyOptions forbid other keys and take positive sizes (pydantic, at load)."""
    with pytest.raises(PlanError, match=re.escape(message)):
        Settings(limit_mm_per_prompt=limits).validate()


def test_dummy_options_vllm_accepts_pass() -> None:
    """A null size is vLLM's default; another modality's options (BaseDummyOptions) ignore other keys."""
    settings = Settings(limit_mm_per_prompt={"video": {"count": 2, "num_frames": None}, "vision_chunk": {"x": 1}})
    settings.validate()
    assert settings.mm_limits == {"video": 2, "vision_chunk": 999} and settings.mm_video_frames is None


# A Qwen3.6-27B checkpoint's config.json and processor files (the fields the planner reads; its
# quantization_config left out): github.com/hualayn/ai-articles @ dfaac590e39726d2ae9575f1d05b48a02509ace7,
# config.json, preprocessor_config.json, video_preprocessor_config.json (an AWQ copy of Unsloth/Qwen3.6-27B).
QWEN36_27B: dict[str, Any] = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "tie_word_embeddings": False,
    "image_token_id": 248056, "video_token_id": 248057,
    "text_config": {
        "model_type": "qwen3_5_text", "dtype": "bfloat16", "hidden_size": 5120, "num_hidden_layers": 64,
        "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 17408,
        "vocab_size": 248320, "max_position_embeddings": 262144, "full_attention_interval": 4,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16,
        "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06, "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": 1, "tie_word_embeddings": False,
    },
    "vision_config": {
        "model_type": "qwen3_5_vision", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
        "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 5120,
        "num_position_embeddings": 2304, "in_channels": 3, "deepstack_visual_indexes": [],
    },
}  # fmt: skip
QWEN36_IMAGE = {"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16, "merge_size": 2,
                "temporal_patch_size": 2, "size": {"shortest_edge": 65536, "longest_edge": 16777216}}  # fmt: skip
QWEN36_VIDEO = {"video_processor_type": "Qwen3VLVideoProcessor", "patch_size": 16, "merge_size": 2,
                "temporal_patch_size": 2, "size": {"shortest_edge": 4096, "longest_edge": 25165824}}  # fmt: skip


def test_qwen3_5_multimodal_counts_its_tower_and_its_encoder_pass() -> None:
    """Qwen3.5 / 3.6 (Qwen3_5ForConditionalGeneration) build Qwen3-VL's tower (no deepstack) and
    profile its encoder before the KV cache is sized; --language-model-only drops both (issue 47)."""
    spec = spec_from_config(QWEN36_27B, "Qwen3.6-27B", processors=(QWEN36_IMAGE, QWEN36_VIDEO))
    assert spec.vision is not None
    assert (spec.vision.family, spec.vision.depth, spec.vision.deepstack_layers) == ("qwen3_vl", 27, 0)
    assert (spec.vision.image_max_pixels, spec.vision.video_max_pixels) == (16777216, 25165824)
    full = estimate(spec, H100, Settings(max_model_len=32768))
    lmo = estimate(spec, H100, Settings(max_model_len=32768, language_model_only=True))
    tower = full.parts()["weights.vision_gib"]
    shard, repl = vision_weight_elements(spec.vision)
    assert tower == pytest.approx((shard + repl) * 2 / GIB, abs=1e-4) and 0.7 < tower < 1.0  # ~0.46 B params, bf16
    assert lmo.parts()["weights.vision_gib"] == 0
    assert full.weights_gib - lmo.weights_gib == pytest.approx(tower, abs=1e-3)
    assert full.parts()["activation.encoder_profile_gib"] > 0
    assert "activation.encoder_profile_gib" not in lmo.parts()
    # The KV pool loses the tower's weights and whatever the encoder's peak adds over the text's.
    extra_peak = full.ranks[0].activation_gib - lmo.ranks[0].activation_gib
    assert lmo.kv_cache_gib - full.kv_cache_gib == pytest.approx(tower + extra_peak, abs=0.01)
    # The text-only class of the same family builds no tower.
    text_only = spec_from_config({**QWEN36_27B, "architectures": ["Qwen3_5ForCausalLM"]}, "Qwen3.6-27B")
    assert text_only.vision is None
