"""Quantization as vLLM resolves it: the --quantization names each release accepts, the
checkpoint's own config files, vLLM's overrides (Marlin, MoE WNA16) and the flag checks.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_fleet.errors import PlanError
from vllm_fleet.model.values import _kind, _show

if TYPE_CHECKING:
    from vllm_fleet.model.spec import ModelSpec


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
