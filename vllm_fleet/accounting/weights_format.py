"""The format the served weights are stored in, as vLLM settles it from the checkpoint's
quantization config, the files beside it and ``--quantization`` (``get_quant_config``).

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

from vllm_fleet.errors import PlanError
from vllm_fleet.model.quantization import _modelopt_algo, quant_file_config, quant_flag_matches
from vllm_fleet.model.quantread import quant_from_name
from vllm_fleet.model.quantspec import QuantSpec, modelopt_spec
from vllm_fleet.model.spec import ModelSpec


def weights_format(spec: ModelSpec, flag: str | None) -> QuantSpec | None:
    """How the served weights are stored: the checkpoint's own format (config.json, or the file
    vLLM reads when config.json leaves the table out), the method's own file for a
    ``--quantization`` flag on a checkpoint without a quantization config, or the flag's
    format; None for the model dtype."""
    if spec.quant is None and spec.quant_config is not None and _modelopt_algo(spec.quant_config) == "MIXED_PRECISION":
        # config.json without MIXED_PRECISION's table: vLLM reads hf_quant_config.json's
        # (get_quant_config's file path) and refuses the checkpoint without one. A config.json
        # read alone has no folder to look in: the model dtype's bytes (an upper bound).
        table = quant_file_config(spec, "modelopt_mixed") if spec.folder else None
        if spec.folder and table is None:
            raise PlanError(
                f"{spec.folder.rstrip('/')}/config.json:quantization_config.quantized_layers",
                "MIXED_PRECISION names no per-layer table and the folder has no hf_quant_config.json "
                "(vLLM: Cannot find the config file for modelopt_mixed)",
                "copy the checkpoint's hf_quant_config.json into the model folder",
            )
        if table is not None:
            where = f"{spec.name.rstrip('/')}/{table[0]}"
            if _modelopt_algo(table[1]) != "MIXED_PRECISION":
                raise PlanError(
                    f"{where}.quantization.quantized_layers",
                    "is missing: config.json says MIXED_PRECISION and vLLM reads the table from this file",
                    "use the checkpoint's own hf_quant_config.json",
                )
            return modelopt_spec(table[1], where)
    if flag and spec.quant is not None and quant_flag_matches(flag, spec):
        return spec.quant  # vLLM loads the checkpoint's own format (gptq_marlin, moe_wna16, ModelOpt...)
    if flag and spec.quant_config is None:
        try:
            found = quant_file_config(spec, flag)
        except PlanError:
            found = None
        if found is not None:  # the method's own file (quantize_config.json, hf_quant_config.json)
            return quant_from_name(flag, found[1], spec.model_type, where=f"{spec.name.rstrip('/')}/{found[0]}")
    if flag:
        named = quant_from_name(flag, None, spec.model_type)
        if spec.quant is not None and named is not None and spec.quant.method == named.method:
            return spec.quant
        return named
    return spec.quant
