"""Gemma 4 read as transformers' Gemma4TextConfig and vLLM 0.32's gemma4.py build it (the
weights are checked against the model vLLM builds in tests/oracle/test_hybrid_weights_oracle.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.accounting.towers import gemma4_encoder_profile, param_tower_assumptions, param_tower_bytes
from vllm_fleet.errors import PlanError
from vllm_fleet.model.files import _classify
from vllm_fleet.model.spec import spec_from_config

H100 = Device("H100-SXM", 79.19, "cuda", 9)
BASE: dict[str, Any] = {
    "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "hidden_size": 2304,
    "intermediate_size": 9216, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "num_hidden_layers": 12, "vocab_size": 262144, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
}  # fmt: skip


def test_an_unstated_layout_takes_transformers_defaults() -> None:
    spec = spec_from_config(BASE, "g")
    assert spec.layer_types == ("sliding",) * 5 + ("full",) + ("sliding",) * 5 + ("full",)
    assert spec.sliding_window == 512
    # Full layers at global_head_dim (512) with the model's KV heads; sliding ones at head_dim.
    assert [spec.layer_head_dims[i] for i in (0, 5)] == [256, 512]
    assert spec.layer_kv_heads == (4,) * 12
    assert (spec.per_layer_input_dim, spec.per_layer_input_vocab, spec.kv_shared_start) == (256, 262144, 0)
    assert dict(spec.kind_rope_dims) == {"sliding": 256, "full": 512}  # proportional RoPE keeps the head


def test_the_last_layer_is_always_full_and_k_eq_v_takes_the_global_kv_heads() -> None:
    cfg = dict(BASE, layer_types=["sliding_attention"] * 12, attention_k_eq_v=True, num_global_key_value_heads=1,
               num_kv_shared_layers=4)  # fmt: skip
    spec = spec_from_config(cfg, "g")
    assert spec.layer_types[-1] == "full" and spec.layer_kv_heads[-1] == 1 and spec.layer_kv_heads[0] == 4
    assert spec.kv_shared_start == 8


def test_the_per_layer_embeddings_count_on_every_pipeline_stage() -> None:
    """Gemma4Model builds its embedding and its per-layer table on every rank: 262,144 rows x
    12 layers x 256 in bfloat16 is 1.5 GiB, on each of two stages."""
    with_ple = estimate(spec_from_config(BASE, "g"), H100, Settings(max_model_len=4096, pipeline_parallel_size=2))
    without = estimate(
        spec_from_config(dict(BASE, hidden_size_per_layer_input=0), "g"),
        H100,
        Settings(max_model_len=4096, pipeline_parallel_size=2),
    )
    # The table, the model's projection to it and its norm; each of the stage's 6 layers its gate,
    # projection and norm.
    model = (262144 * 12 * 256 + 2304 * 12 * 256 + 256) * 2
    layers = 6 * (2 * 2304 * 256 + 2304) * 2
    for a, b in zip(with_ple.ranks, without.ranks, strict=True):
        assert (a.weights_gib - b.weights_gib) * (1 << 30) == pytest.approx(model + layers, rel=1e-9)


def test_a_moe_block_without_its_sizes_is_refused() -> None:
    with pytest.raises(PlanError, match=r"top_k_experts: is missing for Gemma 4's MoE block \(8 experts\)"):
        spec_from_config(dict(BASE, num_experts=8, moe_intermediate_size=512), "g")


def _multimodal(**towers: Any) -> dict[str, Any]:
    text = {k: v for k, v in BASE.items() if k != "architectures"}
    return {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text, **towers}


def test_the_towers_count_as_transformers_builds_them() -> None:
    """Gemma4ForConditionalGeneration's towers (their elements equal vLLM's model in
    tests/oracle/test_hybrid_weights_oracle.py, gemma4_mm): transformers' defaults are a
    16-layer 768-wide vision tower and a 12-layer 1024-wide audio Conformer, each projected
    into the text's 2,304."""
    vision = 2 * 10240 * 768 + 3 * 16 * 16 * 768 + 16 * (4 * 768 * 768 + 2 * 64 + 3 * 768 * 3072 + 4 * 768)
    vision += 768 * 2304
    spec = spec_from_config(_multimodal(vision_config={}), "g")
    assert spec.vision_params == vision and spec.vision is None
    both = spec_from_config(_multimodal(vision_config={}, audio_config={}), "g")
    audio = both.vision_params - vision
    subsample = 128 * 9 + 128 + 32 * 128 * 9 + 32 + 32 * 32 * 1024
    # Two 4x feed-forward blocks, per-dim scale, q/k/v/post + relative keys, light conv, 3 norms.
    layer = 2 * (8 * 1024 * 1024 + 2 * 1024) + 128 + 5 * 1024 * 1024 + 3 * 1024 * 1024 + 5 * 1024 + 2 * 1024
    assert audio == subsample + 12 * (layer + 3 * 1024) + 1536 * 1024 + 1536 + 1536 * 2304
    text_only = spec_from_config(BASE, "g")
    assert text_only.vision_params == 0
    # Counted on every rank (towers replicated, Gemma4Model without a first-rank check), in the
    # model dtype; the assumption says how the encoder's pass is counted.
    tp2 = estimate(both, H100, Settings(max_model_len=8192, tensor_parallel_size=2))
    tp2_text = estimate(text_only, H100, Settings(max_model_len=8192, tensor_parallel_size=2))
    assert (tp2.weights_gib - tp2_text.weights_gib) * (1 << 30) == pytest.approx(both.vision_params * 2)
    assert any("Gemma 4's towers" in a and "_encoder_chunk" in a for a in tp2.assumptions)
    assert not any("towers" in a for a in tp2_text.assumptions)


