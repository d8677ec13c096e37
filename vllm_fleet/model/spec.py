"""What the planner needs to know about a model, read from config.json.

A model is either a local folder (``config.json`` and optionally
``*.safetensors``) or a name from the built-in catalog (``catalog.py``). Both
go through :func:`spec_from_config`, so a catalog entry behaves exactly like a
downloaded folder holding the same ``config.json``.

Safetensors headers are read without loading tensors (8-byte length + JSON
header per file); their byte counts per part of the model (embedding, each
decoder layer, head, vision tower) replace the formula's when present.

Every value is checked before it is used: types (JSON ``true`` is not 1, ``1.5``
is not an integer), ranges that keep the planner bounded, the relations a real
model has (KV heads divide the heads, top-k within the experts), and headers the
way safetensors checks them (offsets inside the file, bytes = shape x dtype). A bad
value is one PlanError naming the file and key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vllm_fleet.errors import PlanError
from vllm_fleet.model.catalog import MODELS, lookup_model
from vllm_fleet.model.families import (
    GEMMA4_TYPES,
    _hybrid_layer_types,
    _llama4_text,
    _mixer_fields,
    check_layer_types,
    gemma4_fields,
    gemma4_tower_params,
    gemma4_vision_dims,
)
from vllm_fleet.model.files import (
    _encoder_max_seq_length,
    _read_text,
    _small_json,
    _tokenizer_max_length,
    is_pooling,
    not_special,
    read_safetensors_bytes,
)
from vllm_fleet.model.length import _derived_max_len
from vllm_fleet.model.quantread import _checkpoint_quant_config, _quant_from_config
from vllm_fleet.model.quantspec import QuantSpec
from vllm_fleet.model.values import (
    MAX_CONFIG_BYTES,
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_VOCAB,
    _flag,
    _float,
    _get,
    _int,
    _key,
    _kind,
    _require,
    _show,
)
from vllm_fleet.model.vision import VisionSpec, vision_spec_from_config

DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_ds_mla": 1,
    "int8": 1,
    "uint8": 1,
}


@dataclass(frozen=True)
class ModelSpec:
    """Architecture facts of a causal LM, in the units of config.json."""

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    torch_dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    # MLA (DeepSeek V2/V3): one compressed latent per token and layer.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    first_dense_layers: int = 0
    moe_layer_step: int = 1
    # Sliding window / hybrid attention: one entry per layer: "full", "sliding" or "chunked"
    # (Llama 4) attention, a "mamba" (SSM) or "linear_attention" (Gated DeltaNet) mixer,
    # "parallel" (Falcon-H1: attention and mamba side by side), or no mixer at all ("mlp",
    # "moe": Nemotron-H's MLP-only blocks).
    sliding_window: int = 0
    layer_types: tuple[str, ...] = ()
    # Mamba mixers (vLLM's MambaMixer = 1, MambaMixer2 = 2): the config keys of
    # ``get_mamba_state_shape_from_config`` of the model's class.
    mamba_version: int = 0
    mamba_n_heads: int = 0
    mamba_head_dim: int = 0
    mamba_n_groups: int = 0
    mamba_d_state: int = 0
    mamba_d_conv: int = 0
    mamba_intermediate: int = 0
    mamba_dt_rank: int = 0
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    mamba_rms_norm: bool = True  # MambaMixer2's gated RMS norm (Falcon-H1: mamba_rms_norm)
    # config.json's mamba_ssm_cache_dtype (Nemotron-H; vLLM's default there is float32).
    mamba_ssm_cache_dtype: str = ""
    # Nemotron-H's latent MoE: the routed experts' width in place of hidden_size (0: none).
    moe_latent_size: int = 0
    # Gated DeltaNet linear attention (Qwen3-Next: linear_* keys).
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # DeepSeek V3.2 sparse attention: the lightning indexer of every layer.
    index_topk: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_skip: tuple[int, ...] = ()  # layers without an indexer (IndexCache)
    routing_bias: bool = False  # an fp32 e_score_correction_bias per expert (MiniMax-M2's use_routing_bias)
    # config.json's architectures (vLLM picks its model runner by them: accounting/runner.py).
    architectures: tuple[str, ...] = ()
    # Chunked local attention (Llama 4's RoPE layers, layer type "chunked"): each such layer
    # attends within blocks of this many tokens (vLLM's ChunkedLocalAttentionSpec); 0 = none.
    attention_chunk_size: int = 0
    rope_dim: int = 0
    # Whether the attention layers hold a rotary cos/sin cache (Nemotron-H and Jamba use no
    # position embedding, Granite 4.0-H only with position_embedding_type "rope").
    rotary: bool = True
    quant: QuantSpec | None = None
    vision_params: int = 0
    # The vision tower vLLM builds and profiles (multimodal.py); None for text-only models and
    # towers the planner does not model (their weights then come from vision_params).
    vision: VisionSpec | None = None
    # Towers counted by their parameters, with the modalities that build each (Gemma 4: vision for
    # image and video, audio): vLLM skips a tower whose modalities all have limit 0.
    tower_params: tuple[tuple[tuple[str, ...], int], ...] = ()
    # Gemma 4's vision tower as its encoder profile needs it (families.gemma4_vision_dims).
    gemma4_vision: tuple[int, ...] = ()
    # Exact bytes from safetensors headers, per part ("embed", "head",
    # "vision", "layer"); None when the model came from the catalog.
    file_bytes: dict[str, int] | None = field(default=None, compare=False)
    source: str = "catalog"
    # vLLM's derived maximum length (``_get_and_verify_max_len``, see _derived_max_len): what
    # an explicit --max-model-len is checked against; 0 when config.json names no length
    # (vLLM then takes any max_model_len).
    derived_max_model_len: float = field(default=0.0, compare=False)
    derived_max_model_len_key: str = field(default="", compare=False)
    model_max_length: float | None = field(default=None, compare=False)
    # The length vLLM serves without --max-model-len (0: max_position_embeddings).
    default_max_model_len: int = field(default=0, compare=False)
    # The checkpoint's quantization config as vLLM reads it (config.json's
    # quantization_config, else compression_config, then text_config's; ModelOpt's
    # quant_algo and compressed_tensors normalised) and its quant_method ("" when none).
    quant_method: str = field(default="", compare=False)
    quant_config: Mapping[str, Any] | None = field(default=None, compare=False)
    # config.json's own model_type (vLLM's overrides read hf_config.model_type).
    config_model_type: str = field(default="", compare=False)
    # The folder's other JSON files as (name, text), for the quantization config files a
    # --quantization method reads when config.json has none (quantize_config.json...).
    json_files: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    # The model folder the spec was read from ("" for a config.json alone or the catalog): where
    # vLLM looks for the files a quantization method reads.
    folder: str = field(default="", compare=False)
    # Speculative decoding: the MTP modules the checkpoint carries (num_nextn_predict_layers,
    # or mtp_num_hidden_layers: what SpeculativeConfig.hf_config_override makes n_predict)
    # and an EAGLE-3 draft's own vocabulary (draft_vocab_size, 0: the target's).
    # Gemma 4: each layer's head_dim and KV heads (empty: head_dim and num_kv_heads everywhere),
    # the first layer of the KV-shared tail (0: none), the per-layer embeddings' width and
    # vocabulary, the KV-shared layers' double-wide MLP, each layer kind's rotary cache width.
    layer_head_dims: tuple[int, ...] = ()
    layer_kv_heads: tuple[int, ...] = ()
    kv_shared_start: int = 0
    per_layer_input_dim: int = 0
    per_layer_input_vocab: int = 0
    double_wide_mlp: bool = False
    kind_rope_dims: tuple[tuple[str, int], ...] = ()
    mtp_layers: int = field(default=0, compare=False)
    draft_vocab_size: int = field(default=0, compare=False)

    @property
    def serve_max_model_len(self) -> int:
        """The max_model_len vLLM serves without --max-model-len."""
        return self.default_max_model_len or self.max_position_embeddings

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, index: int) -> bool:
        if not self.is_moe or index < self.first_dense_layers:
            return False
        if self.model_type == "nemotron_h":
            return self.layer_type(index) == "moe"
        return (index + 1) % max(self.moe_layer_step, 1) == 0

    def layer_type(self, index: int) -> str:
        if self.layer_types:
            return self.layer_types[index]
        return "sliding" if self.sliding_window else "full"

    @property
    def is_hybrid(self) -> bool:
        """vLLM's ``ModelConfig.is_hybrid``: mamba-type mixers next to attention."""
        return any(t in ("mamba", "linear_attention", "parallel") for t in self.layer_types)

    def has_attention(self, index: int) -> bool:
        return self.layer_type(index) in ("full", "sliding", "chunked", "parallel")

    def has_mamba(self, index: int) -> bool:
        return self.layer_type(index) in ("mamba", "linear_attention", "parallel")

    def has_mlp(self, index: int) -> bool:
        """Nemotron-H blocks hold one mixer each: only "mlp" / "moe" blocks have an MLP."""
        if self.model_type == "nemotron_h":
            return self.layer_type(index) in ("mlp", "moe")
        return True

    @property
    def kv_elems_per_token_per_layer(self) -> int:
        """Elements stored per token and layer before TP sharding."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim


def spec_from_config(
    cfg: Any,
    name: str,
    source: str = "config.json",
    tokenizer_max_length: float | None = None,
    encoder_max_seq_length: tuple[str, Any] | None = None,
    processors: tuple[Any, Any] = (None, None),
) -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed config.json; every value is checked
    (type, range, and the relations a real model has), one line naming the key.

    ``tokenizer_max_length``: tokenizer_config.json's model_max_length where vLLM caps the
    length with it (pooling models with absolute position embeddings, see load_model);
    ``encoder_max_seq_length``: (file, value) of a Sentence Transformers config's
    max_seq_length, which replaces vLLM's derived length; ``processors``: the folder's
    preprocessor_config.json and video_preprocessor_config.json (a vision tower's pixel limits)."""
    if not isinstance(cfg, dict):
        raise PlanError(source, "is not a JSON object", "point --model at a Hugging Face model folder")
    try:
        return _spec_from_config(cfg, name, source, tokenizer_max_length, encoder_max_seq_length, processors)
    except PlanError:
        raise
    except (TypeError, ValueError, ArithmeticError, AttributeError, KeyError, IndexError) as exc:
        raise PlanError(source, f"holds a value of the wrong type ({_show(str(exc))})", "fix config.json") from exc


