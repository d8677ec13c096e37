"""The vision tower of a multimodal model as its files describe it: config.json's
``vision_config`` and the processor files (preprocessor_config.json,
video_preprocessor_config.json), read into a :class:`VisionSpec`. What the tower costs in
memory (its weights, vLLM's encoder profile pass) is vllm_fleet/accounting/multimodal.py's.

Families read: Qwen2.5-VL (window-attention ViT), Qwen3-VL / Qwen3-VL-MoE (deepstack ViT) and
Qwen3.5 / 3.6 (the same ViT, no deepstack), Gemma 3 (SigLIP), LLaVA-1.5 (CLIP or SigLIP tower,
fixed size), Mistral 3 (Pixtral).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_fleet.errors import PlanError

# Hugging Face processor class defaults (used when the folder has no preprocessor_config.json,
# which is what vLLM's processor then falls back to): Qwen2VLImageProcessor.size and
# Qwen3VLVideoProcessor.size.
QWEN2_IMAGE_SIZE = {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}
QWEN3_VIDEO_SIZE = {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768}
MAX_PIXELS_LIMIT = 1 << 36

QWEN_FAMILIES = ("qwen2_5_vl", "qwen3_vl")


@dataclass(frozen=True)
class VisionSpec:
    """What the planner needs of a vision tower (``vision_config`` and the processor files)."""

    family: str  # qwen2_5_vl, qwen3_vl, siglip (Gemma 3), llava (CLIP / SigLIP), pixtral (Mistral 3)
    depth: int  # transformer blocks vLLM builds (LLaVA: up to the feature layer)
    hidden: int
    heads: int
    intermediate: int
    patch_size: int
    text_hidden: int  # the language model's hidden size (projector output)
    in_channels: int = 3
    image_size: int = 0  # fixed-size towers (SigLIP, CLIP, Pixtral's longest edge)
    spatial_merge: int = 1
    temporal_patch: int = 1
    out_hidden: int = 0  # Qwen: merger output (= text hidden)
    num_position_embeddings: int = 0  # Qwen3-VL
    deepstack_layers: int = 0  # Qwen3-VL deepstack mergers
    tokens_per_image: int = 0  # Gemma 3 mm_tokens_per_image
    class_token: bool = False  # CLIP
    feature_select_full: bool = False  # LLaVA vision_feature_select_strategy "full" keeps CLS
    post_layernorm: bool = True
    projector_bias: bool = True
    image_max_pixels: int = 0  # Qwen: the image processor's size["longest_edge"]
    image_min_pixels: int = 0
    video_max_pixels: int = 0  # Qwen3-VL: the video processor's size["longest_edge"]
    video_min_pixels: int = 0
    modalities: tuple[str, ...] = ("image",)
    pixels_source: str = ""  # where the pixel limits came from

    @property
    def head_dim(self) -> int:
        return self.hidden // max(self.heads, 1)

    @property
    def supports_encoder_tp_data(self) -> bool:
        """Whether vLLM honours ``--mm-encoder-tp-mode data`` for this model
        (``supports_encoder_tp_data`` of the model class; otherwise it falls back to weights)."""
        return self.family in QWEN_FAMILIES


def _int(cfg: Mapping[str, Any], where: str, key: str, default: int = 0, maximum: int = 1 << 24) -> int:
    value = cfg.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > maximum:
        raise PlanError(f"{where}:{key}", f"must be an integer in [0, {maximum}], got {value!r}", "fix the config")
    return value


def _size(proc: Mapping[str, Any] | None, default: Mapping[str, int], where: str) -> tuple[int, int, bool]:
    """(min_pixels, max_pixels, from_file) the way Qwen2VLImageProcessor.__init__ reads its
    ``size`` and the ``min_pixels`` / ``max_pixels`` aliases."""
    if not proc:
        return default["shortest_edge"], default["longest_edge"], False
    size = dict(default)
    raw = proc.get("size")
    if isinstance(raw, dict):
        size.update({k: v for k, v in raw.items() if k in ("shortest_edge", "longest_edge")})
    for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        if proc.get(key) is not None:
            size[edge] = proc[key]
    lo, hi = size["shortest_edge"], size["longest_edge"]
    for name, value in (("min_pixels", lo), ("max_pixels", hi)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_PIXELS_LIMIT:
            raise PlanError(f"{where}:{name}", f"must be a positive pixel count, got {value!r}", "fix the file")
    return lo, hi, True


def vision_spec_from_config(
    top: Mapping[str, Any],
    text_hidden: int,
    source: str,
    image_processor: Mapping[str, Any] | None = None,
    video_processor: Mapping[str, Any] | None = None,
) -> VisionSpec | None:
    """The vision tower of config.json ``top`` (None when it has none the planner models).
    ``image_processor`` / ``video_processor``: preprocessor_config.json and
    video_preprocessor_config.json of the folder (Qwen's pixel limits)."""
    vc = top.get("vision_config")
    if not isinstance(vc, dict):
        return None
    mt = str(top.get("model_type", ""))
    where = f"{source}:vision_config"
    # Qwen3.5 / 3.6 (qwen3_5, qwen3_5_moe) build Qwen3-VL's tower, Qwen3_VisionTransformer, and take
    # Qwen3VLProcessingInfo's sizes (vLLM's qwen3_5.py); their vision_config has no deepstack indexes.
    archs = [a for a in top.get("architectures") or [] if isinstance(a, str)]
    if mt in ("qwen3_5", "qwen3_5_moe") and archs and all(a.endswith("ForCausalLM") for a in archs):
        return None  # Qwen3_5(Moe)ForCausalLM: the language model alone, no tower built
    if mt in ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"):
        family = "qwen2_5_vl" if mt == "qwen2_5_vl" else "qwen3_vl"
        patch = _int(vc, where, "patch_size", 14 if family == "qwen2_5_vl" else 16)
        img_default = dict(QWEN2_IMAGE_SIZE)
        lo, hi, from_file = _size(image_processor, img_default, "preprocessor_config.json")
        vlo, vhi = 0, 0
        if family == "qwen3_vl":
            vlo, vhi, vfile = _size(video_processor, QWEN3_VIDEO_SIZE, "video_preprocessor_config.json")
            from_file = from_file or vfile
        return VisionSpec(
            family=family,
            depth=_int(vc, where, "depth", 32 if family == "qwen2_5_vl" else 27),
            hidden=_int(vc, where, "hidden_size", 1280 if family == "qwen2_5_vl" else 1152),
            heads=_int(vc, where, "num_heads", 16),
            intermediate=_int(vc, where, "intermediate_size", 3420 if family == "qwen2_5_vl" else 4304),
            patch_size=patch,
            text_hidden=text_hidden,
            in_channels=_int(vc, where, "in_chans", _int(vc, where, "in_channels", 3)),
            spatial_merge=_int(vc, where, "spatial_merge_size", 2),
            temporal_patch=_int(vc, where, "temporal_patch_size", 2),
            out_hidden=_int(vc, where, "out_hidden_size", text_hidden),
            num_position_embeddings=_int(vc, where, "num_position_embeddings", 2304) if family == "qwen3_vl" else 0,
            deepstack_layers=len(vc.get("deepstack_visual_indexes") or []) if family == "qwen3_vl" else 0,
            image_min_pixels=lo,
            image_max_pixels=hi,
            video_min_pixels=vlo,
            video_max_pixels=vhi,
            modalities=("image", "video"),
            pixels_source="preprocessor files" if from_file else "the HF processor's class defaults",
        )
    vmt = str(vc.get("model_type", ""))
    hidden = _int(vc, where, "hidden_size", 1152 if "siglip" in vmt else 1024)
    layers = _int(vc, where, "num_hidden_layers", 27 if "siglip" in vmt else 24, maximum=4096)
    common: dict[str, Any] = {
        "hidden": hidden,
        "heads": _int(vc, where, "num_attention_heads", 16),
        "intermediate": _int(vc, where, "intermediate_size", 4304 if "siglip" in vmt else 4096),
        "patch_size": _int(vc, where, "patch_size", 14),
        "text_hidden": text_hidden,
        "in_channels": _int(vc, where, "num_channels", 3),
    }
    if mt == "gemma3":
        return VisionSpec(
            family="siglip",
            depth=layers,
            image_size=_int(vc, where, "image_size", 896),
            tokens_per_image=_int(top, source, "mm_tokens_per_image", 256),
            **common,
        )
    if mt == "mistral3":
        return VisionSpec(
            family="pixtral",
            depth=layers,
            image_size=_int(vc, where, "image_size", 1540),
            spatial_merge=_int(top, source, "spatial_merge_size", 2),
            post_layernorm=False,
            projector_bias=bool(top.get("multimodal_projector_bias", False)),  # Mistral3Config's default
            **common,
        )
    if mt == "llava":
        # vLLM builds the tower only up to vision_feature_layer (init_vision_tower_for_llava:
        # num_hidden_layers = layers + feature_layer + 1 for a negative index), without the
        # post-layernorm unless the last layer is used.
        raw = top.get("vision_feature_layer", -2)
        features = raw if isinstance(raw, list) else [raw]
        if not features or not all(isinstance(f, int) and not isinstance(f, bool) for f in features):
            raise PlanError(f"{source}:vision_feature_layer", f"must be a layer index, got {raw!r}", "e.g. -2")
        depth = max(f if f >= 0 else layers + f + 1 for f in features)
        return VisionSpec(
            family="llava",
            depth=max(0, min(depth, layers)),
            image_size=_int(vc, where, "image_size", 336 if "clip" in vmt else 384),
            class_token="clip" in vmt,
            feature_select_full=top.get("vision_feature_select_strategy", "default") == "full",
            post_layernorm=depth >= layers,
            projector_bias=bool(top.get("multimodal_projector_bias", True)),
            **common,
        )
    return None