def test_bad_audio_channels_are_refused_with_the_field() -> None:
    with pytest.raises(PlanError, match="subsampling_conv_channels"):
        spec_from_config(_multimodal(vision_config={}, audio_config={"subsampling_conv_channels": [128]}), "g")


def test_a_tower_whose_modalities_are_all_limited_to_zero_is_not_built() -> None:
    """``--limit-mm-per-prompt`` 0 for image and video skips the vision tower, 0 for audio the
    audio tower (``_mark_tower_model``); one modality left keeps its tower."""
    spec = spec_from_config(_multimodal(vision_config={}, audio_config={}), "g")
    vision, audio = (n for _, n in spec.tower_params)

    def towers(limits: dict[str, int] | None) -> float:
        with_towers = estimate(spec, H100, Settings(max_model_len=8192, limit_mm_per_prompt=limits))
        text = estimate(spec_from_config(BASE, "g"), H100, Settings(max_model_len=8192))
        return (with_towers.weights_gib - text.weights_gib) * (1 << 30) / 2

    assert towers(None) == pytest.approx(vision + audio)
    assert towers({"image": 0, "video": 0}) == pytest.approx(audio)
    assert towers({"image": 0, "audio": 0}) == pytest.approx(vision)  # video keeps the vision tower
    assert towers({"image": 0, "video": 0, "audio": 0}) == pytest.approx(0)
    # --language-model-only (MultiModalConfig.get_limit_per_prompt: every limit 0): no tower, rendered as is.
    lmo = estimate(spec, H100, Settings(max_model_len=8192, language_model_only=True))
    text = estimate(spec_from_config(BASE, "g"), H100, Settings(max_model_len=8192))
    assert lmo.weights_gib == pytest.approx(text.weights_gib)
    assert "--language-model-only" in lmo.option_args and "--limit-mm-per-prompt" not in lmo.option_args


def test_a_folders_tower_tensors_are_the_towers_not_text_layers() -> None:
    """Gemma 4's audio tower has ``layers.N`` in its names: the folder's bytes of it are the
    towers' (not the text layers', which would count it twice), and they scale the towers'
    config count (a quantized tower is smaller); the limits still drop a tower."""
    assert _classify("model.audio_tower.layers.3.self_attn.q_proj.linear.weight", 30) == "vision"
    assert _classify("model.embed_audio.embedding_projection.weight", 30) == "vision"
    assert _classify("model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight", 30) == "vision"
    spec = spec_from_config(_multimodal(vision_config={}, audio_config={}), "g")
    vision, audio = (n for _, n in spec.tower_params)
    half = replace(spec, file_bytes={"vision": vision + audio})  # the towers at 1 byte a weight
    assert param_tower_bytes(half, None, 2.0) == pytest.approx(vision + audio)
    assert param_tower_bytes(half, {"audio": 0}, 2.0) == pytest.approx(vision)
    assert param_tower_assumptions(spec, {"image": 0, "video": 0, "audio": 0}) == []