def _spec_from_config(
    cfg: dict[str, Any],
    name: str,
    source: str,
    tokenizer_max_length: float | None,
    encoder_max_seq_length: tuple[str, Any] | None,
    processors: tuple[Any, Any] = (None, None),
) -> ModelSpec:
    top = cfg
    vision_params = _int(cfg, source, "vision_params", maximum=1 << 44)
    if "text_config" in cfg and isinstance(cfg["text_config"], dict):
        merged = dict(cfg["text_config"])
        for key in ("quantization_config", "torch_dtype", "tie_word_embeddings"):
            if key in cfg and key not in merged:
                merged[key] = cfg[key]
        cfg = merged
    model_type = str(_get(cfg, "model_type", default=top.get("model_type", "unknown")))
    archs = top.get("architectures")
    if (isinstance(archs, list) and "NemotronHPuzzleForCausalLM" in archs) or (
        model_type.startswith("nemotron_h") and bool(cfg.get("block_configs"))
    ):
        # vLLM 0.32 builds each layer from the checkpoint's own get_nemotron_h_config_for_layer
        # (its block_configs entry laid over the top-level config): widths, experts and top-k per
        # layer, which one top-level config cannot stand for.
        raise PlanError(
            f"{source}:block_configs",
            "NemotronHPuzzleForCausalLM sets each layer's experts and widths in block_configs, which the planner "
            "does not model (a plan from the top-level values would size every layer alike)",
            "serve it with kv_cache_memory_bytes measured on one GPU start, or plan a Nemotron-H checkpoint",
        )

    hidden = _require(cfg, source, "hidden_size", "n_embd", "d_model")
    heads = _require(cfg, source, "num_attention_heads", "n_head", maximum=MAX_HEADS)
    layers = _require(cfg, source, "num_hidden_layers", "n_layer", maximum=MAX_LAYERS)
    vocab = _require(cfg, source, "vocab_size", maximum=MAX_VOCAB)
    kv_key = _key(cfg, "num_key_value_heads", "num_kv_heads")
    kv_heads = _int(cfg, source, "num_key_value_heads", "num_kv_heads", default=heads, minimum=1, maximum=MAX_HEADS)
    if _flag(cfg, source, "multi_query"):
        kv_heads = 1
    head_dim = _int(cfg, source, "head_dim", maximum=1 << 16) or hidden // heads
    if head_dim < 1:
        raise PlanError(
            f"{source}:hidden_size",
            f"{hidden} is smaller than the {heads} attention heads (head_dim would be 0)",
            "fix hidden_size or num_attention_heads, or state head_dim",
        )
    kv_lora = _int(cfg, source, "kv_lora_rank", maximum=1 << 16)
    experts = _int(cfg, source, "n_routed_experts", "num_local_experts", "num_experts", maximum=MAX_EXPERTS)
    inter = _int(cfg, source, "intermediate_size", "ffn_dim", "n_inner", maximum=1 << 24)
    moe_inter = _int(cfg, source, "moe_intermediate_size", maximum=1 << 24)
    if experts and not moe_inter:
        moe_inter = inter
    if not inter:
        inter = moe_inter or 4 * hidden
    if not kv_lora and heads % kv_heads:
        raise PlanError(
            f"{source}:{kv_key}",
            f"{kv_heads} KV heads do not divide the {heads} attention heads",
            "use a num_key_value_heads that divides num_attention_heads (each KV head serves a group of heads)",
        )
    top_k = _int(cfg, source, "num_experts_per_tok", "experts_per_token", maximum=MAX_EXPERTS)
    if experts and top_k > experts:
        raise PlanError(
            f"{source}:{_key(cfg, 'num_experts_per_tok', 'experts_per_token')}",
            f"{top_k} experts per token but the model has {experts} experts",
            f"use at most {experts} (the router picks top-k of the experts)",
        )
    qk_rope = _int(cfg, source, "qk_rope_head_dim", maximum=1 << 16)
    v_head = _int(cfg, source, "v_head_dim", maximum=1 << 16)
    if kv_lora and (not qk_rope or not v_head):
        raise PlanError(
            f"{source}:{'qk_rope_head_dim' if not qk_rope else 'v_head_dim'}",
            f"missing or 0 for an MLA model (kv_lora_rank={kv_lora})",
            "state qk_rope_head_dim, qk_nope_head_dim and v_head_dim as DeepSeek's config.json does",
        )

    layer_types: tuple[str, ...] = ()
    check_layer_types(cfg, source, layers)
    raw_types = cfg.get("layer_types")
    window = _int(cfg, source, "sliding_window", maximum=MAX_POSITIONS) if cfg.get("sliding_window") is not False else 0
    hybrid_types = _hybrid_layer_types(cfg, source, model_type, layers)
    if hybrid_types:
        layer_types = hybrid_types
    elif isinstance(raw_types, list) and len(raw_types) == layers:
        layer_types = tuple("sliding" if "sliding" in str(t) else "full" for t in raw_types)
    elif window and model_type.startswith("gemma2"):
        layer_types = tuple("sliding" if i % 2 == 0 else "full" for i in range(layers))
    elif window and model_type.startswith("gemma3"):
        pattern = _int(cfg, source, "sliding_window_pattern", default=6, minimum=1, maximum=MAX_LAYERS)
        layer_types = tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(layers))
    elif window and model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        if _flag(cfg, source, "use_sliding_window"):
            max_window_layers = _int(cfg, source, "max_window_layers", default=layers, maximum=MAX_LAYERS)
            layer_types = tuple("sliding" if i >= max_window_layers else "full" for i in range(layers))
        window = 0 if not layer_types else window
    if not layer_types and not window:
        window = 0

    first_dense = _int(cfg, source, "first_k_dense_replace", maximum=MAX_LAYERS)
    step = _int(cfg, source, "decoder_sparse_step", "moe_layer_freq", maximum=MAX_LAYERS) or 1
    mlp_only = cfg.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list):
        raise PlanError(
            f"{source}:mlp_only_layers", f"must be a list of layer indices, got {_kind(mlp_only)}", "e.g. [0, 1]"
        )
    if mlp_only:
        first_dense = max(first_dense, len(mlp_only))
    shared = _int(cfg, source, "n_shared_experts", "num_shared_experts", maximum=MAX_EXPERTS)
    shared_inter = _int(
        cfg, source, "shared_expert_intermediate_size", "moe_shared_expert_intermediate_size", maximum=1 << 24
    )
    if model_type == "granitemoehybrid":
        # GraniteMoeHybrid: a shared MLP of shared_intermediate_size next to the experts
        # (the only MLP of the dense variants).
        granite_shared = _int(cfg, source, "shared_intermediate_size", maximum=1 << 24)
        if experts:
            shared, shared_inter = (1, granite_shared) if granite_shared else (shared, shared_inter)
        elif granite_shared:
            inter = granite_shared
    if model_type == "jamba":
        # Jamba's MoE blocks: layer i is MoE when i % expert_layer_period == expert_layer_offset.
        period = _int(cfg, source, "expert_layer_period", default=2, minimum=1, maximum=MAX_LAYERS)
        offset = _int(cfg, source, "expert_layer_offset", default=1, maximum=MAX_LAYERS)
        if offset == period - 1:
            step = period
    if shared_inter and not shared:
        shared = 1
    if shared and not shared_inter:
        shared_inter = moe_inter * shared
    chunk = 0
    gemma4: dict[str, Any] = {}
    tower_params: tuple[tuple[tuple[str, ...], int], ...] = ()
    gemma4_vision: tuple[int, ...] = ()
    if model_type in GEMMA4_TYPES:
        gemma4 = gemma4_fields(cfg, source, layers, head_dim, kv_heads)
        layer_types = gemma4.pop("layer_types")
        experts, top_k, moe_inter = (
            gemma4.pop(k) for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
        )
        window = _int(cfg, source, "sliding_window", default=512, minimum=1, maximum=MAX_POSITIONS)
        if not vision_params and cfg is not top:
            # Gemma4ForConditionalGeneration: transformers' towers, replicated on every rank.
            vision_tower, audio_tower = gemma4_tower_params(top, source, hidden)
            vision_params = vision_tower + audio_tower
            towers = ((("image", "video"), vision_tower), (("audio",), audio_tower))
            tower_params = tuple(t for t in towers if t[1])
            gemma4_vision = gemma4_vision_dims(top, source, hidden) if vision_tower else ()
    if model_type in ("llama4", "llama4_text"):
        inter, moe_inter, experts, top_k, step, shared, shared_inter, layer_types, chunk = _llama4_text(
            cfg, source, layers
        )
        first_dense, window = 0, 0

    rotary = _float(cfg, source, "partial_rotary_factor", 1.0, 0.0, 1.0)
    rope_dim = qk_rope or int(head_dim * rotary)
    if model_type == "minimax_m2":  # MiniMaxM2Attention: rotary_dim / head_dim of each head rotated
        rope_dim = _int(cfg, source, "rotary_dim", default=head_dim, minimum=1, maximum=head_dim)
    max_pos = _int(
        cfg, source, "max_position_embeddings", "n_positions", "max_sequence_length",
        default=2048, minimum=1, maximum=MAX_POSITIONS,
    )  # fmt: skip
    derived, derived_key, model_max, default_len = _derived_max_len(
        cfg, top, source, tokenizer_max_length, encoder_max_seq_length
    )
    raw_dtype = _get(cfg, "torch_dtype", "dtype", default="bfloat16")
    if not isinstance(raw_dtype, str):
        raise PlanError(
            f"{source}:{_key(cfg, 'torch_dtype', 'dtype')}", f"{_show(raw_dtype)} is not a dtype name", "e.g. bfloat16"
        )
    dtype = raw_dtype.replace("torch.", "")
    if dtype not in DTYPE_BYTES:
        dtype = "bfloat16"
    tie = _flag(cfg, source, "tie_word_embeddings", _flag(top, source, "tie_word_embeddings"))
    bias = _flag(cfg, source, "attention_bias") or model_type in ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl")
    raw_quant, quant_key = _checkpoint_quant_config(
        top, top["text_config"] if isinstance(top.get("text_config"), dict) else None
    )
    quant, quant_method, quant_config = _quant_from_config(raw_quant, quant_key, model_type, source)
    image_proc, video_proc = (p if isinstance(p, dict) else None for p in processors)
    vision = vision_spec_from_config(top, hidden, source, image_proc, video_proc)
    return ModelSpec(
        name=name,
        architectures=tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else (),
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=max_pos,
        torch_dtype=dtype,
        tie_word_embeddings=tie,
        attention_bias=bias,
        qk_norm=model_type.startswith("qwen3") or model_type.startswith("gemma3"),
        kv_lora_rank=kv_lora,
        q_lora_rank=_int(cfg, source, "q_lora_rank", maximum=1 << 16),
        qk_rope_head_dim=qk_rope,
        qk_nope_head_dim=_int(cfg, source, "qk_nope_head_dim", maximum=1 << 16),
        v_head_dim=v_head,
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=moe_inter,
        num_shared_experts=shared,
        shared_expert_intermediate_size=shared_inter,
        first_dense_layers=first_dense,
        moe_layer_step=step,
        sliding_window=window,
        layer_types=layer_types,
        **_mixer_fields(cfg, source, model_type, hidden, layer_types),
        attention_chunk_size=chunk,
        **gemma4,
        routing_bias=model_type == "minimax_m2" and _flag(cfg, source, "use_routing_bias"),
        rope_dim=rope_dim,
        rotary=model_type not in ("nemotron_h", "jamba")
        and (model_type != "granitemoehybrid" or cfg.get("position_embedding_type") == "rope"),
        quant=quant,
        vision_params=vision_params,
        tower_params=tower_params,
        gemma4_vision=gemma4_vision,
        vision=vision,
        source=source,
        derived_max_model_len=derived,
        derived_max_model_len_key=derived_key,
        model_max_length=model_max,
        default_max_model_len=default_len,
        quant_method=quant_method,
        quant_config=quant_config,
        config_model_type=str(top.get("model_type") or model_type),
        mtp_layers=_int(cfg, source, "num_nextn_predict_layers", maximum=1 << 10)
        or _int(cfg, source, "mtp_num_hidden_layers", maximum=1 << 10),
        draft_vocab_size=_int(cfg, source, "draft_vocab_size", maximum=1 << 24),
    )


