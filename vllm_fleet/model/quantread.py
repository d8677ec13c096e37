"""A checkpoint's quantization config read as vLLM 0.32 reads it: where config.json keeps it
(``quantization_config``, ``compression_config``, text_config's), the method vLLM settles on
(ModelOpt's producer form, compressed_tensors' spelling), and the bytes of its weights per
method (:func:`quant_from_name`, also for a ``--quantization`` flag).

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from vllm_fleet.errors import PlanError
from vllm_fleet.model.quantization import _WEIGHT_ONLY_FAMILY, _modelopt_algo
from vllm_fleet.model.quantspec import QuantSpec, ct_group_spec, modelopt_spec, mxfp8_spec
from vllm_fleet.model.values import _as_int, _kind, _show


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


# config.json's ModelOpt producer form ({"producer": {"name": "modelopt"}, "quantization": {...}}):
# the algorithms vLLM 0.32's _normalize_quantization_config gives a method; it refuses the others.
_PRODUCER_METHOD = {
    "FP8": "modelopt", "FP8_PER_CHANNEL_PER_TOKEN": "modelopt", "FP8_PB_WO": "modelopt", "NVFP4": "modelopt_fp4",
}  # fmt: skip


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
            if algo not in _PRODUCER_METHOD:
                raise PlanError(
                    f"{where}.quantization.quant_algo",
                    f"{_show(inner['quant_algo'])}: vLLM refuses this ModelOpt algorithm in config.json's producer "
                    f"form (Unknown ModelOpt quant algo; it takes {', '.join(_PRODUCER_METHOD)} there)",
                    'write the flat form ({"quant_method": "modelopt", "quant_algo": ...}) as ModelOpt exports it, '
                    "or keep the nested form in hf_quant_config.json only",
                )
            cfg["quant_method"] = _PRODUCER_METHOD[algo]
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


def _ct_spec(qcfg: Mapping[str, Any], prefix: str) -> QuantSpec | None:
    """compressed-tensors per layer (``CompressedTensorsConfig.from_config``): each config
    group's weights scheme for its targets (groups that target only an Attention class are
    dropped, as vLLM drops them; a target named twice keeps its first place and takes the later
    group's scheme, as vLLM's target map does), and the ignore list; the first target's bytes
    describe the checkpoint where one figure is wanted. None without any weights group."""
    groups = qcfg.get("config_groups") or {}
    if not isinstance(groups, Mapping):
        raise PlanError(f"{prefix}.config_groups", f"must be an object, got {_kind(groups)}", "fix config.json")
    ignore = qcfg.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(i, str) for i in ignore):
        raise PlanError(f"{prefix}.ignore", f"must be a list of module names, got {_kind(ignore)}", "fix config.json")
    targets: dict[str, QuantSpec] = {}
    for name, grp in groups.items():
        where = f"{prefix}.config_groups.{name}"
        if not isinstance(grp, Mapping):
            raise PlanError(where, f"must be an object, got {_kind(grp)}", "fix config.json")
        named = grp.get("targets")
        if not isinstance(named, list) or not named or not all(isinstance(t, str) for t in named):
            raise PlanError(
                f"{where}.targets",
                "is missing" if named is None else "must be a non-empty list of module or class names",
                "fix config.json (vLLM reads every group's targets)",
            )
        if len(named) == 1 and named[0].endswith("Attention"):
            continue
        weights = grp.get("weights")
        if not isinstance(weights, Mapping):
            raise PlanError(
                f"{where}.weights",
                f"must be an object, got {_kind(weights)} (vLLM validates it as QuantizationArgs and refuses)",
                "fix config.json",
            )
        if str(weights.get("actorder") or "").lower() in ("group", "dynamic"):
            raise PlanError(
                f"{where}.weights.actorder",
                f"{_show(weights['actorder'])}: compressed-tensors group/dynamic activation ordering is no longer "
                "supported by vLLM",
                "use a checkpoint with static or weight activation ordering, or none",
            )
        bits = _as_int(weights.get("num_bits", 8), f"{where}.weights.num_bits", 1, 64, "use 2, 3, 4 or 8")
        if bits not in (2, 3, 4, 8):
            raise PlanError(
                f"{where}.weights.num_bits",
                f"{bits}-bit weights are not a compressed-tensors format",
                "use one of [2, 3, 4, 8]",
            )
        fmt = ct_group_spec(weights, bits, f"{where}.weights")
        targets.update(dict.fromkeys(named, fmt))
    if not targets:
        return None
    first = next(iter(targets.values()))
    return replace(first, targets=tuple(targets.items()), ignore=tuple(ignore))


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
    if method.startswith("modelopt") and where is not None and qcfg:
        # The checkpoint's own config: per-algorithm bytes, exclusions, MIXED_PRECISION's table.
        flat_mixed = "quantization" not in qcfg and _modelopt_algo(qcfg) == "MIXED_PRECISION"
        if flat_mixed and "quantized_layers" not in qcfg:
            return None  # config.json without the table: vLLM reads hf_quant_config.json's (accounting's _quant)
        return modelopt_spec(qcfg, prefix)
    if method in ("modelopt_mxfp8", "mxfp8") and where is not None:
        return mxfp8_spec(qcfg, prefix)
    if method == "modelopt_mixed":
        return None  # per-layer without its table: the model dtype's bytes (an upper bound)
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
        return _ct_spec(qcfg, prefix)
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
