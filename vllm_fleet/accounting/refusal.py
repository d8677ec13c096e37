"""The refusals vLLM makes at startup before any memory is counted: a dtype or quantization
the GPU cannot run (its compute capability), or a combination vLLM rejects.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

from vllm_fleet.accounting.base import (
    CURRENT_VLLM,
)
from vllm_fleet.accounting.settings import Device
from vllm_fleet.errors import PlanError
from vllm_fleet.model.quantization import ALLOW_DEPRECATED, QuantChoice, resolve_quantization, supported_quantization
from vllm_fleet.model.spec import ModelSpec

# vLLM's QuantizationConfig.get_min_capability() (compute capability x 10) of the class vLLM
# builds for each method (get_quantization_config) once its overrides chose it: below it vLLM
# refuses to start ("The quantization method X is not supported for the current GPU").
QUANT_MIN_CAPABILITY: dict[str, int] = {
    "fp8": 75, "fbgemm_fp8": 80, "fp_quant": 100, "modelopt": 80, "modelopt_fp4": 75, "modelopt_mxfp8": 80,
    "modelopt_mixed": 75, "mxfp8": 80, "mxfp4": 80, "gpt_oss_mxfp4": 80, "awq": 75, "awq_marlin": 75,
    "auto_awq": 75, "gptq": 60, "gptq_marlin": 60, "auto_gptq": 60, "compressed-tensors": 70, "experts_int8": 80,
    "moe_wna16": 70, "torchao": 75, "quark": 70, "inc": 60, "humming": 75, "online": 75, "fp8_per_tensor": 75,
    "fp8_per_block": 75, "fp8_per_channel": 75, "int8_per_channel_weight_only": 75, "nvfp4_per_token": 75,
    "deepseek_v4_fp8": 75,
}  # fmt: skip
# OnlineQuantizationConfig's minimum: what an online shorthand (fp8, mxfp4, mxfp8 without a
# checkpoint config) runs as.
ONLINE_MIN_CAPABILITY = 75


def min_capability(choice: QuantChoice) -> int | None:
    """The compute capability vLLM needs for ``choice`` (None: no minimum known)."""
    if choice.method is None:
        return None
    if choice.online:
        return ONLINE_MIN_CAPABILITY
    return QUANT_MIN_CAPABILITY.get(choice.method)


def vllm_refusal(
    spec: ModelSpec,
    device: Device,
    dtype: str = "auto",
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    vllm_version: str = CURRENT_VLLM,
) -> PlanError | None:
    """Why vLLM would refuse to start ``spec`` with these options on ``device``, or None:
    bfloat16 below compute capability 8.0 (``CudaPlatform.check_if_supports_dtype``; with
    ``auto`` vLLM falls back to float16 itself), the quantization vLLM resolves on this device
    (``resolve_quantization``: the checkpoint's method after vLLM's overrides, e.g. ModelOpt
    NVFP4 is modelopt_fp4) below its minimum capability (``VllmConfig._get_quantization_config``),
    and KV cache dtypes no attention backend takes (MLA: no fp8_e5m2 backend on CUDA, and only
    the model dtype on the CPU)."""
    cc = device.compute_capability
    choice = None
    if quantization is None or quantization in supported_quantization(vllm_version) or spec.quant_config is not None:
        try:
            choice = resolve_quantization(
                spec,
                quantization,
                device="cpu" if device.kind == "cpu" else device.kind,
                capability=None if device.kind == "cpu" else cc,
                vllm_version=vllm_version,
                extra_args=(ALLOW_DEPRECATED,),  # the opt-in is checked once, before the GPUs
            )
        except PlanError as err:
            return err
    if device.kind == "cuda":
        if dtype == "bfloat16" and cc < 80:
            return PlanError(
                "--dtype",
                f"bfloat16 needs compute capability 8.0, {device.name} has {cc / 10:.1f} (vLLM refuses it)",
                "use --dtype float16, or auto (vLLM then runs the model in float16 there)",
            )
        need = min_capability(choice) if choice is not None else None
        if choice is not None and need is not None and cc < need:
            method = choice.method
            shown = (
                method if method == quantization or not quantization else f"{method} ({quantization} as vLLM runs it)"
            )
            from_flag = bool(quantization) and choice.source != "quantization_config"
            where = "--quantization" if from_flag else "--model"
            fix = (
                "drop --quantization, or plan GPUs of that capability"
                if from_flag
                else "serve the unquantized (or a GPTQ) checkpoint there, or plan GPUs of that capability"
            )
            return PlanError(
                where,
                f"{shown} weights need compute capability {need / 10:.1f}, {device.name} has {cc / 10:.1f}"
                " (vLLM refuses it)",
                fix,
            )
        if spec.is_mla and kv_cache_dtype == "fp8_e5m2":
            return PlanError(
                "--kv-cache-dtype",
                "fp8_e5m2 has no MLA attention backend in vLLM (MLA models such as DeepSeek)",
                "use --kv-cache-dtype fp8 (e4m3) or auto",
            )
    if device.kind == "cpu" and spec.is_mla and kv_cache_dtype not in ("auto", "bfloat16", "float16"):
        return PlanError(
            "--kv-cache-dtype",
            f"{kv_cache_dtype} is not a KV cache dtype of vLLM's CPU MLA backend (it keeps the model dtype)",
            "use --kv-cache-dtype auto",
        )
    return None