# vLLM's runner by architecture suffix (``_SUFFIX_TO_DEFAULTS`` of config/model.py), first match.
# The JSON files a --quantization method reads when config.json has no quantization config.
_QUANT_FILE_SUFFIXES = ("quantize_config.json", "quant_config.json", "quantization_config.json")


def _quant_files(folder: Path) -> tuple[tuple[str, str], ...]:
    """``(name, text)`` of the folder's ``*.json`` files that a quantization method's
    ``get_config_filenames`` can match (vLLM: ``glob("*.json")``, then ``endswith``)."""
    try:
        names = sorted(p.name for p in folder.iterdir() if p.name.endswith(_QUANT_FILE_SUFFIXES))
    except OSError:
        return ()
    out = []
    for name in names:
        if name.startswith("."):
            continue
        path = folder / name
        try:
            text = _read_text(path, MAX_CONFIG_BYTES)
        except PlanError as err:
            text = f"\x00{err.problem}"  # named when a method reads it
        out.append((name, text))
    return tuple(out)


def _load_config(cfg_path: Path) -> Any:
    text = _read_text(cfg_path, MAX_CONFIG_BYTES)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise PlanError(
            "--model", f"{cfg_path} is not valid JSON ({_show(str(exc))})", "fix or re-download config.json"
        ) from exc


