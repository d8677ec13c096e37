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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_fleet.errors import PlanError

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
    # Sliding window / hybrid attention: one entry per layer, "full" or "sliding".
    sliding_window: int = 0
    layer_types: tuple[str, ...] = ()
    rope_dim: int = 0
    quant: QuantSpec | None = None
    vision_params: int = 0
    # Exact bytes from safetensors headers, per part ("embed", "head",
    # "vision", "layer"); None when the model came from the catalog.
    file_bytes: dict[str, int] | None = field(default=None, compare=False)
    source: str = "catalog"
    # vLLM's derived maximum length (``_get_and_verify_max_len``): the smallest length key of
    # config.json (model_max_length when set), capped by the tokenizer's, times the RoPE
    # scaling factor; 0 when config.json names no length (vLLM then takes any max_model_len).
    derived_max_model_len: float = field(default=0.0, compare=False)
    derived_max_model_len_key: str = field(default="", compare=False)
    model_max_length: float | None = field(default=None, compare=False)
    # quantization_config.quant_method as written: vLLM compares --quantization with it.
    quant_method: str = field(default="", compare=False)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, index: int) -> bool:
        if not self.is_moe or index < self.first_dense_layers:
            return False
        return (index + 1) % max(self.moe_layer_step, 1) == 0

    def layer_type(self, index: int) -> str:
        if self.layer_types:
            return self.layer_types[index]
        return "sliding" if self.sliding_window else "full"

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
    cfg: Mapping[str, Any], top: Mapping[str, Any], source: str, tokenizer_max: float | None
) -> tuple[float, str, float | None]:
    """vLLM's derived maximum length, the key it comes from, and config.json's model_max_length."""
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
    if derived == math.inf:
        return 0.0, "", None
    derived = float(derived)
    model_type = str(top.get("model_type") or cfg.get("model_type") or "")
    params = _rope_parameters(cfg)
    if params and "gemma3" not in model_type:
        factor: float = 1.0
        for rp in params:
            rope_type = rp.get("rope_type", rp.get("type", "default"))
            if rope_type not in _ROPE_PRESCALED:
                raw = rp.get("factor", factor)
                if raw is None:
                    raw = 1.0
                if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw <= 0:
                    raise PlanError(
                        f"{source}:rope_scaling.factor", f"{_show(raw)} is not a positive number", "fix config.json"
                    )
                factor = float(raw)
        derived *= factor
    return derived, key, float(model_max) if model_max else None


