"""What the planner needs to know about a model, read from config.json.

A model is either a local folder (``config.json`` and optionally
``*.safetensors``) or a name from the built-in catalog (``catalog.py``). Both
go through :func:`spec_from_config`, so a catalog entry behaves exactly like a
downloaded folder holding the same ``config.json``.

Safetensors headers are read without loading tensors (8-byte length + JSON
header per file); their byte counts per part of the model (embedding, each
decoder layer, head, vision tower) replace the formula's when present.
"""

from __future__ import annotations

import json
import re
import struct
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
    "F4": 0.5,
}


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


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    return default


def _require(cfg: dict[str, Any], source: str, *keys: str) -> Any:
    value = _get(cfg, *keys)
    if value is None:
        raise PlanError(
            f"{source}:{keys[0]}",
            "missing from config.json",
            f"add '{keys[0]}' (the model's {keys[0].replace('_', ' ')}) or use a catalog name",
        )
    return value


def _quant_from_config(qcfg: dict[str, Any] | None, model_type: str) -> QuantSpec | None:
    if not qcfg:
        return None
    method = str(qcfg.get("quant_method", "")).lower()
    return quant_from_name(method, qcfg, model_type)


def quant_from_name(method: str, qcfg: dict[str, Any] | None = None, model_type: str = "") -> QuantSpec | None:
    """Map a quantization method (config.json or ``--quantization``) to bytes."""
    qcfg = qcfg or {}
    method = method.lower().replace("-", "_")
    if method in ("", "none"):
        return None
    if method in ("fp8", "fbgemm_fp8", "modelopt", "ptpc_fp8"):
        block = qcfg.get("weight_block_size")
        if block:
            return QuantSpec("fp8", 8, group_size=int(block[0]) * int(block[1]), scale_bytes=4)
        return QuantSpec("fp8", 8)
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin", "marlin"):
        bits = int(qcfg.get("bits", qcfg.get("w_bit", 4)))
        group = int(qcfg.get("group_size", qcfg.get("q_group_size", 128)))
        group = max(0, group)
        # fp16 scale per group + packed zero point (bits/8) per group.
        return QuantSpec(method.split("_")[0], bits, group, 2 + bits / 8)
    if method in ("compressed_tensors",):
        bits, group, scale = 8, 0, 0.0
        for grp in (qcfg.get("config_groups") or {}).values():
            weights = grp.get("weights") or {}
            bits = int(weights.get("num_bits", bits))
            strategy = weights.get("strategy", "channel")
            if strategy == "group" and weights.get("group_size"):
                group = int(weights["group_size"])
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
        "--quantization",
        f"unknown quantization method '{method}'",
        "use one of fp8, awq, gptq, compressed-tensors, w4a16, int8, mxfp4, bitsandbytes, nvfp4",
    )


