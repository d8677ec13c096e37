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
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vllm_fleet.catalog import MODELS, lookup_model
from vllm_fleet.errors import PlanError
from vllm_fleet.multimodal import VisionSpec, vision_spec_from_config

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

_SAFETENSORS_DTYPE_BYTES: dict[str, float] = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
    "F4": 0.5,
}

# Bounds that keep the planner's loops and arithmetic small: far above any real model,
# far below what a typo or a hostile file can put in config.json.
MAX_LAYERS = 4096
MAX_HIDDEN = 1 << 20
MAX_HEADS = 1 << 16
MAX_VOCAB = 1 << 27
MAX_EXPERTS = 1 << 16
MAX_POSITIONS = 1 << 30
MAX_CONFIG_BYTES = 64 << 20
MAX_HEADER_BYTES = 100 << 20


@dataclass(frozen=True)
class QuantSpec:
    """How linear weights inside the decoder layers are stored.

    ``weight_bits`` is the stored bits per weight; ``group_size`` the number of
    weights sharing one scale (0 = per channel / per tensor, negligible);
    ``scale_bytes`` the bytes of one scale (plus zero point when asymmetric).
    ``experts_only`` marks formats that quantize only MoE experts (mxfp4 in
    gpt-oss). ``lm_head`` says whether the output projection is quantized.
    """

    method: str
    weight_bits: int
    group_size: int = 0
    scale_bytes: float = 0.0
    experts_only: bool = False
    lm_head: bool = False

    @property
    def bytes_per_weight(self) -> float:
        extra = self.scale_bytes / self.group_size if self.group_size else 0.0
        return self.weight_bits / 8 + extra


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
    # Speculative decoding: the MTP modules the checkpoint carries (num_nextn_predict_layers,
    # or mtp_num_hidden_layers: what SpeculativeConfig.hf_config_override makes n_predict)
    # and an EAGLE-3 draft's own vocabulary (draft_vocab_size, 0: the target's).
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