def load_model(model: str) -> ModelSpec:
    """Resolve ``model`` (a folder with config.json, or a catalog name)."""

    path = Path(model).expanduser()
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except (OSError, ValueError) as exc:
        raise PlanError(
            "--model", f"{_show(model)} is not a usable path ({exc})", "pass a model folder or a catalog name"
        ) from exc
    if is_dir:
        cfg_path = path / "config.json"
        if cfg_path.exists():
            not_special(cfg_path)  # a FIFO would block the read
        if not cfg_path.is_file():
            raise PlanError(
                "--model",
                f"{path} is not a model folder (no config.json)",
                "point --model at the folder that holds config.json (and the *.safetensors files)",
            )
        cfg = _load_config(cfg_path)
        # vLLM caps the length with the tokenizer's model_max_length only for pooling models
        # with absolute position embeddings (ModelConfig.get_and_verify_max_len).
        absolute = isinstance(cfg, dict) and cfg.get("position_embedding_type") == "absolute"
        tokenizer = _tokenizer_max_length(path) if absolute and is_pooling(cfg, path) else None
        spec = spec_from_config(
            cfg,
            name=str(path),
            source=str(cfg_path),
            tokenizer_max_length=tokenizer,
            encoder_max_seq_length=_encoder_max_seq_length(path),
            processors=(
                _small_json(path / "preprocessor_config.json"),
                _small_json(path / "video_preprocessor_config.json"),
            ),
        )
        file_bytes = read_safetensors_bytes(path, spec.num_layers)
        if file_bytes is not None:
            spec = _with_file_bytes(spec, file_bytes)

        return replace(spec, json_files=_quant_files(path), folder=str(path))
    if is_file and path.name.endswith(".json"):
        return spec_from_config(_load_config(path), name=str(path), source=str(path))
    cfg = lookup_model(model)
    if cfg is None:
        close = [n for n in MODELS if model.lower().split("/")[-1][:6] in n.lower()][:3]
        hint = f"did you mean {', '.join(close)}?" if close else "run 'vllm-fleet models' for the catalog"
        if path.is_absolute() or model.startswith("."):
            raise PlanError(
                "--model", f"{_show(model)} does not exist", "pass an existing model folder or a catalog name"
            )
        raise PlanError("--model", f"{_show(model)} is neither a folder with config.json nor a catalog model", hint)
    return spec_from_config(cfg, name=model, source=f"catalog:{model}")


def _with_file_bytes(spec: ModelSpec, file_bytes: dict[str, int]) -> ModelSpec:

    vision = file_bytes.get("vision", 0)
    dtype_bytes = DTYPE_BYTES.get(spec.torch_dtype, 2)
    return replace(
        spec,
        file_bytes=file_bytes,
        # Towers counted from the config (tower_params) keep that count; the files' bytes scale it.
        vision_params=int(vision / dtype_bytes) if vision and not spec.tower_params else spec.vision_params,
        source=spec.source + " + safetensors headers",
    )