def _quant_from_config(qcfg: Any, model_type: str, source: str) -> tuple[QuantSpec | None, str]:
    where = f"{source}:quantization_config"
    if qcfg is None:
        return None, ""
    if not isinstance(qcfg, Mapping):
        raise PlanError(
            where,
            f"must be a JSON object, got {_kind(qcfg)} {_show(qcfg)}",
            'write {"quant_method": ...} as the quantized checkpoint has it, or remove the key',
        )
    if not qcfg:
        return None, ""
    method = qcfg.get("quant_method")
    if not isinstance(method, str) or not method.strip():
        raise PlanError(
            f"{where}.quant_method",
            "is missing" if method is None else f"{_show(method)} is not a method name",
            "re-download config.json: vLLM reads the checkpoint's quant_method to load it",
        )
    return quant_from_name(method, dict(qcfg), model_type, where=where), method.strip().lower()


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
    if method in ("fp8", "fbgemm_fp8", "modelopt", "ptpc_fp8"):
        block = qcfg.get("weight_block_size")
        if block:
            if not isinstance(block, list | tuple) or len(block) != 2:
                raise PlanError(
                    f"{prefix}.weight_block_size", f"{_show(block)} is not two sizes", "e.g. [128, 128], or remove it"
                )
            rows, cols = (_as_int(b, f"{prefix}.weight_block_size", 1, 1 << 16, "e.g. [128, 128]") for b in block)
            return QuantSpec("fp8", 8, group_size=rows * cols, scale_bytes=4)
        return QuantSpec("fp8", 8)
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin", "marlin"):
        bits = number(("bits", "w_bit"), 4, (4,) if method.startswith("awq") else (2, 3, 4, 8))
        group = 128
        group_key = next((k for k in ("group_size", "q_group_size") if qcfg.get(k) is not None), None)
        if group_key is not None:
            group = _as_int(qcfg[group_key], f"{prefix}.{group_key}", -1, 1 << 20, "use -1 (per channel) or e.g. 128")
            if group == 0:
                raise PlanError(f"{prefix}.{group_key}", "0 is not a group size", "use -1 (per channel) or e.g. 128")
        group = max(0, group)
        # fp16 scale per group + packed zero point (bits/8) per group.
        return QuantSpec(method.split("_")[0], bits, group, 2 + bits / 8)
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
    if method == "mxfp4":
        # gpt-oss: only the MoE experts are mxfp4 (4-bit + one e8m0 scale per 32).
        return QuantSpec("mxfp4", 4, 32, 1, experts_only=model_type in ("gpt_oss", ""))
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
    cfg: Any, name: str, source: str = "config.json", tokenizer_max_length: float | None = None
) -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed config.json; every value is checked
    (type, range, and the relations a real model has), one line naming the key."""
    if not isinstance(cfg, dict):
        raise PlanError(source, "is not a JSON object", "point --model at a Hugging Face model folder")
    try:
        return _spec_from_config(cfg, name, source, tokenizer_max_length)
    except PlanError:
        raise
    except (TypeError, ValueError, ArithmeticError, AttributeError, KeyError, IndexError) as exc:
        raise PlanError(source, f"holds a value of the wrong type ({_show(str(exc))})", "fix config.json") from exc


def _spec_from_config(cfg: dict[str, Any], name: str, source: str, tokenizer_max_length: float | None) -> ModelSpec:
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
    if isinstance(raw_types, list) and len(raw_types) == layers:
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
    shared_inter = _int(cfg, source, "shared_expert_intermediate_size", maximum=1 << 24)
    if shared_inter and not shared:
        shared = 1
    if shared and not shared_inter:
        shared_inter = moe_inter * shared

    rotary = _float(cfg, source, "partial_rotary_factor", 1.0, 0.0, 1.0)
    rope_dim = qk_rope or int(head_dim * rotary)
    max_pos = _int(
        cfg, source, "max_position_embeddings", "n_positions", "max_sequence_length",
        default=2048, minimum=1, maximum=MAX_POSITIONS,
    )  # fmt: skip
    derived, derived_key, model_max = _derived_max_len(cfg, top, source, tokenizer_max_length)
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
    quant, quant_method = _quant_from_config(
        top.get("quantization_config") or cfg.get("quantization_config"), model_type, source
    )
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
        rope_dim=rope_dim,
        quant=quant,
        vision_params=vision_params,
        source=source,
        derived_max_model_len=derived,
        derived_max_model_len_key=derived_key,
        model_max_length=model_max,
        quant_method=quant_method,
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


def _tokenizer_max_length(folder: Path) -> float | None:
    """model_max_length of the folder's tokenizer_config.json (vLLM caps its derived
    maximum with it); None when there is none or it is unreadable (vLLM's own problem)."""
    path = folder / "tokenizer_config.json"
    try:
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    value = data.get("model_max_length") if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or not math.isfinite(value):
        return None
    return float(value)


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
    from vllm_fleet.catalog import MODELS, lookup_model

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
        spec = spec_from_config(
            _load_config(cfg_path),
            name=str(path),
            source=str(cfg_path),
            tokenizer_max_length=_tokenizer_max_length(path),
        )
        file_bytes = read_safetensors_bytes(path, spec.num_layers)
        if file_bytes is not None:
            spec = _with_file_bytes(spec, file_bytes)
        return spec
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
    from dataclasses import replace

    vision = file_bytes.get("vision", 0)
    dtype_bytes = DTYPE_BYTES.get(spec.torch_dtype, 2)
    return replace(
        spec,
        file_bytes=file_bytes,
        vision_params=int(vision / dtype_bytes) if vision else spec.vision_params,
        source=spec.source + " + safetensors headers",
    )


# ``vllm serve --quantization`` values vLLM accepts (QuantizationMethods of vllm 0.32, and
# names older releases took); the planner's own shorthands are not among them.
VLLM_QUANTIZATION_METHODS = frozenset(
    {
        "awq", "auto_awq", "awq_marlin", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4",
        "modelopt_mxfp8", "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "marlin", "humming",
        "compressed-tensors", "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4",
        "deepseek_v4_fp8", "online", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel",
        "int8_per_channel_weight_only", "nvfp4_per_token", "mxfp8",
        # older releases
        "bitsandbytes", "gguf", "ptpc_fp8", "gptq_marlin_24", "aqlm", "hqq", "ipex", "qqq", "deepspeedfp",
    }
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
# Formats that only load a checkpoint quantized that way (the others quantize at load).
_CHECKPOINT_FORMATS = frozenset(
    {
        "awq", "auto_awq", "awq_marlin", "gptq", "auto_gptq", "gptq_marlin", "marlin", "compressed-tensors",
        "modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed", "gpt_oss_mxfp4", "moe_wna16", "quark",
        "fbgemm_fp8", "gguf", "deepseek_v4_fp8", "gptq_marlin_24", "aqlm", "qqq",
    }
)  # fmt: skip
# --quantization values vLLM's overrides accept for a checkpoint's quant_method
# (override_quantization_method of AutoGPTQ, AutoAWQ, MoeWNA16, ModelOpt, Mxfp4).
_COMPATIBLE = {
    "gptq": {"gptq", "gptq_marlin", "auto_gptq", "marlin", "moe_wna16"},
    "awq": {"awq", "awq_marlin", "auto_awq", "marlin", "moe_wna16"},
    "modelopt": {"modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed"},
    "modelopt_fp4": {"modelopt", "modelopt_fp4"},
    "mxfp4": {"mxfp4", "gpt_oss_mxfp4"},
}


def quant_flag_matches(flag: str, checkpoint_method: str) -> bool:
    """Whether vLLM loads a checkpoint of ``checkpoint_method`` with ``--quantization flag``."""
    return flag == checkpoint_method or flag in _COMPATIBLE.get(checkpoint_method, ()) or flag == "humming"


def vllm_quantization_name(flag: str) -> str | None:
    """The ``--quantization`` spelling vLLM knows for ``flag`` (``gptq-marlin`` ->
    ``gptq_marlin``, ``w4a16`` -> ``compressed-tensors``), or None."""
    lowered = flag.strip().lower()
    if lowered in _PLANNER_SHORTHANDS:
        return _PLANNER_SHORTHANDS[lowered]
    key = lowered.replace("-", "_")
    return next((m for m in sorted(VLLM_QUANTIZATION_METHODS) if m.replace("-", "_") == key), None)


def check_quantization_flag(spec: ModelSpec, flag: str | None, *, rendered: bool) -> None:
    """Refuse a ``--quantization`` that vLLM would refuse at start-up: one that is not a
    vLLM method (only when the flag is ``rendered`` into ``vllm serve``; ``estimate`` may
    use the planner's shorthands), one that does not match the checkpoint's
    quantization_config (vLLM: "Quantization method specified in the model config (X) does
    not match the quantization method specified in the `quantization` argument (Y)"), and a
    checkpoint format asked of a checkpoint that is not quantized."""
    if not flag:
        return
    known = flag in VLLM_QUANTIZATION_METHODS
    if rendered and not known:
        spelled = vllm_quantization_name(flag)
        raise PlanError(
            "--quantization",
            f"{_show(flag)} is not a quantization method vLLM knows (vllm serve refuses it)",
            f"use --quantization {spelled}"
            if spelled
            else "use fp8, awq, gptq, compressed-tensors, mxfp4, modelopt...",
        )
    if not known:
        return
    ckpt = spec.quant_method
    if ckpt:
        if quant_flag_matches(flag, ckpt):
            return
        raise PlanError(
            "--quantization",
            f"{flag} does not match the checkpoint's quantization_config ({ckpt}): vLLM refuses the pair",
            f"drop --quantization (vLLM reads {ckpt} from config.json) or pass --quantization {ckpt}",
        )
    if rendered and flag in _CHECKPOINT_FORMATS:
        raise PlanError(
            "--quantization",
            f"{flag} loads a checkpoint quantized with {flag}, but {spec.name} has no quantization_config",
            f"point the model at its {flag} checkpoint, or use --quantization fp8 (vLLM quantizes at load)",
        )


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
        else f"the model's max_position_embeddings is {spec.max_position_embeddings} but vLLM derives {where}"
    )
    raise PlanError(
        "--max-model-len",
        problem,
        f"use --max-model-len {int(derived)} or less, or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
        "(--env, or vllm_fleet_extra_env) at your own risk",
    )
