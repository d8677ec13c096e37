"""The vision tower of a multimodal model as vLLM 0.32 loads and profiles it.

``GPUModelRunner.profile_run`` runs the encoder before the language model's dummy forward:
``MultiModalBudget`` (vllm/multimodal/encoder_budget.py) picks the modality with the most
tokens per item (``get_mm_max_tokens_per_item`` of the model's ProcessingInfo), builds
``mm_max_items_per_batch`` dummy items of the largest size
(``get_image_size_with_most_features`` / the dummy video), runs ``embed_multimodal`` over
them at once and keeps the outputs in ``encoder_cache`` while ``_dummy_run`` and the dummy
sampler run; the profiled peak is therefore the larger of the encoder forward and the
encoder outputs plus the language model's forward. ``--skip-mm-profiling`` skips the
encoder part, and a limit of 0 for every modality of a tower (``--limit-mm-per-prompt``)
skips building the tower at all (``SupportsMultiModal._mark_tower_model``).

Families modelled: Qwen2.5-VL (window-attention ViT), Qwen3-VL / Qwen3-VL-MoE (deepstack
ViT), Gemma 3 (SigLIP), LLaVA-1.5 (CLIP or SigLIP tower, fixed size), Mistral 3 (Pixtral).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_fleet.errors import PlanError
from vllm_fleet.model.vision import QWEN_FAMILIES, VisionSpec

# vLLM's per-video frame caps (``_MAX_FRAMES_PER_VIDEO`` of qwen2_vl.py; Qwen3-VL's dummy video
# has 2 frames, DUMMY_VIDEO_NUM_FRAMES capped by get_num_frames_with_most_features).
QWEN2_MAX_FRAMES_PER_VIDEO = 14
# MultiModalConfig.get_limit_per_prompt: an unnamed modality allows 999 items.
DEFAULT_MM_LIMIT = 999

# --------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------


def vision_weight_elements(v: VisionSpec) -> tuple[float, float]:
    """(elements TP shards, elements every rank keeps whole) of the tower and its projector:
    vLLM's ViTs use QKV/Column/RowParallelLinear (column weights and biases are split, row
    biases replicated); norms, patch/position embeddings and plain nn.Linear/Parameter
    projectors (Gemma 3, Pixtral's patch merger) are replicated."""
    d, inter, p, c = v.hidden, v.intermediate, v.patch_size, v.in_channels
    t = v.text_hidden
    if v.family in QWEN_FAMILIES:
        qwen3 = v.family == "qwen3_vl"
        norm = 2 * d if qwen3 else d  # LayerNorm (weight + bias) in Qwen3, RMSNorm in Qwen2.5
        mlp_col = d * inter + inter if qwen3 else 2 * d * inter + 2 * inter  # fc1 | gate_up (with biases)
        per_block_shard = (3 * d * d + 3 * d) + d * d + mlp_col + inter * d
        per_block_repl = 2 * norm + d + d  # two norms, proj bias, down/fc2 bias
        out = v.out_hidden or t
        m2 = v.spatial_merge**2
        merger_shard = (m2 * d) ** 2 + m2 * d + m2 * d * out
        merger_repl = out
        shard = v.depth * per_block_shard + merger_shard
        repl = v.depth * per_block_repl + c * v.temporal_patch * p * p * d + norm + merger_repl
        if qwen3:
            repl += d + v.num_position_embeddings * d  # patch-embed bias, learned positions
            shard += v.deepstack_layers * merger_shard
            repl += v.deepstack_layers * (2 * m2 * d + merger_repl)  # post-shuffle LayerNorm
        return float(shard), float(repl)
    grid = v.image_size // p
    if v.family == "pixtral":
        per_shard = 3 * d * d + d * d + 2 * d * inter + inter * d
        per_repl = 2 * d
        shard = v.depth * per_shard
        repl = v.depth * per_repl + c * p * p * d + d  # patch conv (no bias), ln_pre
        # Mistral3MultiModalProjector: RMSNorm, patch merger (nn.Linear), linear_1/linear_2.
        m2 = v.spatial_merge**2
        repl += d + m2 * d * d
        shard += d * t + t * t + (t if v.projector_bias else 0)
        repl += t if v.projector_bias else 0
        return float(shard), float(repl)
    per_shard = (3 * d * d + 3 * d) + d * d + (d * inter + inter) + inter * d
    per_repl = 4 * d + d + d  # two LayerNorms, out_proj and fc2 biases
    shard = v.depth * per_shard
    positions = grid * grid + (1 if v.class_token else 0)
    repl = v.depth * per_repl + c * p * p * d + positions * d
    repl += d  # CLIP's class embedding | SigLIP's patch-conv bias
    if v.class_token:
        repl += 2 * d  # CLIP pre_layrnorm
    if v.post_layernorm:
        repl += 2 * d
    if v.family == "siglip":
        repl += d + d * t  # Gemma3MultiModalProjector: soft-embedding norm and projection
    else:
        shard += d * t + t * t + (t if v.projector_bias else 0)  # LlavaMultiModalProjector
        repl += t if v.projector_bias else 0
    return float(shard), float(repl)


# --------------------------------------------------------------------------
# Dummy inputs and the encoder budget
# --------------------------------------------------------------------------


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' Qwen2-VL ``smart_resize`` (qwen2_vl/image_processing_qwen2_vl.py), which
    vLLM's Qwen2VLProcessingInfo._get_vision_info calls."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def video_smart_resize(
    num_frames: int, height: int, width: int, temporal: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """transformers' Qwen3-VL video ``smart_resize`` (qwen3_vl/video_processing_qwen3_vl.py)."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal) * temporal
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen_image_size_with_most_features(v: VisionSpec, max_pixels: int) -> tuple[int, int]:
    """(width, height): Qwen2VLProcessingInfo.get_image_size_with_most_features, the factor
    pair of the most merged patches with an aspect ratio of at most 200."""
    unit = v.patch_size * v.spatial_merge
    max_seq_len = max_pixels // (unit * unit)
    hf, wf = 1, max_seq_len
    for seq_len in range(max_seq_len, 0, -1):
        hf, wf = 1, seq_len
        for d in range(math.isqrt(seq_len), 0, -1):
            if seq_len % d == 0:
                hf, wf = d, seq_len // d
                break
        if wf / hf <= 200:
            break
    return unit * wf, unit * hf


def _qwen_tokens(v: VisionSpec, width: int, height: int, frames: int, video: bool) -> int:
    """Qwen2VLProcessingInfo._get_vision_info (Qwen3VLProcessingInfo's for a Qwen3 video)."""
    factor = v.patch_size * v.spatial_merge
    if video and v.family == "qwen3_vl":
        h, w = video_smart_resize(
            frames, height, width, v.temporal_patch, factor, v.video_min_pixels, v.video_max_pixels
        )
    else:
        h, w = smart_resize(height, width, factor, v.image_min_pixels, v.image_max_pixels)
    padded = frames + (-frames % v.temporal_patch)
    grid_t = max(padded // v.temporal_patch, 1)
    return grid_t * (h // v.patch_size) * (w // v.patch_size) // (v.spatial_merge**2)


def qwen_max_tokens(v: VisionSpec, seq_len: int) -> dict[str, tuple[int, int]]:
    """{modality: (max tokens per item, patches of that item)}: get_mm_max_tokens_per_item of
    Qwen2VLProcessingInfo (video: as many frames of the largest image as ``seq_len`` holds, at
    most 14) and Qwen3VLProcessingInfo (video: 2 frames at the video processor's size)."""
    m2 = v.spatial_merge**2
    w, h = qwen_image_size_with_most_features(v, v.image_max_pixels)
    image = _qwen_tokens(v, w, h, 1, False)
    if v.family == "qwen3_vl":
        vw, vh = qwen_image_size_with_most_features(v, v.video_max_pixels // v.temporal_patch)
        video = _qwen_tokens(v, vw, vh, 2, True)
    else:
        frames = 1  # _get_max_video_frames(seq_len): grow while the tokens fit in seq_len
        while _qwen_tokens(v, w, h, frames + 1, True) <= seq_len:
            frames += 1
            if frames > 1 << 16:
                break
        frames = max(min(frames, QWEN2_MAX_FRAMES_PER_VIDEO), 1)
        video = _qwen_tokens(v, w, h, frames, True)
    return {"image": (image, image * m2), "video": (video, video * m2)}


def pixtral_tokens(image_size: int, patch: int) -> int:
    """PixtralHFEncoderInfo.get_num_image_tokens of the largest (square) image: its patch grid
    (``_get_pixtral_hf_num_image_tokens``), patch = vision patch x spatial merge."""
    n = (image_size - 1) // patch + 1
    return n * n


def max_tokens_per_item(v: VisionSpec, seq_len: int) -> dict[str, tuple[int, int]]:
    """{modality: (max tokens per item, ViT patches of that item)}."""
    if v.family in QWEN_FAMILIES:
        return qwen_max_tokens(v, seq_len)
    grid = v.image_size // v.patch_size
    if v.family == "siglip":
        return {"image": (v.tokens_per_image, grid * grid)}
    if v.family == "pixtral":
        return {"image": (pixtral_tokens(v.image_size, v.patch_size * v.spatial_merge), grid * grid)}
    patches = grid * grid + (1 if v.class_token else 0)
    tokens = grid * grid + (1 if v.class_token and v.feature_select_full else 0)
    return {"image": (tokens, patches)}


@dataclass(frozen=True)
class EncoderProfile:
    """What vLLM's profile_run puts through the encoder on one rank."""

    modality: str
    items: int
    tokens_per_item: int
    patches_per_item: int
    budget: int
    peak_bytes: float  # the encoder forward's transient peak
    cache_bytes: float  # encoder outputs alive during the LM dummy forward

    @property
    def patches(self) -> int:
        return self.items * self.patches_per_item


def tower_loaded(v: VisionSpec, limits: Mapping[str, int] | None) -> bool:
    """False when every modality of the tower has limit 0 (``_mark_tower_model``)."""
    return not limits or any(limits.get(m, DEFAULT_MM_LIMIT) > 0 for m in v.modalities)


def encoder_profile(
    v: VisionSpec,
    *,
    limits: Mapping[str, int] | None,
    max_model_len: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    tp: int,
    data_mode: bool,
    db: float,
) -> EncoderProfile | None:
    """The dummy encoder batch of ``MultiModalBudget`` and its memory (None: nothing profiled).

    Items: ``_get_max_items`` with the encoder budget of ``compute_mm_encoder_budget``
    (max(max_num_batched_tokens, largest item)); the peak is an approximation of the eager
    ViT block (see ``_block_elements``)."""
    allowed = limits or {}
    per = {m: t for m, t in max_tokens_per_item(v, max_model_len).items() if allowed.get(m, DEFAULT_MM_LIMIT) > 0}
    if not per:
        return None
    modality, (tokens, patches) = max(per.items(), key=lambda kv: (kv[1][0], kv[0]))
    if tokens <= 0:
        return None
    budget = max(max_num_batched_tokens, tokens)  # tokens: the largest item of any modality
    limit = (limits or {}).get(modality, DEFAULT_MM_LIMIT)
    per_prompt = max(1, min(limit, max_model_len // tokens))
    items = max(1, min(budget // tokens, max_num_seqs * per_prompt))
    seq = items * patches
    # mm_encoder_tp_mode "data": each rank runs its share of the items with the whole tower.
    if data_mode and v.supports_encoder_tp_data and tp > 1:
        seq = math.ceil(items / tp) * patches
        shard = 1
    else:
        shard = tp
    pixels = seq * v.in_channels * v.patch_size**2 * (v.temporal_patch if v.family in QWEN_FAMILIES else 1)
    # The processor's float32 pixel values (on the GPU for the whole forward) and their
    # model-dtype copy (Qwen's input_norm / the patch conv input).
    inputs = pixels * (4 + db)
    peak = inputs + seq * _block_elements(v, shard) * db
    out_hidden = (v.out_hidden or v.text_hidden) * (1 + v.deepstack_layers)
    cache = items * tokens * out_hidden * db
    return EncoderProfile(modality, items, tokens, patches, budget, peak, cache)


def _block_elements(v: VisionSpec, shard: int) -> float:
    """Elements per patch alive at the peak of one eager ViT block (an approximation from the
    forward code, not a measurement): the block input and residual stay referenced while
    the attention holds the normed input, the fused QKV output, Qwen's rotated q/k copies and
    the attention output (flash-attention style MMEncoderAttention: no seq x seq scores), or
    while the MLP holds its up-projection and activation (Qwen2.5-VL: gated, 2 x intermediate)."""
    d, inter = v.hidden, v.intermediate / shard
    heads = d / shard
    if v.family in QWEN_FAMILIES:
        attn = 2 * d + 3 * heads + 4 * heads + heads  # x, norm; qkv; contiguous + rotated q/k; out
    else:
        attn = 2 * d + 3 * heads + heads
    gated = v.family in ("qwen2_5_vl", "pixtral")
    mlp = 2 * d + (3 if gated else 2) * inter
    return max(attn, mlp)


# vllm/config/multimodal.py's dummy options per modality (pydantic, extra="forbid": another key
# stops vLLM at load; a size may be null); any other modality's BaseDummyOptions ignores other keys.
MM_DUMMY_KEYS = {
    "image": ("count", "width", "height"),
    "video": ("count", "num_frames", "width", "height"),
    "audio": ("count", "length"),
}


def parse_limits(value: Any, flag: str = "--limit-mm-per-prompt") -> dict[str, int] | None:
    """``--limit-mm-per-prompt`` JSON ({"image": 0} or {"video": {"count": 1, ...}}) as counts,
    checked as vLLM checks it (MultiModalDummyOptions: counts of 0 or more, the other options
    positive, no other key)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PlanError(flag, f"must be a JSON object of modality counts, got {value!r}", 'e.g. {"image": 0}')
    out: dict[str, int] = {}
    for key, item in value.items():
        if isinstance(item, dict):
            # Another modality's options are BaseDummyOptions, which ignores other keys.
            known = MM_DUMMY_KEYS.get(str(key))
            for name, option in item.items():
                if known is not None and name not in known:
                    raise PlanError(
                        flag, f"{key}: unknown option {name!r} (vLLM refuses it)", "use " + ", ".join(known)
                    )
                if name == "count" or option is None or known is None:
                    continue
                if isinstance(option, bool) or not isinstance(option, int) or option < 1:
                    raise PlanError(flag, f"{key}.{name} must be a positive integer, got {option!r}", "e.g. 8")
        count = item.get("count", DEFAULT_MM_LIMIT) if isinstance(item, dict) else item
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise PlanError(flag, f"{key}: count must be a non-negative integer, got {count!r}", 'e.g. {"image": 2}')
        out[str(key)] = count
    return out