def test_the_encoder_pass_is_a_chunk_of_frames_through_the_tower() -> None:
    """gemma4_mm.py's profile: 32-frame dummy videos (the most tokens per item: 32 x 78), 224 x 224
    frames padded to 70 x 9 = 630 patches, in chunks _encoder_chunk sizes to min(free / 2,
    total / 10) over a one-hot transformers no longer builds (41 of the 3 videos' 96 frames on a
    79.19 GiB GPU). The peak is the chunk's MLP next to every frame's float32 pixels and the kept
    hidden states; the cache holds 64 pooled tokens a frame (576 real patches / 9) and the pixels."""
    spec = spec_from_config(_multimodal(vision_config={}, audio_config={}), "g")
    settings = Settings(max_model_len=8192)
    used = 12 * (1 << 30)
    profile = gemma4_encoder_profile(spec, settings, (8192, 8192, 256), H100, used, 2.0)
    assert profile is not None and (profile.modality, profile.items, profile.patches_per_item) == ("video", 3, 630)
    chunk = int(79.19 * (1 << 30) / 10 // (630 * 4 * 10240 * 8)) * 630
    assert chunk == 41 * 630
    pixels, states = 96 * 630 * 768 * 4, 96 * 630 * 768 * 2
    mlp = chunk * (2 * 768 + 3 * 3072) * 2
    assert profile.peak_bytes == pytest.approx(pixels + states + mlp)
    assert profile.peak_bytes < 0.8 * (1 << 30)
    assert profile.cache_bytes == 3 * 32 * 64 * 2304 * 2 + pixels
    # --limit-mm-per-prompt's video num_frames (8): videos of 8 x 78 tokens, 13 of them in the
    # 8,192-token budget, 104 frames; the option is rendered as given.
    eight = Settings(max_model_len=8192, limit_mm_per_prompt={"video": {"count": 1, "num_frames": 8}})
    short = gemma4_encoder_profile(spec, eight, (8192, 8192, 256), H100, used, 2.0)
    assert short is not None and (short.modality, short.items, short.tokens_per_item) == ("video", 13, 8 * 78)
    assert short.cache_bytes == 13 * 8 * 64 * 2304 * 2 + 104 * 630 * 768 * 4
    args = estimate(spec, H100, eight).option_args
    assert args[args.index("--limit-mm-per-prompt") + 1] == '{"video":{"count":1,"num_frames":8}}'
    # A small GPU chunks by half its free memory instead.
    small = Device("L4", 22.03, "cuda", 8, None, 89)
    tight = gemma4_encoder_profile(spec, settings, (8192, 8192, 256), small, 15 * (1 << 30), 2.0)
    assert tight is not None and tight.peak_bytes < profile.peak_bytes
    # Videos off: images of 280 soft tokens (2,520 patches), but the audio tower has more tokens:
    # not modelled; without audio, the images' pass.
    assert (
        gemma4_encoder_profile(spec, Settings(limit_mm_per_prompt={"video": 0}), (8192, 8192, 256), H100, used, 2)
        is None
    )
    images = gemma4_encoder_profile(
        spec, Settings(limit_mm_per_prompt={"video": 0, "audio": 0}), (8192, 8192, 256), H100, used, 2.0
    )
    assert images is not None and (images.modality, images.items, images.patches_per_item) == ("image", 29, 2520)
    # 256 of an image's 280 soft tokens are real (2,304 of 2,520 patches) and kept.
    assert images.cache_bytes == 29 * 256 * 2304 * 2 + 29 * 2520 * 768 * 4
    # The estimate's activation holds the larger of the pass and the LM's own peak with the cache.
    est = estimate(spec, H100, settings)
    text = estimate(spec_from_config(BASE, "g"), H100, settings)
    assert est.ranks[0].activation_gib > text.ranks[0].activation_gib
    assert estimate(spec, H100, Settings(max_model_len=8192, skip_mm_profiling=True)).ranks[0].activation_gib == (
        pytest.approx(text.ranks[0].activation_gib)
    )