def _get(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    return default


def _key(cfg: Mapping[str, Any], *keys: str) -> str:
    """The first of ``keys`` that config.json sets (the one an error should name)."""
    return next((k for k in keys if cfg.get(k) is not None), keys[0])


def _show(value: Any) -> str:
    """A value for a one-line message: repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value: Any) -> str:
    names = {bool: "a boolean", str: "a string", list: "a list", dict: "an object", type(None): "null"}
    return names.get(type(value), f"a {type(value).__name__}")


def _as_int(value: Any, where: str, minimum: int, maximum: int, fix: str) -> int:
    """``value`` as an integer in [minimum, maximum]: booleans, strings, fractions, NaN
    and infinities are refused (JSON's ``true`` is not 1, ``1.5`` is not 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PlanError(where, f"{_show(value)} is {_kind(value)}, not an integer", fix)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PlanError(where, f"{_show(value)} is not a finite number", fix)
        if not value.is_integer():
            raise PlanError(where, f"{_show(value)} is not an integer", fix)
    number = int(value)
    if number < minimum:
        raise PlanError(where, f"must be at least {minimum}, got {number}", fix)
    if number > maximum:
        raise PlanError(where, f"{number} is above {maximum:,}, the largest the planner accepts", fix)
    return number


def _int(
    cfg: Mapping[str, Any],
    source: str,
    *keys: str,
    default: int = 0,
    minimum: int = 0,
    maximum: int = MAX_HIDDEN,
) -> int:
    value = _get(cfg, *keys)
    if value is None:
        return default
    key = _key(cfg, *keys)
    return _as_int(
        value, f"{source}:{key}", minimum, maximum, f"write {key} as an integer from {minimum} to {maximum:,}"
    )


def _require(cfg: Mapping[str, Any], source: str, *keys: str, maximum: int = MAX_HIDDEN) -> int:
    value = _get(cfg, *keys)
    if value is None:
        raise PlanError(
            f"{source}:{keys[0]}",
            "missing from config.json",
            f"add '{keys[0]}' (the model's {keys[0].replace('_', ' ')}) or use a catalog name",
        )
    return _int(cfg, source, *keys, minimum=1, maximum=maximum)


def _flag(cfg: Mapping[str, Any], source: str, key: str, default: bool = False) -> bool:
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise PlanError(
        f"{source}:{key}", f"{_show(value)} is {_kind(value)}, not true or false", f"write {key}: true or false"
    )


def _float(cfg: Mapping[str, Any], source: str, key: str, default: float, low: float, high: float) -> float:
    """A number in (low, high]."""
    value = cfg.get(key)
    if value is None:
        return default
    fix = f"write {key} as a number above {low:g} and at most {high:g}"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PlanError(f"{source}:{key}", f"{_show(value)} is not a finite number", fix)
    if not low < value <= high:
        raise PlanError(f"{source}:{key}", f"{value} is out of range", fix)
    return float(value)


_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# RoPE types whose max_position_embeddings is already the scaled length (vLLM does not
# multiply by their factor again).
_ROPE_PRESCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def _rope_parameters(cfg: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The RoPE parameter sets (one per layer type when nested), as vLLM iterates them."""
    raw = _get(cfg, "rope_parameters", "rope_scaling")
    if not isinstance(raw, Mapping) or not raw:
        return []
    if all(str(k).endswith("attention") for k in raw) and all(isinstance(v, Mapping) for v in raw.values()):
        return [v for v in raw.values() if isinstance(v, Mapping) and v]
    return [raw]


def _derived_max_len(
    cfg: Mapping[str, Any],
    top: Mapping[str, Any],
    source: str,
    tokenizer_max: float | None,
    encoder: tuple[str, Any] | None,
) -> tuple[float, str, float | None, int]:
    """vLLM's ``_get_and_verify_max_len`` (0.32) on config.json (``hf_text_config``):

    * the smallest of the length keys (``_LENGTH_KEYS``, in vLLM's order), replaced by
      ``model_max_length`` when that is set;
    * capped by tokenizer_config.json's model_max_length (``tokenizer_max``: only given
      for pooling models with absolute position embeddings, as vLLM reads it);
    * no length key at all: an explicit ``--max-model-len`` is taken as it is, the
      default is 2048;
    * times the RoPE scaling factor (not for the pre-scaled types, not for Gemma 3);
    * replaced by a Sentence Transformers config's ``max_seq_length`` (``encoder``);
    * the default (no ``--max-model-len``) is that length, or LongRoPE's
      ``original_max_position_embeddings``.

    Returns the bound an explicit length is checked against (0: any length), the key it
    comes from, config.json's model_max_length, and vLLM's default length."""
    derived, key = math.inf, ""
    for name in _LENGTH_KEYS:
        value = cfg.get(name)
        if value is None:
            continue
        if name == "model_max_length":
            # Hugging Face writes 1e30 for "no limit"; any positive number is a length here.
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise PlanError(f"{source}:{name}", f"{_show(value)} is not a positive length", "fix config.json")
            number: float = float(value)
        else:
            number = _as_int(value, f"{source}:{name}", 1, MAX_POSITIONS, f"write {name} as a positive integer")
        if number < derived:
            derived, key = number, name
    model_max = cfg.get("model_max_length") or None
    if model_max:
        derived, key = float(model_max), "model_max_length"
    if tokenizer_max is not None and tokenizer_max < derived:
        derived, key = tokenizer_max, "tokenizer_config.json:model_max_length"
    unbounded = derived == math.inf
    length = 2048.0 if unbounded else float(derived)
    model_type = str(cfg.get("model_type") or top.get("model_type") or "")
    params = _rope_parameters(cfg)
    types = [_rope_type(rp) for rp in params]
    if params and "gemma3" not in model_type:
        factor: float = 1.0
        for rp, rope_type in zip(params, types, strict=True):
            if rope_type not in _ROPE_PRESCALED:
                raw = rp.get("factor", factor)
                if raw is None:
                    raw = 1.0
                if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw <= 0:
                    raise PlanError(
                        f"{source}:rope_scaling.factor", f"{_show(raw)} is not a positive number", "fix config.json"
                    )
                factor = float(raw)
        length *= factor
    if encoder is not None:
        name, value = encoder
        length = float(_as_int(value, f"{name}:max_seq_length", 1, MAX_POSITIONS, "write it as a positive integer"))
        key = f"{Path(name).name}:max_seq_length"
    default = int(length)
    if "longrope" in types and cfg.get("original_max_position_embeddings") is not None:
        default = _as_int(
            cfg["original_max_position_embeddings"],
            f"{source}:original_max_position_embeddings",
            1,
            MAX_POSITIONS,
            "write it as a positive integer",
        )
    return (0.0 if unbounded else length), key, float(model_max) if model_max else None, default


def _rope_type(rp: Mapping[str, Any]) -> str:
    """The RoPE type as vLLM reads it after ``patch_rope_parameters`` (legacy ``type``
    key, ``su`` -> ``longrope``, ``mrope`` -> ``default``)."""
    rope_type = str(rp.get("rope_type", rp.get("type", "default")))
    return {"su": "longrope", "mrope": "default"}.get(rope_type, rope_type)


def _checkpoint_quant_config(top: Mapping[str, Any], text: Mapping[str, Any] | None) -> tuple[Any, str]:
    """The quantization config vLLM reads from config.json and the key it sits under
    (``ModelArchConfigConvertorBase.get_quantization_config``): ``quantization_config``,
    else ``compression_config`` (compressed-tensors), then the same in ``text_config``."""
    for cfg, prefix in ((top, ""), (text, "text_config.")):
        if cfg is None:
            continue
        for key in ("quantization_config", "compression_config"):
            if cfg.get(key) is not None:
                return cfg[key], prefix + key
    return None, ""


_MODELOPT_FP8_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO")


def _quant_from_config(
    qcfg: Any, key: str, model_type: str, source: str
) -> tuple[QuantSpec | None, str, dict[str, Any] | None]:
    """The checkpoint's QuantSpec, quant_method and normalised config, as vLLM's
    ``_normalize_quantization_config`` reads them (ModelOpt's producer and quant_algo set the
    method; the method is lower-cased, ``compressed_tensors`` is ``compressed-tensors``)."""
    where = f"{source}:{key or 'quantization_config'}"
    if qcfg is None:
        return None, "", None
    if not isinstance(qcfg, Mapping):
        raise PlanError(
            where,
            f"must be a JSON object, got {_kind(qcfg)} {_show(qcfg)}",
            'write {"quant_method": ...} as the quantized checkpoint has it, or remove the key',
        )
    if not qcfg:
        return None, "", None
    cfg = dict(qcfg)
    if key.endswith("quantization_config"):
        producer = cfg.get("producer") or {}
        inner = cfg.get("quantization") or {}
        legacy = isinstance(inner, Mapping) and "modelopt_quant_config" in inner
        name = producer.get("name") if isinstance(producer, Mapping) else None
        if (name == "modelopt" or legacy) and isinstance(inner, Mapping) and inner.get("quant_algo") is not None:
            algo = str(inner["quant_algo"]).upper()
            if algo in _MODELOPT_FP8_ALGOS:
                cfg["quant_method"] = "modelopt"
            elif algo == "NVFP4":
                cfg["quant_method"] = "modelopt_fp4"
            else:
                raise PlanError(
                    f"{where}.quantization.quant_algo",
                    f"{_show(inner['quant_algo'])} is not a ModelOpt algorithm vLLM knows (it refuses the checkpoint)",
                    "use a ModelOpt FP8 or NVFP4 checkpoint",
                )
    method = cfg.get("quant_method")
    if not isinstance(method, str) or not method.strip():
        raise PlanError(
            f"{where}.quant_method",
            "is missing" if method is None else f"{_show(method)} is not a method name",
            "re-download config.json: vLLM reads the checkpoint's quant_method to load it",
        )
    method = method.strip().lower().replace("compressed_tensors", "compressed-tensors")
    cfg["quant_method"] = method
    return quant_from_name(method, cfg, model_type, where=where), method, cfg


# Weight-only integer formats with GPTQ/AWQ-style groups (the method's family, for bytes).
_WEIGHT_ONLY_FAMILY = {
    "awq": "awq", "awq_marlin": "awq", "auto_awq": "awq", "gptq": "gptq", "gptq_marlin": "gptq",
    "auto_gptq": "gptq", "marlin": "gptq", "moe_wna16": "gptq", "inc": "gptq", "auto_round": "gptq",
}  # fmt: skip


def _modelopt_algo(qcfg: Mapping[str, Any]) -> str:
    """ModelOpt's quant_algo, upper-cased (``ModelOptQuantConfigBase._extract_modelopt_quant_algo``):
    from ``quantization.quant_algo`` (hf_quant_config.json's shape) or ``quant_algo``."""
    inner = qcfg.get("quantization")
    if inner is not None:
        return str(inner.get("quant_algo", "")).upper() if isinstance(inner, Mapping) else ""
    return str(qcfg.get("quant_algo", "")).upper()


def quant_from_name(
    method: str, qcfg: dict[str, Any] | None = None, model_type: str = "", where: str | None = None
) -> QuantSpec | None:
    """Map a quantization method (config.json or ``--quantization``) to bytes.

    ``where`` names the quantization_config the parameters come from (``<config.json>:
    quantization_config``); None for the ``--quantization`` flag."""
    qcfg = qcfg or {}
    prefix = where or "quantization_config"
    method = method.lower().replace("-", "_")

    def number(keys: tuple[str, ...], default: int, allowed: tuple[int, ...] = (), minimum: int = 1) -> int:
        key = next((k for k in keys if qcfg.get(k) is not None), None)
        if key is None:
            return default
        fix = f"use one of {list(allowed)}" if allowed else f"write {key} as an integer of {minimum} or more"
        value = _as_int(qcfg[key], f"{prefix}.{key}", minimum, 1 << 20, fix)
        if allowed and value not in allowed:
            raise PlanError(f"{prefix}.{key}", f"{value}-bit weights are not a {method} format", fix)
        return value

    if method in ("", "none"):
        return None
    if method in ("modelopt", "modelopt_mixed"):
        algo = _modelopt_algo(qcfg)
        if "FP4" in algo:
            method = "modelopt_fp4"
        elif "MXFP8" in algo:
            method = "modelopt_mxfp8"
    if method in ("quark", "torchao", "online", "humming"):
        return None  # per-layer schemes the planner does not read: the model dtype's bytes (an upper bound)
    if method in ("fp8_per_block",):
        return QuantSpec("fp8", 8, group_size=128 * 128, scale_bytes=4)
    if method in ("modelopt_mxfp8", "mxfp8"):
        return QuantSpec("mxfp8", 8, 32, 1)
    if method in ("experts_int8", "int8_per_channel_weight_only"):
        return QuantSpec("int8", 8, experts_only=True)
    if method == "nvfp4_per_token":
        return QuantSpec("nvfp4", 4, 16, 1, experts_only=True)
    if method == "fp_quant":
        return QuantSpec("fp_quant", 4, 32, 1)
    if method in (
        "fp8", "fbgemm_fp8", "modelopt", "modelopt_mixed", "ptpc_fp8", "fp8_per_tensor", "fp8_per_channel",
        "deepseek_v4_fp8",
    ):  # fmt: skip
        block = qcfg.get("weight_block_size")
        if block:
            if not isinstance(block, list | tuple) or len(block) != 2:
                raise PlanError(
                    f"{prefix}.weight_block_size", f"{_show(block)} is not two sizes", "e.g. [128, 128], or remove it"
                )
            rows, cols = (_as_int(b, f"{prefix}.weight_block_size", 1, 1 << 16, "e.g. [128, 128]") for b in block)
            return QuantSpec("fp8", 8, group_size=rows * cols, scale_bytes=4)
        return QuantSpec("fp8", 8)
    family = _WEIGHT_ONLY_FAMILY.get(method)
    if family is not None:
        bits = number(("bits", "w_bit"), 4, (4,) if family == "awq" else (2, 3, 4, 8))
        group = 128
        group_key = next((k for k in ("group_size", "q_group_size") if qcfg.get(k) is not None), None)
        if group_key is not None:
            group = _as_int(qcfg[group_key], f"{prefix}.{group_key}", -1, 1 << 20, "use -1 (per channel) or e.g. 128")
            if group == 0:
                raise PlanError(f"{prefix}.{group_key}", "0 is not a group size", "use -1 (per channel) or e.g. 128")
        group = max(0, group)
        # fp16 scale per group + packed zero point (bits/8) per group.
        return QuantSpec(family, bits, group, 2 + bits / 8)
    if method in ("compressed_tensors",):
        bits, group, scale = 8, 0, 0.0
        groups = qcfg.get("config_groups") or {}
        if not isinstance(groups, Mapping):
            raise PlanError(f"{prefix}.config_groups", f"must be an object, got {_kind(groups)}", "fix config.json")
        for name, grp in groups.items():
            weights = grp.get("weights") if isinstance(grp, Mapping) else None
            if not isinstance(grp, Mapping) or not isinstance(weights, Mapping | None):
                raise PlanError(
                    f"{prefix}.config_groups.{name}", "must be an object with a weights object", "fix config.json"
                )
            weights = weights or {}
            bits = _as_int(
                weights.get("num_bits", bits),
                f"{prefix}.config_groups.{name}.weights.num_bits",
                1,
                64,
                "use 2, 3, 4 or 8",
            )
            if bits not in (2, 3, 4, 8):
                raise PlanError(
                    f"{prefix}.config_groups.{name}.weights.num_bits",
                    f"{bits}-bit weights are not a compressed-tensors format",
                    "use one of [2, 3, 4, 8]",
                )
            strategy = weights.get("strategy", "channel")
            if strategy == "group" and weights.get("group_size"):
                group = _as_int(
                    weights["group_size"], f"{prefix}.config_groups.{name}.weights.group_size", 1, 1 << 20, "e.g. 128"
                )
                scale = 2.0 + (0 if weights.get("symmetric", True) else bits / 8)
            break
        return QuantSpec("compressed-tensors", bits, group, scale)
    if method in ("w4a16", "int4"):
        return QuantSpec("compressed-tensors", 4, 128, 2)
    if method in ("int8", "w8a8", "w8a16"):
        return QuantSpec("compressed-tensors", 8)
    if method in ("mxfp4", "gpt_oss_mxfp4"):
        # gpt-oss: only the MoE experts are mxfp4 (4-bit + one e8m0 scale per 32).
        return QuantSpec("mxfp4", 4, 32, 1, experts_only=model_type in ("gpt_oss", "") or method == "gpt_oss_mxfp4")
    if method in ("bitsandbytes", "bnb"):
        if qcfg.get("load_in_8bit"):
            return QuantSpec("bitsandbytes", 8)
        # nf4 with fp32 absmax per 64 weights (double quantization shrinks it).
        return QuantSpec("bitsandbytes", 4, 64, 1 if qcfg.get("bnb_4bit_use_double_quant") else 4)
    if method in ("nvfp4", "modelopt_fp4"):
        return QuantSpec("nvfp4", 4, 16, 1)
    raise PlanError(
        f"{where}.quant_method" if where else "--quantization",
        f"unknown quantization method '{_show(method)[1:-1]}'",
        "use one of fp8, awq, gptq, compressed-tensors, w4a16, int8, mxfp4, bitsandbytes, nvfp4"
        if where is None
        else "the planner knows fp8, awq, gptq, compressed-tensors, mxfp4, bitsandbytes, modelopt; plan a catalog "
        "model of the same size with --quantization instead",
    )


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
    if model_type in ("llama4", "llama4_text"):
        inter, moe_inter, experts, top_k, step, shared, shared_inter, layer_types, chunk = _llama4_text(
            cfg, source, layers
        )
        first_dense, window = 0, 0

    rotary = _float(cfg, source, "partial_rotary_factor", 1.0, 0.0, 1.0)
    rope_dim = qk_rope or int(head_dim * rotary)
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
        rope_dim=rope_dim,
        rotary=model_type not in ("nemotron_h", "jamba")
        and (model_type != "granitemoehybrid" or cfg.get("position_embedding_type") == "rope"),
        quant=quant,
        vision_params=vision_params,
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


# config.json's per-layer mixer names -> the planner's layer kinds.
_MIXER_NAMES = {
    "mamba": "mamba", "mamba2": "mamba", "linear_attention": "linear_attention", "attention": "full",
    "full_attention": "full", "sliding_attention": "sliding", "M": "mamba", "*": "full", "-": "mlp", "E": "moe",
}  # fmt: skip
_HYBRID_TYPES = ("qwen3_next", "granitemoehybrid", "nemotron_h", "bamba", "jamba", "falcon_h1")


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
    elif model_type == "qwen3_next" and raw is None:
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
    if not any(t in ("mamba", "linear_attention", "parallel") for t in layer_types):
        return out
    if model_type == "qwen3_next":
        # Missing keys take transformers' Qwen3NextConfig defaults, as vLLM loads them.
        defaults = {"linear_num_key_heads": 16, "linear_num_value_heads": 32}
        for key in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"):
            out[key] = _int(cfg, source, key, default=defaults.get(key, 128), minimum=1, maximum=1 << 16)
        out["linear_conv_kernel_dim"] = _int(cfg, source, "linear_conv_kernel_dim", default=4, minimum=1, maximum=64)
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


_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)\.")


def _classify(name: str, num_layers: int) -> str | None:
    lowered = name.lower()
    if any(tag in lowered for tag in ("visual", "vision", "image_newline", "multi_modal_projector", "mm_projector")):
        return "vision"
    match = _LAYER_RE.search(name)
    if match:
        # DeepSeek's MTP module is stored as extra layers; vLLM skips it unless
        # speculative decoding asks for it.
        return "layer" if int(match.group(1)) < num_layers else None
    if "lm_head" in lowered or lowered.endswith("output.weight"):
        return "head"
    if "embed" in lowered or "wte" in lowered or "wpe" in lowered:
        return "embed"
    if "norm" in lowered:
        return "head"
    return "layer"


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files vLLM loads from ``folder`` (``DefaultModelLoader._prepare_weights``):
    ``glob("consolidated*.safetensors")`` when there is one (Mistral's format), else
    ``glob("*.safetensors")``; Python's glob skips dotfiles, so macOS ``._model.safetensors``
    copies are not weights. When the index (``model.safetensors.index.json``, or
    ``consolidated.safetensors.index.json``) is there, only the files it names count, and a
    file it names that is missing is an error, as in vLLM."""
    try:
        names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".safetensors"))
    except OSError as exc:
        raise PlanError("--model", f"cannot list {folder}: {exc.strerror}", "check the folder's permissions") from exc
    names = [n for n in names if not n.startswith(".")]
    consolidated = [n for n in names if n.startswith("consolidated")]
    if consolidated:
        names, index_name = consolidated, "consolidated.safetensors.index.json"
    else:
        index_name = "model.safetensors.index.json"
    if not names:
        return []
    index = folder / index_name
    if not index.is_file():
        return [folder / n for n in names]
    try:
        data = json.loads(_read_text(index, MAX_CONFIG_BYTES))
    except (ValueError, RecursionError) as exc:
        raise PlanError(str(index), f"is not valid JSON ({_show(str(exc))})", "re-download it") from exc
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise PlanError(str(index), "has no weight_map of tensor -> file names", "re-download it")
    listed = set(weight_map.values())
    missing = sorted(listed - set(names))
    if missing:
        raise PlanError(
            str(index),
            f"names {len(missing)} file(s) that are not in the folder (e.g. {_show(missing[0])})",
            "finish the download (every shard the index names), or remove the index",
        )
    return [folder / n for n in names if n in listed]


def _read_text(path: Path, limit: int) -> str:
    """A small text file, UTF-8; PlanError naming it when it is unreadable or too large."""
    try:
        size = path.stat().st_size
        if size > limit:
            raise PlanError(str(path), f"is {size:,} bytes, larger than {limit:,}", "point --model at a model folder")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError(str(path), f"is not UTF-8 text (byte {exc.start})", "re-download it") from exc
    except OSError as exc:
        raise PlanError(str(path), f"cannot be read: {exc.strerror}", "check the file and its permissions") from exc


def _shape_elements(shape: Any, where: str, tensor: str) -> int:
    if not isinstance(shape, list):
        raise PlanError(
            where, f"tensor {_show(tensor)} has shape {_show(shape)}, not a list of sizes", "re-download it"
        )
    count = 1
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise PlanError(where, f"tensor {_show(tensor)} has a bad dimension {_show(dim)}", "re-download it")
        count *= dim
    return count


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of one safetensors file and the size of its data buffer."""
    where = str(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            raw = handle.read(8)
            if len(raw) != 8:
                raise PlanError(where, "not a safetensors file (shorter than 8 bytes)", "re-download it")
            (length,) = struct.unpack("<Q", raw)
            if length > MAX_HEADER_BYTES:
                raise PlanError(where, "safetensors header larger than 100 MiB", "re-download it")
            if length + 8 > size:
                raise PlanError(
                    where, f"header length {length:,} is larger than the file ({size:,} bytes)", "re-download it"
                )
            text = handle.read(length)
    except OSError as exc:
        raise PlanError(where, f"cannot be read: {exc.strerror}", "check the file and its permissions") from exc
    try:
        header = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise PlanError(where, f"unreadable safetensors header ({_show(str(exc))})", "re-download it") from exc
    if not isinstance(header, dict):
        raise PlanError(where, f"safetensors header is {_kind(header)}, not an object", "re-download it")
    return header, size - 8 - length


def _tensor_bytes(path: Path, tensor: str, meta: Any, buffer: int) -> int:
    """Bytes of one tensor, its dtype, shape and offsets checked the way safetensors checks them."""
    where = str(path)
    if not isinstance(meta, dict):
        raise PlanError(where, f"tensor {_show(tensor)} is described by {_kind(meta)}, not an object", "re-download it")
    dtype = meta.get("dtype")
    if not isinstance(dtype, str) or dtype not in _SAFETENSORS_DTYPE_BYTES:
        raise PlanError(where, f"tensor {_show(tensor)} has an unknown dtype {_show(dtype)}", "re-download it")
    elements = _shape_elements(meta.get("shape"), where, tensor)
    try:
        start, end = meta["data_offsets"]
        if isinstance(start, bool) or isinstance(end, bool) or not isinstance(start, int) or not isinstance(end, int):
            raise TypeError
    except (KeyError, ValueError, TypeError) as exc:
        raise PlanError(where, f"tensor '{tensor}' has no valid data_offsets", "re-download it") from exc
    if not 0 <= start <= end <= buffer:
        raise PlanError(
            where,
            f"tensor {_show(tensor)} data_offsets [{start}, {end}] lie outside its {buffer:,}-byte data",
            "re-download it",
        )
    expected = math.ceil(elements * _SAFETENSORS_DTYPE_BYTES[dtype])
    if end - start != expected:
        raise PlanError(
            where,
            f"tensor {_show(tensor)} takes {end - start:,} bytes but {dtype} x {elements:,} elements is {expected:,}",
            "re-download it",
        )
    return end - start


def read_safetensors_bytes(folder: Path, num_layers: int) -> dict[str, int] | None:
    """Sum tensor bytes per model part from safetensors headers (no tensor loaded)."""
    files = weight_files(folder)
    if not files:
        return None
    totals: dict[str, int] = {"embed": 0, "head": 0, "layer": 0, "vision": 0}
    for path in files:
        header, buffer = _header(path)
        for tensor, meta in header.items():
            if tensor == "__metadata__":
                if not isinstance(meta, dict):
                    raise PlanError(str(path), "__metadata__ is not an object", "re-download it")
                continue
            size = _tensor_bytes(path, tensor, meta, buffer)
            part = _classify(tensor, num_layers)
            if part is not None:
                totals[part] += size
    return totals


def _small_json(path: Path) -> Any:
    """A small JSON file next to config.json, or None when it is absent, too large or
    unreadable (vLLM's own problem: these files only refine what config.json says)."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        return json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def _tokenizer_max_length(folder: Path) -> float | None:
    """model_max_length of the folder's tokenizer_config.json; None when there is none."""
    data = _small_json(folder / "tokenizer_config.json")
    value = data.get("model_max_length") if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or not math.isfinite(value):
        return None
    return float(value)


# vLLM's runner by architecture suffix (``_SUFFIX_TO_DEFAULTS`` of config/model.py), first match.
_RUNNER_BY_SUFFIX = (
    ("ForCausalLM", "generate"), ("ForConditionalGeneration", "generate"), ("ChatModel", "generate"),
    ("LMHeadModel", "generate"), ("ForTextEncoding", "pooling"), ("EmbeddingModel", "pooling"),
    ("ForSequenceClassification", "pooling"), ("ForTokenClassification", "pooling"),
    ("ForAudioClassification", "pooling"), ("ForImageClassification", "pooling"),
    ("ForVideoClassification", "pooling"), ("ClassificationModel", "pooling"), ("ForRewardModeling", "pooling"),
    ("RewardModel", "pooling"), ("Model", "pooling"),
)  # fmt: skip
_ST_POOLING = (
    "sentence_transformers.models.Pooling",
    "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
)
# Sentence Transformers configs whose max_seq_length replaces vLLM's derived length, in its order.
_ST_CONFIGS = (
    "sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json",
    "sentence_camembert_config.json", "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
    "sentence_xlnet_config.json",
)  # fmt: skip


def is_pooling(cfg: Mapping[str, Any], folder: Path | None = None) -> bool:
    """Whether vLLM runs the model as a pooling model (``ModelConfig._get_default_runner_type``):
    a Sentence Transformers modules.json with a Pooling module, else the first architecture
    whose suffix vLLM knows (``*ForCausalLM`` generates, ``*Model`` / ``*ForSequenceClassification``
    pool)."""
    if folder is not None:
        modules = _small_json(folder / "modules.json")
        if isinstance(modules, list) and any(isinstance(m, dict) and m.get("type") in _ST_POOLING for m in modules):
            return True
    archs = cfg.get("architectures")
    for arch in archs if isinstance(archs, list) else []:
        runner = next((r for suffix, r in _RUNNER_BY_SUFFIX if isinstance(arch, str) and arch.endswith(suffix)), None)
        if runner is not None:
            return runner == "pooling"
    return False


def _encoder_max_seq_length(folder: Path) -> tuple[str, Any] | None:
    """The first Sentence Transformers config with content, when it states max_seq_length."""
    for name in _ST_CONFIGS:
        data = _small_json(folder / name)
        if data:
            return (
                (str(folder / name), data["max_seq_length"])
                if isinstance(data, dict) and "max_seq_length" in data
                else None
            )
    return None


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

        return replace(spec, json_files=_quant_files(path))
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
        vision_params=int(vision / dtype_bytes) if vision else spec.vision_params,
        source=spec.source + " + safetensors headers",
    )


# ``vllm serve --quantization`` values vLLM 0.32 accepts (QUANTIZATION_METHODS of
# vllm/model_executor/layers/quantization/__init__.py). vLLM 0.32 refuses bitsandbytes and
# gguf ("Unknown quantization method"); a plan for an older release still takes the names
# those releases had.
VLLM_QUANTIZATION_METHODS = frozenset(
    {
        "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
        "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
        "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8",
        "online", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only",
        "nvfp4_per_token", "mxfp8",
    }
)  # fmt: skip
OLDER_QUANTIZATION_METHODS = frozenset(
    {"bitsandbytes", "gguf", "marlin", "ptpc_fp8", "gptq_marlin_24", "aqlm", "hqq", "ipex", "qqq", "deepspeedfp"}
)
# DEPRECATED_QUANTIZATION_METHODS: vLLM refuses them without --allow-deprecated-quantization.
DEPRECATED_QUANTIZATION_METHODS = frozenset({"fbgemm_fp8", "fp_quant"})
ALLOW_DEPRECATED = "--allow-deprecated-quantization"
# vLLM's online shorthands: with no checkpoint config they quantize at load
# (OnlineQuantizationConfig, compute capability 7.5); fp8 is the per-tensor one.
ONLINE_SHORTHANDS = frozenset(
    {"fp8", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "mxfp8", "mxfp4", "int8_per_channel_weight_only",
     "nvfp4_per_token"}
)  # fmt: skip
_PLANNER_SHORTHANDS = {
    "w4a16": "compressed-tensors",
    "int4": "compressed-tensors",
    "int8": "compressed-tensors",
    "w8a8": "compressed-tensors",
    "w8a16": "compressed-tensors",
    "bnb": "bitsandbytes",
    "nvfp4": "modelopt_fp4",
}
# Methods that only load a checkpoint quantized that way: with no quantization config in
# config.json and no file of their own, vLLM cannot build them (``quant_cls()`` or
# "Cannot find the config file for X").
_CHECKPOINT_FORMATS = frozenset(
    {
        "awq", "auto_awq", "awq_marlin", "gptq", "auto_gptq", "gptq_marlin", "marlin", "compressed-tensors",
        "modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed", "gpt_oss_mxfp4", "moe_wna16", "quark",
        "fbgemm_fp8", "gguf", "deepseek_v4_fp8", "gptq_marlin_24", "aqlm", "qqq", "inc", "torchao",
    }
)  # fmt: skip
# ``get_config_filenames()`` of the class vLLM builds for each method (get_quantization_config):
# the file it reads when config.json has no quantization config.
_MODELOPT_FILE = ("hf_quant_config.json",)
QUANT_CONFIG_FILES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("gptq", "auto_gptq", "gptq_marlin", "moe_wna16"), ("quantize_config.json",)),
    **dict.fromkeys(("awq", "auto_awq", "awq_marlin"), ("quantize_config.json", "quant_config.json")),
    **dict.fromkeys(("modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed", "mxfp8"), _MODELOPT_FILE),
    "inc": ("quantization_config.json",),
}  # fmt: skip
_GPTQ_FLAGS = (None, "gptq", "gptq_marlin", "auto_gptq", "marlin")
_AWQ_FLAGS = (None, "awq", "awq_marlin", "auto_awq", "marlin")
_DEEPSEEK_V4 = {
    "cpu": ("deepseek_v4",),
    "cuda": ("deepseek_v4", "deepseek_v4_text", "deepseek_v41", "deepseek_v41_text"),
}


def _release(version: str | None) -> tuple[int, int]:
    parts = str(version or "").strip().lstrip("v").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 32)


def supported_quantization(vllm_version: str | None = None) -> frozenset[str]:
    """The --quantization names the vLLM release accepts (0.32's list, older names before it)."""
    if _release(vllm_version) < (0, 32):
        return VLLM_QUANTIZATION_METHODS | OLDER_QUANTIZATION_METHODS
    return VLLM_QUANTIZATION_METHODS


def vllm_quantization_name(flag: str, vllm_version: str | None = None) -> str | None:
    """The ``--quantization`` spelling vLLM knows for ``flag`` (``gptq-marlin`` ->
    ``gptq_marlin``, ``w4a16`` -> ``compressed-tensors``), or None."""
    lowered = flag.strip().lower()
    known = supported_quantization(vllm_version)
    if lowered in _PLANNER_SHORTHANDS and _PLANNER_SHORTHANDS[lowered] in known:
        return _PLANNER_SHORTHANDS[lowered]
    key = lowered.replace("-", "_")
    return next((m for m in sorted(known) if m.replace("-", "_") == key), None)


def _moe_wna16_compatible(cfg: Mapping[str, Any], capability: int | None) -> bool:
    """``MoeWNA16Config.is_moe_wna16_compatible``: GPTQ 4/8-bit without group activation
    ordering, AWQ 4-bit from compute capability 7.5 (None: not known yet, assumed)."""
    method = str(cfg.get("quant_method", "")).lower()
    bits = cfg.get("bits")
    if method == "gptq":
        desc_act = bool(cfg.get("desc_act", False)) and cfg.get("group_size") != -1
        dynamic = cfg.get("dynamic") or {}
        rules = dynamic.items() if isinstance(dynamic, Mapping) else ()
        desc_rule = any(
            isinstance(o, Mapping)
            and not str(p).startswith("-:")
            and o.get("desc_act", cfg.get("desc_act", False))
            and o.get("group_size", cfg.get("group_size")) != -1
            for p, o in rules
        )
        return not desc_act and not desc_rule and bits in (4, 8)
    return method == "awq" and bits == 4 and (capability is None or capability >= 75)


def _override(
    name: str, cfg: Mapping[str, Any], flag: str | None, model_type: str, device: str, capability: int | None
) -> str | None:
    """``override_quantization_method`` of the class vLLM builds for ``name``."""
    method = str(cfg.get("quant_method", "")).lower()
    if name == "gptq":
        return "auto_gptq" if method == "gptq" and flag in _GPTQ_FLAGS else None
    if name == "awq":  # AutoAWQ does not override on the CPU (the CPU AWQ path loads it)
        return "auto_awq" if device != "cpu" and method == "awq" and flag in _AWQ_FLAGS else None
    if name == "inc":
        return "inc" if cfg.get("quant_method") == "auto-round" else None
    if name == "moe_wna16":
        cap = -1 if device == "cpu" else capability
        return "moe_wna16" if flag == "moe_wna16" and _moe_wna16_compatible(cfg, cap) else None
    if name.startswith("modelopt"):
        if not method.startswith("modelopt"):
            return None
        algo = _modelopt_algo(cfg)
        if name == "modelopt":
            return "modelopt" if algo == "FP8" else None
        if name == "modelopt_fp4":
            return "modelopt_fp4" if "NVFP4" in algo or "FP4" in algo else None
        if name == "modelopt_mxfp8":
            return "modelopt_mxfp8" if "MXFP8" in algo else None
        return "modelopt_mixed" if algo == "MIXED_PRECISION" else None
    if name == "gpt_oss_mxfp4":
        return (
            "gpt_oss_mxfp4"
            if cfg.get("quant_method") in ("mxfp4", "gpt_oss_mxfp4") and model_type == "gpt_oss"
            else None
        )
    if name == "deepseek_v4_fp8":
        if cfg.get("quant_method") not in ("fp8", "deepseek_v4_fp8"):
            return None
        types = _DEEPSEEK_V4["cpu" if device == "cpu" else "cuda"]
        return "deepseek_v4_fp8" if model_type in types or flag == "deepseek_v4_fp8" else None
    if name == "humming" and flag == "humming":
        if model_type == "gpt_oss" and cfg.get("quant_method") == "mxfp4":
            raise PlanError(
                "--quantization",
                "vLLM refuses --quantization humming for gpt-oss's mxfp4 checkpoint",
                "drop --quantization; vLLM's --moe-backend humming selects that kernel",
            )
        return "humming"
    return None


# ModelConfig._verify_quantization's overrides, in its order of preference (one entry per
# class: gptq_marlin and auto_gptq build the same AutoGPTQConfig as gptq...).
_OVERRIDES = (
    "gptq", "awq", "inc", "moe_wna16", "modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed",
    "gpt_oss_mxfp4", "deepseek_v4_fp8", "humming",
)  # fmt: skip


@dataclass(frozen=True)
class QuantChoice:
    """The quantization vLLM runs: ``method`` as ModelConfig.quantization ends up (after the
    overrides), ``source`` where its parameters come from (config.json's key, the method's
    own file, or the flag alone), ``config`` those parameters, ``note`` a warning when vLLM
    replaces the flag."""

    method: str | None
    source: str = ""
    config: Mapping[str, Any] | None = None
    note: str | None = None

    @property
    def online(self) -> bool:
        """Quantized at load by vLLM's online path (no checkpoint parameters)."""
        return self.source == "flag" and self.method in ONLINE_SHORTHANDS


def quant_file_config(spec: ModelSpec, method: str) -> tuple[str, dict[str, Any]] | None:
    """``get_quant_config``'s file path: the one ``*.json`` of the folder ending with one of
    the method's config file names (``quantize_config.json`` for GPTQ, ``hf_quant_config.json``
    for ModelOpt...), parsed; None when the method reads no file or the folder has none.
    PlanError for two candidates, an unreadable one, or ModelOpt's file of another producer."""
    names = QUANT_CONFIG_FILES.get(method)
    if not names:
        return None
    found = [(n, t) for n, t in spec.json_files if n.endswith(names)]
    if not found:
        return None
    if len(found) > 1:
        raise PlanError(
            "--quantization",
            f"vLLM finds several {method} config files in {spec.name} ({', '.join(n for n, _ in found)}) and refuses",
            "keep one of them in the model folder",
        )
    name, text = found[0]
    where = f"{spec.name.rstrip('/')}/{name}"
    if text.startswith("\x00"):
        raise PlanError(where, text[1:], "re-download it")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise PlanError(where, f"is not valid JSON ({_show(str(exc))})", "re-download it") from exc
    if not isinstance(data, dict):
        raise PlanError(where, f"is {_kind(data)}, not a JSON object", "re-download it")
    if method in ("modelopt", "modelopt_mixed"):
        producer = data.get("producer")
        if not isinstance(producer, Mapping) or producer.get("name") != "modelopt":
            raise PlanError(
                where,
                f"is not a ModelOpt config (producer.name is not 'modelopt'): vLLM refuses it for {method}",
                "use the checkpoint's own hf_quant_config.json",
            )
    return name, data


def resolve_quantization(
    spec: ModelSpec,
    flag: str | None,
    *,
    device: str = "cuda",
    capability: int | None = None,
    vllm_version: str | None = None,
    extra_args: tuple[str, ...] | list[str] = (),
) -> QuantChoice:
    """The quantization vLLM runs ``spec`` with, as ``ModelConfig._verify_quantization`` and
    ``get_quant_config`` decide it, or the PlanError vLLM's refusal becomes:

    * with a checkpoint config, every override in vLLM's order may replace the flag (GPTQ ->
      auto_gptq for gptq/gptq_marlin/marlin, ModelOpt by quant_algo -> modelopt_fp4...,
      gpt-oss mxfp4 -> gpt_oss_mxfp4 whatever the flag says); otherwise the flag must equal
      the checkpoint's quant_method;
    * the result must be a method of the release; deprecated ones need
      --allow-deprecated-quantization in ``extra_args``;
    * without a checkpoint config a checkpoint format needs its own file (quantize_config.json,
      hf_quant_config.json...).

    ``device``: cuda, rocm or cpu (AWQ and DeepSeek V4 overrides differ there);
    ``capability``: compute capability x 10, None when not known."""
    cfg = spec.quant_config
    choice: QuantChoice
    if cfg is not None:
        method: str | None = str(cfg.get("quant_method") or "") or None
        names = ("humming", *_OVERRIDES) if flag == "humming" else _OVERRIDES
        override = next(
            (o for o in (_override(n, cfg, flag, spec.config_model_type, device, capability) for n in names) if o),
            None,
        )
        key = "quantization_config"
        if override is not None:
            note = (
                f"vLLM runs --quantization {flag} as {override} for this checkpoint"
                if flag and flag != override
                else None
            )
            choice = QuantChoice(override, key, cfg, note)
        elif flag is None:
            choice = QuantChoice(method, key, cfg)
        elif flag != method:
            raise PlanError(
                "--quantization",
                f"{flag} does not match the checkpoint's quantization_config ({method}): vLLM refuses the pair",
                f"drop --quantization (vLLM reads {method} from config.json) or pass --quantization {method}",
            )
        else:
            choice = QuantChoice(flag, key, cfg)
    elif flag is None:
        return QuantChoice(None)
    else:
        found = quant_file_config(spec, flag)
        choice = QuantChoice(flag, found[0], found[1]) if found else QuantChoice(flag, "flag")
    known = supported_quantization(vllm_version)
    where = "--quantization" if flag else "--model"
    if choice.method is not None and choice.method not in known:
        spelled = vllm_quantization_name(choice.method, vllm_version)
        release = vllm_version or "0.32"
        raise PlanError(
            where,
            f"{_show(choice.method)} is not a quantization method vLLM {release} knows (vllm serve refuses it)",
            f"use --quantization {spelled}"
            if spelled and flag
            else "use fp8, awq, gptq, compressed-tensors, mxfp4, modelopt..."
            if flag
            else "serve a checkpoint in a format this vLLM release loads",
        )
    if choice.method in DEPRECATED_QUANTIZATION_METHODS and ALLOW_DEPRECATED not in extra_args:
        raise PlanError(
            where,
            f"{choice.method} is deprecated in vLLM, which refuses it without {ALLOW_DEPRECATED}",
            f"add {ALLOW_DEPRECATED} (vLLM's own opt-in), or use another method",
        )
    if choice.source == "flag" and flag in _CHECKPOINT_FORMATS:
        files = QUANT_CONFIG_FILES.get(flag)
        reads = f" nor {' / '.join(files)}" if files else ""
        raise PlanError(
            "--quantization",
            f"{flag} loads a checkpoint quantized with {flag}, but {spec.name} has no quantization_config{reads}",
            f"point the model at its {flag} checkpoint, or use --quantization fp8 (vLLM quantizes at load)",
        )
    return choice


def quant_flag_matches(flag: str, spec: ModelSpec) -> bool:
    """Whether vLLM loads ``spec``'s checkpoint format with ``--quantization flag``."""
    try:
        return resolve_quantization(spec, flag, extra_args=(ALLOW_DEPRECATED,)).source == "quantization_config"
    except PlanError:
        return False


def check_quantization_flag(
    spec: ModelSpec,
    flag: str | None,
    *,
    rendered: bool,
    vllm_version: str | None = None,
    extra_args: tuple[str, ...] | list[str] = (),
) -> QuantChoice:
    """Refuse a ``--quantization`` (or a checkpoint) that vLLM would refuse at start-up
    (:func:`resolve_quantization`, before the GPUs are known). A name that is not a vLLM
    method is refused only when it is ``rendered`` into ``vllm serve``; ``estimate`` may use
    the planner's shorthands (w4a16...), which describe bytes."""
    if flag and flag not in supported_quantization(vllm_version) and flag not in ("marlin",):
        if not rendered:
            return QuantChoice(flag, "flag")
        if spec.quant_config is None:
            spelled = vllm_quantization_name(flag, vllm_version)
            raise PlanError(
                "--quantization",
                f"{_show(flag)} is not a quantization method vLLM knows (vllm serve refuses it)",
                f"use --quantization {spelled}"
                if spelled
                else "use fp8, awq, gptq, compressed-tensors, mxfp4, modelopt...",
            )
    return resolve_quantization(spec, flag, vllm_version=vllm_version, extra_args=extra_args)


def _env_true(value: Any) -> bool:
    return str(value or "0").strip().lower() in ("1", "true")


def check_max_model_len(
    spec: ModelSpec, max_model_len: int, env: Mapping[str, str] | None = None, *, asked: bool = True
) -> str | None:
    """vLLM's check of ``--max-model-len`` against the model's derived maximum
    (``_get_and_verify_max_len``): above it, vLLM starts only with
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` (or ``true``) in its environment. Returns the warning
    when the variable allows it, None when the length is within the model's; PlanError
    otherwise. ``asked``: the operator chose the length (else it is the planner's default)."""
    derived = spec.derived_max_model_len
    if not derived or max_model_len <= derived:
        return None
    if spec.model_max_length is not None and max_model_len <= spec.model_max_length:
        return None
    where = f"{spec.derived_max_model_len_key}={int(derived) if derived.is_integer() else derived}"
    if _env_true((env or {}).get("VLLM_ALLOW_LONG_MAX_MODEL_LEN")):
        return (
            f"max_model_len {max_model_len} is above the model's {where}; VLLM_ALLOW_LONG_MAX_MODEL_LEN lets "
            "vLLM start, but positions beyond it give NaN (RoPE) or out-of-bounds errors"
        )
    problem = (
        f"{max_model_len} is above the model's derived maximum ({where}): vLLM refuses it at start-up"
        if asked
        else f"vLLM's default length for this model ({max_model_len}, LongRoPE's original_max_position_embeddings) "
        f"is above its derived maximum ({where}), and a plan states its length"
    )
    raise PlanError(
        "--max-model-len",
        problem,
        f"use --max-model-len {int(derived)} or less, or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 with --env "
        "at your own risk",
    )
