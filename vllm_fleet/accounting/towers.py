"""Multimodal towers (vllm_fleet/accounting/multimodal.py): their weights, their encoder cache profile
and the serve flags of their limits.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from vllm_fleet.accounting.base import (
    GIB,
)
from vllm_fleet.accounting.multimodal import (
    DEFAULT_MM_LIMIT,
    EncoderProfile,
    vision_weight_elements,
)
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.model.spec import (
    ModelSpec,
)
from vllm_fleet.model.vision import QWEN_FAMILIES, VisionSpec

# --------------------------------------------------------------------------
# Multimodal towers (multimodal.py)
# --------------------------------------------------------------------------


def _vision(spec: ModelSpec, settings: Settings) -> VisionSpec | None:
    """The tower with ``--mm-processor-kwargs '{"max_pixels": N}'`` applied (Qwen: the flat
    kwarg reaches both images_kwargs and videos_kwargs, ``_merge_and_resolve_mm_processor_kwargs``)."""
    vision = spec.vision
    if vision is None or not settings.mm_max_pixels or vision.family not in QWEN_FAMILIES:
        return vision
    px = settings.mm_max_pixels
    return replace(
        vision,
        image_max_pixels=px,
        video_max_pixels=px if vision.video_max_pixels else 0,
        pixels_source="--mm-processor-kwargs max_pixels",
    )


def _vision_weight_bytes(spec: ModelSpec, vision: VisionSpec, tp: int, db: float, data_mode: bool) -> float:
    """One rank's tower and projector: the TP-sharded linears split over ``tp`` (whole with
    ``--mm-encoder-tp-mode data``), the rest replicated; scaled to the safetensors bytes of
    the vision tensors when the folder has them."""
    shard, repl = vision_weight_elements(vision)
    total = (shard + repl) * db
    split = 1 if data_mode else tp
    found = (spec.file_bytes or {}).get("vision", 0)
    scale = found / total if found and total else 1.0
    return (shard / split + repl) * db * scale


def _mm_parts(info: dict[str, Any]) -> dict[str, float]:
    parts = {"weights.vision_gib": info["vision"] / GIB}
    profile: EncoderProfile | None = info["profile"]
    if profile is not None:
        parts["activation.encoder_profile_gib"] = profile.peak_bytes / GIB
        parts["activation.encoder_cache_gib"] = profile.cache_bytes / GIB
    return parts


def _mm_assumptions(
    vision: VisionSpec,
    settings: Settings,
    stage_info: list[dict[str, Any]],
    loaded: bool,
    tp: int,
    data_mode: bool,
) -> list[str]:
    limits = settings.mm_limits
    if not loaded:
        why = (
            "--language-model-only"
            if settings.language_model_only
            else f"--limit-mm-per-prompt is 0 for {' and '.join(vision.modalities)}"
        )
        return [f"vision tower ({vision.family}): not built, {why} (vLLM's _mark_tower_model)"]
    lines = [
        f"vision tower ({vision.family}, {vision.depth} blocks x {vision.hidden} hidden): "
        + (
            "whole on every rank (--mm-encoder-tp-mode data)"
            if data_mode
            else (f"linears split over TP={tp}, norms/embeddings replicated" if tp > 1 else "on the rank")
        )
        + ", on every PP stage"
    ]
    profile: EncoderProfile | None = stage_info[0]["profile"]
    if settings.skip_mm_profiling:
        lines.append("encoder profile: skipped (--skip-mm-profiling); the encoder's activations are not reserved")
    elif profile is not None:
        pixels = ""
        if vision.family in QWEN_FAMILIES:
            pixels = f" (max_pixels {vision.image_max_pixels:,} from {vision.pixels_source})"
        lines.append(
            f"encoder profile: {profile.items} dummy {profile.modality} item(s) of {profile.tokens_per_item:,} tokens"
            f"{pixels} -> {profile.patches:,} ViT patches in one forward, encoder budget {profile.budget:,} tokens;"
            " peak approximated from the eager ViT block (flash-style attention, no seq x seq scores)"
        )
        lines.append(
            f"encoder cache: the {profile.items} x {profile.tokens_per_item:,} output embeddings stay alive through"
            " the language model's dummy forward (profile_run's encoder_cache); shrink with --limit-mm-per-prompt"
            + (" or --mm-processor-kwargs max_pixels" if vision.family in QWEN_FAMILIES else "")
        )
    elif limits:
        lines.append("encoder profile: nothing to profile with these --limit-mm-per-prompt counts")
    return lines


def param_tower_bytes(spec: ModelSpec, limits: dict[str, int] | None, db: float) -> float:
    """The bytes of the towers counted by their parameters (``tower_params``) that vLLM builds:
    a tower whose modalities all have limit 0 is skipped (``_mark_tower_model``)."""
    built = sum(
        n
        for modalities, n in spec.tower_params
        if not limits or any(limits.get(m, DEFAULT_MM_LIMIT) > 0 for m in modalities)
    )
    # The safetensors bytes of the towers, when the folder has them (a quantized tower is smaller).
    found = (spec.file_bytes or {}).get("vision", 0)
    everything = sum(n for _, n in spec.tower_params)
    return built * db * (found / (everything * db) if found and everything else 1.0)


def param_tower_assumptions(spec: ModelSpec, limits: dict[str, int] | None) -> list[str]:
    """One line for towers counted by their parameters (``vision_params``: Gemma 4's vision and
    audio towers, whose encoder pass gemma4_encoder_profile approximates; a catalog's tower size,
    whose pass is not modelled); none when the limits leave no tower built."""
    if spec.vision is not None or not spec.vision_params:
        return []
    if spec.tower_params and not param_tower_bytes(spec, limits, 1.0):
        return []
    if spec.gemma4_vision:
        return [
            f"Gemma 4's towers (transformers' Gemma4VisionModel / Gemma4AudioModel and their embedders, on every "
            f"rank): {spec.vision_params:,} parameters in the weights; vLLM's profile runs its largest dummy items "
            f"(videos of {GEMMA4_VIDEO_FRAMES} frames unless limited or given num_frames) through the vision tower "
            "in chunks (gemma4_mm._encoder_chunk): a chunk's encoder activations, the items' pixel values and "
            "hidden states are in the activation peak, approximated from the code; the audio tower's pass, where "
            "audio has the most tokens, is not modelled; the towers count in the checkpoint's dtype or its files' "
            "bytes (vLLM quantizes them online with bitsandbytes, torchao or compressed-tensors, or when the vision "
            "tower's sizes divide by 64, gemma4_mm's tower_quant: not modelled)"
        ]
    return [
        f"the vision tower: {spec.vision_params:,} parameters in the weights; the encoder's profiling pass is not "
        "modelled (vLLM runs it on the largest dummy items before the KV cache is sized, so its pool can come out "
        "smaller)"
    ]


# gemma4_mm.py: a dummy video holds _VIDEO_MAX_FRAMES frames of at most _VIDEO_MAX_SOFT_TOKENS soft
# tokens, each with boi / eoi and about 6 timestamp tokens (get_mm_max_tokens_per_item).
GEMMA4_VIDEO_FRAMES = 32
GEMMA4_VIDEO_SOFT_TOKENS = 70
# Gemma4DummyInputsBuilder: the image processor has no size, so dummy images and frames are 224 x 224.
GEMMA4_DUMMY_SIDE = 224


def _gemma4_soft_tokens(patch: int, pool: int, soft: int, side: int = GEMMA4_DUMMY_SIDE) -> tuple[int, int]:
    """(patches, soft tokens) of a ``side`` x ``side`` dummy image at ``soft`` soft tokens at most
    (``Gemma4ProcessingInfo._compute_num_soft_tokens``): resized to the most patches that fit
    soft x pool^2, in units of patch x pool."""
    unit = patch * pool
    scale = math.sqrt(soft * pool * pool / ((side / patch) * (side / patch)))
    target = max(unit, math.floor(side * scale / unit) * unit)
    patches = (target // patch) ** 2
    return patches, min(patches // (pool * pool), soft)


def gemma4_encoder_profile(
    spec: ModelSpec,
    settings: Settings,
    batch: tuple[int, int, int],
    device: Device,
    used_bytes: float,
    db: float,
) -> EncoderProfile | None:
    """Gemma 4's encoder pass in vLLM 0.32's profile_run (gemma4_mm.py), None where it is not run or
    not modelled (the audio tower's, when audio has the most tokens per item).

    The modality with the most tokens per item wins (video: 32 frames x 78 tokens); its dummy items
    (``_get_max_items``, 224 x 224 images or frames) reach the vision tower padded to soft tokens x
    pooling^2 patches, in chunks ``_encoder_chunk`` sizes to min(free / 2, total / 10) over a
    position one-hot that transformers no longer builds (its patch embedder looks the positions
    up): a chunk costs its patch embedder's temporaries or an encoder block's MLP, whichever is
    larger, next to the float32 pixel values of every item and the hidden states of the chunks
    done (twice those while they are concatenated). The pooled states left after the padding is
    stripped stay in the encoder cache, and the pixel values stay referenced, through the LM's
    dummy run. An approximation from the code (no log separates it). ``used_bytes``: what the GPU
    holds when the pass runs; ``batch``: max_model_len, max_num_batched_tokens, max_num_seqs."""
    max_model_len, max_num_batched_tokens, max_num_seqs = batch
    if not spec.gemma4_vision or settings.skip_mm_profiling or not param_tower_bytes(spec, None, 1.0):
        return None
    patch, pool, positions, hidden, inter, soft, text_hidden = spec.gemma4_vision
    limits = settings.mm_limits or {}
    allowed = {m: limits.get(m, DEFAULT_MM_LIMIT) for m in ("image", "video", "audio")}
    audio = any("audio" in mods for mods, _ in spec.tower_params)
    # --limit-mm-per-prompt's video num_frames caps a dummy video's frames and its tokens (get_mm_max_tokens_per_item).
    video_frames = min(GEMMA4_VIDEO_FRAMES, settings.mm_video_frames or GEMMA4_VIDEO_FRAMES)
    per_item = {"image": soft, "video": video_frames * (GEMMA4_VIDEO_SOFT_TOKENS + 2 + 6)}
    modality = max((m for m in per_item if allowed[m] > 0), key=lambda m: per_item[m], default=None)
    if modality is None or (audio and allowed["audio"] > 0 and modality == "image"):
        return None  # nothing through the vision tower, or the audio tower's pass (not modelled)
    tokens = per_item[modality]
    budget = max(max_num_batched_tokens, tokens)
    per_prompt = max(1, min(allowed[modality], max_model_len // tokens))
    items = max(1, min(budget // tokens, max_num_seqs * per_prompt))
    video = modality == "video"
    frames = items * (video_frames if video else 1)
    item_soft = GEMMA4_VIDEO_SOFT_TOKENS if video else soft
    patches = item_soft * pool * pool  # padded
    kept = _gemma4_soft_tokens(patch, pool, item_soft)[1] * (video_frames if video else 1)
    total = device.total_gib * GIB
    room = min(max(total - used_bytes, 0.0) / 2, total / 10)
    chunk = min(frames, max(1, math.floor(room // (patches * 4 * positions * 8)))) * patches
    pixel_width = 3 * patch * patch
    embedder = chunk * (pixel_width * (4 + db) + 5 * hidden * db)  # 2(x - 0.5), its cast, input_proj, x/y/sum
    block = chunk * (2 * hidden + 3 * inter) * db  # residual and normed input, the MLP's gate, up and product
    pixels = frames * patches * pixel_width * 4
    states = frames * patches * hidden * db
    peak = pixels + max(states + max(embedder, block), 2 * states)
    cache = items * kept * text_hidden * db + pixels
    return EncoderProfile(modality, items, tokens, patches, budget, peak, cache)
