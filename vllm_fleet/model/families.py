"""Families whose layers differ from one another: hybrid layer types (attention, mamba, linear
attention mixers) and Llama 4's text config.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from vllm_fleet.errors import PlanError
from vllm_fleet.model.values import (
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_POSITIONS,
    _as_int,
    _flag,
    _float,
    _int,
    _require,
    _show,
)

# config.json's per-layer mixer names -> the planner's layer kinds.
_MIXER_NAMES = {
    "mamba": "mamba", "mamba2": "mamba", "linear_attention": "linear_attention", "attention": "full",
    "full_attention": "full", "sliding_attention": "sliding", "M": "mamba", "*": "full", "-": "mlp", "E": "moe",
}  # fmt: skip
# Qwen3-Next's Gated DeltaNet hybrid, and Qwen3.5 / 3.6 built from the same vLLM layers
# (qwen3_5.py: Qwen3_5DecoderLayer subclasses Qwen3NextDecoderLayer; GDN linear attention and
# Qwen3NextAttention with its output gate), read from text_config's model_type.
QWEN_GDN_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
_HYBRID_TYPES = (*QWEN_GDN_TYPES, "granitemoehybrid", "nemotron_h", "bamba", "jamba", "falcon_h1")


# transformers 5.19 (what vLLM 0.32 loads configs with): PreTrainedConfig.validate_layer_type runs
# when a config is built (@strict) and refuses a `layer_types` entry outside these, after the
# legacy names are remapped, or a list whose length is not num_hidden_layers.
ALLOWED_LAYER_TYPES = (
    "full_attention", "sliding_attention", "chunked_attention", "window_attention", "indexed_attention",
    "compressed_sparse_attention", "heavily_compressed_attention", "minimax_m3_sparse", "conv", "moe", "hybrid",
    "hybrid_sliding", "linear_attention",
)  # fmt: skip
LEGACY_LAYER_TYPES = {
    "mamba": "linear_attention", "attention": "full_attention", "deepseek_sparse_attention": "indexed_attention",
    "qwen_sparse_attention": "indexed_attention",
}  # fmt: skip


# Config classes that fix or allow other layer_types themselves: Step3p5 trims MTP padding,
# HY v4 maps its sparse names, Nemotron-H allows "mlp" and only warns on the length.
OWN_LAYER_TYPES = ("step3p5", "hy_v4", "nemotron_h")


def check_layer_types(cfg: Mapping[str, Any], source: str, layers: int) -> None:
    """transformers' check of config.json's ``layer_types`` (a refusal when vLLM loads the model),
    for the config classes that use its base validator."""
    raw = cfg.get("layer_types")
    if raw is None or str(cfg.get("model_type") or "") in OWN_LAYER_TYPES:
        return
    where = f"{source}:layer_types"
    if not isinstance(raw, list):
        raise PlanError(where, f"{_show(raw)} is not a list of layer types", "give one entry per layer")
    bad = [t for t in raw if LEGACY_LAYER_TYPES.get(str(t), str(t)) not in ALLOWED_LAYER_TYPES]
    if bad:
        raise PlanError(
            where,
            f"{_show(bad[0])} is not a layer type transformers knows: it refuses the config "
            '("The `layer_types` entries must be in ...")',
            f"use {', '.join(ALLOWED_LAYER_TYPES)}",
        )
    if len(raw) != layers:
        raise PlanError(
            where,
            f"`num_hidden_layers` ({layers}) must be equal to the number of `layer_types` ({len(raw)}): "
            "transformers refuses the config",
            "give one entry per layer",
        )


def _hybrid_layer_types(cfg: Mapping[str, Any], source: str, model_type: str, layers: int) -> tuple[str, ...]:
    """Each layer's mixer in the hybrid families, the way their vLLM classes build them:
    Qwen3-Next ``layer_types`` or ``full_attention_interval`` (full attention when
    ``(i + 1) % interval == 0``), Granite 4.0-H ``layer_types``, Nemotron-H
    ``hybrid_override_pattern`` (M mamba, * attention, - MLP, E MoE), Bamba
    ``attn_layer_indices``, Jamba ``attn_layer_period`` / ``attn_layer_offset``, Falcon-H1
    (attention and mamba in every layer). ``()`` for the other families."""
    if model_type not in _HYBRID_TYPES:
        return ()
    where = f"{source}:layer_types"
    raw: Any = cfg.get("layer_types")
    if model_type == "falcon_h1":
        return ("parallel",) * layers
    if model_type == "nemotron_h":
        raw = cfg.get("hybrid_override_pattern")
        where = f"{source}:hybrid_override_pattern"
        if not isinstance(raw, str):
            raise PlanError(where, f"{_show(raw)} is not a pattern string", "e.g. M-M-M*-M-")
        raw = list(raw)
    elif model_type in QWEN_GDN_TYPES and raw is None:
        interval = _int(cfg, source, "full_attention_interval", default=4, minimum=1, maximum=MAX_LAYERS)
        return tuple("full" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers))
    elif model_type == "bamba":
        indices = cfg.get("attn_layer_indices") or []
        if not isinstance(indices, list):
            raise PlanError(f"{source}:attn_layer_indices", "must be a list of layer indices", "e.g. [9, 18, 27]")
        return tuple("full" if i in indices else "mamba" for i in range(layers))
    elif model_type == "jamba":
        period = _int(cfg, source, "attn_layer_period", default=8, minimum=1, maximum=MAX_LAYERS)
        offset = _int(cfg, source, "attn_layer_offset", default=4, maximum=MAX_LAYERS)
        return tuple("full" if i % period == offset else "mamba" for i in range(layers))
    if not isinstance(raw, list) or len(raw) != layers:
        raise PlanError(where, f"must name the mixer of each of the {layers} layers", "e.g. ['mamba', 'attention']")
    kinds = tuple(_MIXER_NAMES.get(str(t), "") for t in raw)
    if "" in kinds:
        bad = next(str(t) for t in raw if str(t) not in _MIXER_NAMES)
        raise PlanError(where, f"unknown layer type {_show(bad)}", f"use one of {sorted(_MIXER_NAMES)}")
    return kinds


def _mixer_fields(
    cfg: Mapping[str, Any], source: str, model_type: str, hidden: int, layer_types: tuple[str, ...]
) -> dict[str, Any]:
    """The ModelSpec fields of the mamba / linear-attention mixers and of DeepSeek V3.2's
    indexer, under the config keys each vLLM class reads (``get_mamba_state_shape_from_config``
    of Qwen3NextForCausalLM, GraniteMoeHybridForCausalLM, NemotronHForCausalLM,
    JambaForCausalLM, FalconH1ForCausalLM; ``Indexer`` in deepseek_v2.py)."""
    out: dict[str, Any] = {}
    big = 1 << 20
    if cfg.get("index_topk") is not None:
        out["index_topk"] = _int(cfg, source, "index_topk", minimum=1, maximum=big)
        out["index_n_heads"] = _int(cfg, source, "index_n_heads", default=64, minimum=1, maximum=MAX_HEADS)
        out["index_head_dim"] = _int(cfg, source, "index_head_dim", default=128, minimum=1, maximum=1 << 16)
        out["index_skip"] = _index_skip(cfg, source, _int(cfg, source, "num_hidden_layers", maximum=MAX_LAYERS))
    if not any(t in ("mamba", "linear_attention", "parallel") for t in layer_types):
        return out
    if model_type in QWEN_GDN_TYPES:
        # Missing keys take transformers' Qwen3NextConfig (and Qwen3_5TextConfig) defaults, as vLLM loads them.
        defaults = {"linear_num_key_heads": 16, "linear_num_value_heads": 32}
        for key in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"):
            out[key] = _int(cfg, source, key, default=defaults.get(key, 128), minimum=1, maximum=1 << 16)
        out["linear_conv_kernel_dim"] = _int(cfg, source, "linear_conv_kernel_dim", default=4, minimum=1, maximum=64)
        if model_type.startswith("qwen3_5") and cfg.get("mamba_ssm_dtype"):
            # Qwen3_5ForConditionalGenerationConfig (vllm/model_executor/models/config.py): an "auto"
            # --mamba-ssm-cache-dtype takes the config's mamba_ssm_dtype (float32 in Qwen3.5's).
            out["mamba_ssm_cache_dtype"] = str(cfg["mamba_ssm_dtype"])
        return out
    if model_type == "nemotron_h":
        heads = _require(cfg, source, "mamba_num_heads", maximum=MAX_HEADS)
        head_dim = _require(cfg, source, "mamba_head_dim", maximum=1 << 16)
        out.update(
            mamba_version=2, mamba_n_heads=heads, mamba_head_dim=head_dim, mamba_intermediate=heads * head_dim,
            mamba_n_groups=_int(cfg, source, "n_groups", default=1, minimum=1, maximum=MAX_HEADS),
            mamba_d_state=_require(cfg, source, "ssm_state_size", maximum=1 << 16),
            mamba_d_conv=_int(cfg, source, "conv_kernel", default=4, minimum=1, maximum=64),
            mamba_conv_bias=_flag(cfg, source, "use_conv_bias", True),
            mamba_proj_bias=_flag(cfg, source, "use_bias", False),
            mamba_ssm_cache_dtype=str(cfg.get("mamba_ssm_cache_dtype") or "float32"),
            # Latent MoE (Nemotron 3 Super / Ultra): routed experts in moe_latent_size, between
            # fc1_latent_proj and fc2_latent_proj (NemotronHMoE).
            moe_latent_size=_int(cfg, source, "moe_latent_size", maximum=1 << 20),
        )  # fmt: skip
        return out
    expand = _float(cfg, source, "mamba_expand", 2.0, 0.0, 64.0)
    d_ssm = _int(cfg, source, "mamba_d_ssm", maximum=1 << 24)
    out.update(
        mamba_intermediate=d_ssm or int(expand * hidden),
        mamba_d_state=_int(cfg, source, "mamba_d_state", default=16, minimum=1, maximum=1 << 16),
        mamba_d_conv=_int(cfg, source, "mamba_d_conv", default=4, minimum=1, maximum=64),
        mamba_conv_bias=_flag(cfg, source, "mamba_conv_bias", True),
        mamba_proj_bias=_flag(cfg, source, "mamba_proj_bias", False),
        mamba_rms_norm=_flag(cfg, source, "mamba_rms_norm", model_type != "falcon_h1"),
    )
    if model_type == "jamba":
        rank = cfg.get("mamba_dt_rank", "auto")
        out["mamba_version"] = 1
        out["mamba_dt_rank"] = (
            math.ceil(hidden / 16) if rank == "auto" else _int(cfg, source, "mamba_dt_rank", minimum=1, maximum=big)
        )
        return out
    out.update(
        mamba_version=2,
        mamba_n_heads=_require(cfg, source, "mamba_n_heads", maximum=MAX_HEADS),
        mamba_head_dim=_require(cfg, source, "mamba_d_head", maximum=1 << 16),
        mamba_n_groups=_int(cfg, source, "mamba_n_groups", default=1, minimum=1, maximum=MAX_HEADS),
    )
    return out


def _llama4_text(
    cfg: Mapping[str, Any], source: str, layers: int
) -> tuple[int, int, int, int, int, int, int, tuple[str, ...], int]:
    """Llama 4's text model as vLLM 0.32 builds it (``vllm/model_executor/models/llama4.py``), a
    key config.json leaves out taking ``transformers.Llama4TextConfig``'s default, which is
    what vLLM's loaded config holds:

    * ``Llama4DecoderLayer``: a layer is MoE when ``interleave_moe_layer_step > 0`` and
      ``(layer_idx + 1) % interleave_moe_layer_step == 0`` (config.json's ``moe_layers`` is not
      read); the other layers are a ``LlamaMLP`` of ``intermediate_size_mlp``;
    * ``Llama4MoE``: ``num_local_experts`` experts of ``intermediate_size``, top-k
      ``num_experts_per_tok`` (1), a router, and one shared expert (``LlamaMLP`` of
      ``intermediate_size``);
    * ``Llama4Attention``: a layer with ``no_rope_layers[i] == 0`` has no RoPE and full
      attention; the others use ``ChunkedLocalAttention`` when ``attention_chunk_size`` is set
      (layer type "chunked"). ``no_rope_layers`` absent or empty: one NoPE layer every
      ``no_rope_layer_interval`` (4) layers. Its QK norm is an ``RMSNorm(has_weight=False)``:
      no parameters.

    Returns (dense intermediate, expert intermediate, experts, top-k, MoE step, shared
    experts, shared intermediate, layer types, chunk size)."""
    experts = _int(cfg, source, "num_local_experts", default=16, maximum=MAX_EXPERTS)
    top_k = _int(cfg, source, "num_experts_per_tok", default=1, maximum=MAX_EXPERTS)
    if top_k > experts:
        raise PlanError(
            f"{source}:num_experts_per_tok",
            f"{top_k} experts per token but the model has {experts} experts",
            f"use at most {experts} (the router picks top-k of the experts)",
        )
    moe_inter = _int(cfg, source, "intermediate_size", default=8192, minimum=1, maximum=1 << 24)
    dense_inter = _int(cfg, source, "intermediate_size_mlp", default=16384, minimum=1, maximum=1 << 24)
    step = _int(cfg, source, "interleave_moe_layer_step", default=1, maximum=MAX_LAYERS)
    if step == 0 or experts == 0:
        experts, top_k, step = 0, 0, 1  # no layer builds Llama4MoE
    # An absent key is transformers' default (8192); an explicit null turns chunking off.
    chunk = _int(cfg, source, "attention_chunk_size", maximum=MAX_POSITIONS) if "attention_chunk_size" in cfg else 8192
    raw = cfg.get("no_rope_layers")
    if raw:
        if not isinstance(raw, list) or len(raw) != layers:
            raise PlanError(
                f"{source}:no_rope_layers",
                f"must be a list of {layers} flags (one per layer), got {_show(raw)}",
                "write 0 for a NoPE (full attention) layer and 1 for a RoPE layer, or remove the key",
            )
        rope = [_as_int(v, f"{source}:no_rope_layers", 0, 1, "write 0 or 1 per layer") for v in raw]
    else:
        interval = _int(cfg, source, "no_rope_layer_interval", default=4, minimum=1, maximum=MAX_LAYERS)
        rope = [int((i + 1) % interval != 0) for i in range(layers)]
    types = tuple("chunked" if flag and chunk else "full" for flag in rope)
    return (
        dense_inter,
        moe_inter,
        experts,
        top_k,
        step,
        (1 if experts else 0),
        (moe_inter if experts else 0),
        types,
        chunk,
    )


# Gemma 4 (vLLM 0.32's gemma4.py, transformers 5.19's Gemma4TextConfig), read from text_config's
# model_type for the multimodal checkpoints.
GEMMA4_TYPES = ("gemma4_text", "gemma4")


def _gemma4_rope_dim(cfg: Mapping[str, Any], source: str, kind: str, head_dim: int) -> int:
    """The width of one layer kind's rotary cos/sin cache: the kind's ``rope_parameters`` entry;
    ``proportional`` RoPE keeps the whole head (its frequencies are zero past the rotated part),
    the others rotate ``partial_rotary_factor`` of it."""
    params = cfg.get("rope_parameters")
    entry = params.get(f"{kind}_attention") if isinstance(params, Mapping) else None
    if entry is None and isinstance(params, Mapping) and "rope_type" in params:
        entry = params  # the legacy single-dict form
    if entry is None:
        entry = {"rope_type": "proportional", "partial_rotary_factor": 0.25} if kind == "full" else {}
    if not isinstance(entry, Mapping):
        raise PlanError(f"{source}:rope_parameters.{kind}_attention", "must be an object", "fix config.json")
    if entry.get("rope_type") == "proportional":
        return head_dim
    return int(head_dim * _float(entry, f"{source}:rope_parameters.{kind}_attention", "partial_rotary_factor",
                                 1.0, 0.0, 1.0))  # fmt: skip


def gemma4_fields(cfg: Mapping[str, Any], source: str, layers: int, head_dim: int, kv_heads: int) -> dict[str, Any]:
    """Gemma 4's per-layer shape as ``Gemma4TextConfig.__post_init__`` and ``Gemma4DecoderLayer``
    build it: ``layer_types`` (5 sliding, 1 full by default; the last layer always full), each
    layer's head_dim and KV heads (``per_layer_config``, else full layers at
    ``global_head_dim`` (512) and, with ``attention_k_eq_v``, ``num_global_key_value_heads``),
    the KV-shared tail (``num_kv_shared_layers``: those layers read an earlier layer's cache and
    hold only q_proj), the per-layer embeddings (``hidden_size_per_layer_input``, 256 by default,
    over ``vocab_size_per_layer_input``), the double-wide MLP of the KV-shared layers and the MoE
    block (``num_experts``, ``top_k_experts``, ``moe_intermediate_size``) beside the dense MLP."""
    raw = cfg.get("layer_types")
    if isinstance(raw, list) and len(raw) == layers:
        types = ["sliding" if "sliding" in str(t) else "full" for t in raw]
    else:
        types = ["sliding" if (i + 1) % 6 else "full" for i in range(layers)]
    types[-1] = "full"
    dims, kvs = [head_dim] * layers, [kv_heads] * layers
    per_layer = cfg.get("per_layer_config")
    if per_layer is not None:
        if not isinstance(per_layer, Mapping):
            raise PlanError(f"{source}:per_layer_config", "must map layer indices to overrides", "fix config.json")
        for key, over in per_layer.items():
            where = f"{source}:per_layer_config.{key}"
            index = _as_int(int(key) if str(key).isdigit() else key, where, 0, layers - 1, "a layer index")
            if not isinstance(over, Mapping):
                raise PlanError(where, "must be an object (head_dim, num_key_value_heads)", "fix config.json")
            dims[index] = _int(over, where, "head_dim", default=head_dim, minimum=1, maximum=1 << 16)
            kvs[index] = _int(over, where, "num_key_value_heads", default=kv_heads, minimum=1, maximum=MAX_HEADS)
    else:
        global_dim = _int(cfg, source, "global_head_dim", default=512, minimum=1, maximum=1 << 16)
        global_kv = _int(cfg, source, "num_global_key_value_heads", maximum=MAX_HEADS)
        k_eq_v = _flag(cfg, source, "attention_k_eq_v")
        for i, kind in enumerate(types):
            if kind == "full":
                dims[i] = global_dim
                kvs[i] = global_kv if k_eq_v and global_kv else kv_heads
    shared = _int(cfg, source, "num_kv_shared_layers", maximum=layers - 1)
    ple = _int(cfg, source, "hidden_size_per_layer_input", default=256, maximum=1 << 16)
    experts = _int(cfg, source, "num_experts", maximum=MAX_EXPERTS)
    top_k = _int(cfg, source, "top_k_experts", maximum=MAX_EXPERTS) if experts else 0
    moe_inter = _int(cfg, source, "moe_intermediate_size", "expert_intermediate_size", maximum=1 << 24)
    if experts and not (top_k and moe_inter):
        missing = "top_k_experts" if not top_k else "moe_intermediate_size"
        raise PlanError(f"{source}:{missing}", f"is missing for Gemma 4's MoE block ({experts} experts)",
                        "state it as the checkpoint's config.json does")  # fmt: skip
    rope = {kind: _gemma4_rope_dim(cfg, source, kind, dims[types.index(kind)]) for kind in dict.fromkeys(types)}
    return {
        "layer_types": tuple(types),
        "layer_head_dims": tuple(dims),
        "layer_kv_heads": tuple(kvs),
        "kv_shared_start": layers - shared if shared else 0,
        "per_layer_input_dim": ple,
        "per_layer_input_vocab": _int(cfg, source, "vocab_size_per_layer_input", default=262144, maximum=1 << 24)
        if ple
        else 0,
        "double_wide_mlp": _flag(cfg, source, "use_double_wide_mlp") and bool(shared),
        "num_experts": experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": moe_inter if experts else 0,
        "kind_rope_dims": tuple(rope.items()),
    }


def _index_skip(cfg: Mapping[str, Any], source: str, layers: int) -> tuple[int, ...]:
    """The layers that build no DSA indexer (IndexCache, DeepseekV2MLAAttention in vLLM 0.32's
    deepseek_v2.py): ``index_topk_pattern``'s "S" layers, else those where
    max(i - index_skip_topk_offset + 1, 0) % index_topk_freq is not 0 (offset 2, freq 1: none)."""
    pattern = cfg.get("index_topk_pattern")
    if pattern is not None:
        if not isinstance(pattern, str | list):
            raise PlanError(f"{source}:index_topk_pattern", "must be a string of F and S (one per layer)", "e.g. FSSF")
        return tuple(i for i in range(min(layers, len(pattern))) if pattern[i] == "S")
    freq = _int(cfg, source, "index_topk_freq", default=1, minimum=1, maximum=MAX_LAYERS)
    offset = _int(cfg, source, "index_skip_topk_offset", default=2, maximum=MAX_LAYERS)
    return tuple(i for i in range(layers) if max(i - offset + 1, 0) % freq != 0)


def gemma4_tower_params(cfg: Mapping[str, Any], source: str, text_hidden: int) -> tuple[int, int]:
    """(vision, audio) parameters of Gemma 4's towers as vLLM 0.32's Gemma4ForConditionalGeneration
    builds them: transformers' Gemma4VisionModel / Gemma4AudioModel (``AutoModel.from_config``) and
    a Gemma4MultimodalEmbedder projection into the text hidden size for each (its pre-projection
    norm has no weight). Vision: the 2 x position_embedding_size position table, the patch
    projection (3 x patch^2 in), and per layer q/k/v/o at head_dim with q/k norms, a gated MLP and
    four norms. Audio (where ``audio_config`` is set): two 3x3 subsampling convolutions with their
    norms and a projection of (channels[0] // 4) x channels[1] inputs; per layer two 4x feed-forward
    blocks with two norms each, q/k/v/post and the relative-position key projection with a
    per-dim scale, the light convolution (linear in to 2x, depthwise of conv_kernel_size, linear
    out, two norms) and three norms; the output projection (with bias) to output_proj_dims."""
    v = gemma4_vision(cfg, source)
    vision = 0
    if v is not None:
        layer = 2 * v.hidden * v.heads * v.head_dim + 2 * v.hidden * v.kv_heads * v.head_dim + 2 * v.head_dim
        layer += 3 * v.hidden * v.intermediate + 4 * v.hidden
        vision = (
            2 * v.positions * v.hidden + 3 * v.patch * v.patch * v.hidden + v.depth * layer + v.hidden * text_hidden
        )
    audio_cfg = cfg.get("audio_config")
    audio = 0
    if isinstance(audio_cfg, Mapping):
        where = f"{source}:audio_config"
        h = _int(audio_cfg, where, "hidden_size", default=1024, minimum=1, maximum=1 << 20)
        depth = _int(audio_cfg, where, "num_hidden_layers", default=12, maximum=MAX_LAYERS)
        heads = _int(audio_cfg, where, "num_attention_heads", default=8, minimum=1, maximum=1 << 12)
        kernel = _int(audio_cfg, where, "conv_kernel_size", default=5, minimum=1, maximum=1 << 10)
        out = _int(audio_cfg, where, "output_proj_dims", default=1536, minimum=1, maximum=1 << 20)
        channels = audio_cfg.get("subsampling_conv_channels", [128, 32])
        if not (isinstance(channels, list) and len(channels) == 2 and all(type(c) is int and c > 0 for c in channels)):
            raise PlanError(f"{where}.subsampling_conv_channels", f"{channels!r} is not two channel counts",
                            "write two positive integers, e.g. [128, 32]")  # fmt: skip
        c0, c1 = channels
        subsample = c0 * 9 + c0 + c1 * c0 * 9 + c1 + (c0 // 4) * c1 * h
        ffw = 2 * (2 * 4 * h * h + 2 * h)
        attention = h // heads + 5 * h * h
        lconv = 2 * h * h + h * h + h * kernel + 2 * h
        audio = subsample + depth * (ffw + attention + lconv + 3 * h) + out * h + out + out * text_hidden
    return vision, audio


class Gemma4Vision(NamedTuple):
    """Gemma 4's vision_config as transformers' Gemma4VisionConfig reads it (its defaults where unset;
    ``default_output_length``, the image's soft tokens, 280 where the config has none)."""

    patch: int
    pool: int
    positions: int
    hidden: int
    intermediate: int
    soft_tokens: int
    depth: int
    heads: int
    kv_heads: int
    head_dim: int


def gemma4_vision(cfg: Mapping[str, Any], source: str) -> Gemma4Vision | None:
    """The vision tower of a Gemma 4 config (``vision_config``), None without one."""
    vision_cfg = cfg.get("vision_config")
    if not isinstance(vision_cfg, Mapping):
        return None
    where = f"{source}:vision_config"
    heads = _int(vision_cfg, where, "num_attention_heads", default=12, minimum=1, maximum=1 << 12)
    return Gemma4Vision(
        patch=_int(vision_cfg, where, "patch_size", default=16, minimum=1, maximum=1 << 10),
        pool=_int(vision_cfg, where, "pooling_kernel_size", default=3, minimum=1, maximum=64),
        positions=_int(vision_cfg, where, "position_embedding_size", default=10240, minimum=1, maximum=1 << 24),
        hidden=_int(vision_cfg, where, "hidden_size", default=768, minimum=1, maximum=1 << 20),
        intermediate=_int(vision_cfg, where, "intermediate_size", default=3072, minimum=1, maximum=1 << 22),
        soft_tokens=_int(vision_cfg, where, "default_output_length", default=280, minimum=1, maximum=1 << 20),
        depth=_int(vision_cfg, where, "num_hidden_layers", default=16, maximum=MAX_LAYERS),
        heads=heads,
        kv_heads=_int(vision_cfg, where, "num_key_value_heads", default=heads, minimum=1, maximum=1 << 12),
        head_dim=_int(vision_cfg, where, "head_dim", default=64, minimum=1, maximum=1 << 12),
    )


def gemma4_vision_dims(cfg: Mapping[str, Any], source: str, text_hidden: int) -> tuple[int, ...]:
    """What vLLM 0.32's Gemma 4 encoder pass depends on (gemma4_mm.py): the vision tower's patch,
    pooling, position table, hidden and intermediate sizes, the image's soft tokens and the text
    hidden size; () without a vision tower."""
    v = gemma4_vision(cfg, source)
    if v is None:
        return ()
    return (v.patch, v.pool, v.positions, v.hidden, v.intermediate, v.soft_tokens, text_hidden)