def spec_from_config(cfg: dict[str, Any], name: str, source: str = "config.json") -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed config.json."""
    if not isinstance(cfg, dict):
        raise PlanError(source, "is not a JSON object", "point --model at a Hugging Face model folder")
    try:
        return _spec_from_config(cfg, name, source)
    except PlanError:
        raise
    except (TypeError, ValueError) as exc:
        raise PlanError(source, f"holds a value of the wrong type ({exc})", "fix config.json") from exc


def _spec_from_config(cfg: dict[str, Any], name: str, source: str) -> ModelSpec:
    top = cfg
    vision_params = int(cfg.get("vision_params", 0) or 0)
    if "text_config" in cfg and isinstance(cfg["text_config"], dict):
        merged = dict(cfg["text_config"])
        for key in ("quantization_config", "torch_dtype", "tie_word_embeddings"):
            if key in cfg and key not in merged:
                merged[key] = cfg[key]
        cfg = merged
    model_type = str(_get(cfg, "model_type", default=top.get("model_type", "unknown")))

    hidden = int(_require(cfg, source, "hidden_size", "n_embd", "d_model"))
    heads = int(_require(cfg, source, "num_attention_heads", "n_head"))
    layers = int(_require(cfg, source, "num_hidden_layers", "n_layer"))
    vocab = int(_require(cfg, source, "vocab_size"))
    kv_heads = int(_get(cfg, "num_key_value_heads", "num_kv_heads", default=heads))
    if cfg.get("multi_query"):
        kv_heads = 1
    head_dim = int(_get(cfg, "head_dim", default=0) or hidden // heads)
    kv_lora = int(_get(cfg, "kv_lora_rank", default=0) or 0)
    experts = int(_get(cfg, "n_routed_experts", "num_local_experts", "num_experts", default=0) or 0)
    inter = int(_get(cfg, "intermediate_size", "ffn_dim", "n_inner", default=0) or 0)
    moe_inter = int(_get(cfg, "moe_intermediate_size", default=0) or 0)
    if experts and not moe_inter:
        moe_inter = inter
    if not inter:
        inter = moe_inter or 4 * hidden
    if heads <= 0 or hidden <= 0 or layers <= 0 or vocab <= 0:
        raise PlanError(f"{source}:num_hidden_layers", "sizes must be positive", "fix config.json")

    layer_types: tuple[str, ...] = ()
    raw_types = cfg.get("layer_types")
    window = int(_get(cfg, "sliding_window", default=0) or 0)
    if isinstance(raw_types, list) and len(raw_types) == layers:
        layer_types = tuple("sliding" if "sliding" in str(t) else "full" for t in raw_types)
    elif window and model_type.startswith("gemma2"):
        layer_types = tuple("sliding" if i % 2 == 0 else "full" for i in range(layers))
    elif window and model_type.startswith("gemma3"):
        pattern = int(cfg.get("sliding_window_pattern", 6))
        layer_types = tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(layers))
    elif window and model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        if cfg.get("use_sliding_window"):
            max_window_layers = int(cfg.get("max_window_layers", layers))
            layer_types = tuple("sliding" if i >= max_window_layers else "full" for i in range(layers))
        window = 0 if not layer_types else window
    if not layer_types and not window:
        window = 0

    first_dense = int(_get(cfg, "first_k_dense_replace", default=0) or 0)
    step = int(_get(cfg, "decoder_sparse_step", "moe_layer_freq", default=1) or 1)
    mlp_only = cfg.get("mlp_only_layers") or []
    if mlp_only:
        first_dense = max(first_dense, len(mlp_only))
    shared = int(_get(cfg, "n_shared_experts", "num_shared_experts", default=0) or 0)
    shared_inter = int(_get(cfg, "shared_expert_intermediate_size", default=0) or 0)
    if shared_inter and not shared:
        shared = 1
    if shared and not shared_inter:
        shared_inter = moe_inter * shared

    rope_dim = int(_get(cfg, "qk_rope_head_dim", default=0) or 0) or int(
        head_dim * float(cfg.get("partial_rotary_factor", 1.0))
    )
    max_pos = int(_get(cfg, "max_position_embeddings", "n_positions", "max_sequence_length", default=2048))
    dtype = str(_get(cfg, "torch_dtype", "dtype", default="bfloat16")).replace("torch.", "")
    if dtype not in DTYPE_BYTES:
        dtype = "bfloat16"
    tie = bool(cfg.get("tie_word_embeddings", top.get("tie_word_embeddings", False)))
    bias = bool(cfg.get("attention_bias", False)) or model_type in ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl")
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
        q_lora_rank=int(_get(cfg, "q_lora_rank", default=0) or 0),
        qk_rope_head_dim=int(_get(cfg, "qk_rope_head_dim", default=0) or 0),
        qk_nope_head_dim=int(_get(cfg, "qk_nope_head_dim", default=0) or 0),
        v_head_dim=int(_get(cfg, "v_head_dim", default=0) or 0),
        num_experts=experts,
        num_experts_per_tok=int(_get(cfg, "num_experts_per_tok", "experts_per_token", default=0) or 0),
        moe_intermediate_size=moe_inter,
        num_shared_experts=shared,
        shared_expert_intermediate_size=shared_inter,
        first_dense_layers=first_dense,
        moe_layer_step=step,
        sliding_window=window,
        layer_types=layer_types,
        rope_dim=rope_dim,
        quant=_quant_from_config(top.get("quantization_config") or cfg.get("quantization_config"), model_type),
        vision_params=vision_params,
        source=source,
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


def read_safetensors_bytes(folder: Path, num_layers: int) -> dict[str, int] | None:
    """Sum tensor bytes per model part from safetensors headers (no tensor loaded)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    totals: dict[str, int] = {"embed": 0, "head": 0, "layer": 0, "vision": 0}
    for path in files:
        with path.open("rb") as handle:
            raw = handle.read(8)
            if len(raw) != 8:
                raise PlanError(str(path), "not a safetensors file (shorter than 8 bytes)", "re-download it")
            (length,) = struct.unpack("<Q", raw)
            if length > 100 * 1024 * 1024:
                raise PlanError(str(path), "safetensors header larger than 100 MiB", "re-download it")
            try:
                header = json.loads(handle.read(length))
            except ValueError as exc:
                raise PlanError(str(path), f"unreadable safetensors header ({exc})", "re-download it") from exc
        for tensor, meta in header.items():
            if tensor == "__metadata__" or not isinstance(meta, dict):
                continue
            try:
                start, end = meta["data_offsets"]
            except (KeyError, ValueError, TypeError) as exc:
                raise PlanError(str(path), f"tensor '{tensor}' has no valid data_offsets", "re-download it") from exc
            part = _classify(tensor, num_layers)
            if part is not None:
                totals[part] += int(end) - int(start)
    return totals


def load_model(model: str) -> ModelSpec:
    """Resolve ``model`` (a folder with config.json, or a catalog name)."""
    from vllm_fleet.catalog import MODELS, lookup_model

    path = Path(model).expanduser()
    if path.is_dir():
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise PlanError("--model", f"{path} has no config.json", "point --model at the model folder")
        try:
            cfg = json.loads(cfg_path.read_text())
        except ValueError as exc:
            raise PlanError("--model", f"{cfg_path} is not valid JSON ({exc})", "re-download the model") from exc
        spec = spec_from_config(cfg, name=str(path), source=str(cfg_path))
        file_bytes = read_safetensors_bytes(path, spec.num_layers)
        if file_bytes is not None:
            spec = _with_file_bytes(spec, file_bytes)
        return spec
    if path.is_file() and path.name.endswith(".json"):
        try:
            cfg = json.loads(path.read_text())
        except ValueError as exc:
            raise PlanError("--model", f"{path} is not valid JSON ({exc})", "fix or re-download config.json") from exc
        return spec_from_config(cfg, name=str(path), source=str(path))
    cfg = lookup_model(model)
    if cfg is None:
        close = [n for n in MODELS if model.lower().split("/")[-1][:6] in n.lower()][:3]
        hint = f"did you mean {', '.join(close)}?" if close else "run 'vllm-fleet models' for the catalog"
        raise PlanError("--model", f"'{model}' is neither a folder with config.json nor a catalog model", hint)
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
