"""A model's context length as vLLM derives it (``_get_and_verify_max_len``, 0.32), and vLLM's
check of an explicit ``--max-model-len`` against it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_fleet.errors import PlanError
from vllm_fleet.model.quantization import _env_true
from vllm_fleet.model.values import MAX_POSITIONS, _as_int, _get, _show

if TYPE_CHECKING:
    from vllm_fleet.model.spec import ModelSpec

__all__ = ["check_max_model_len"]

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


# The RoPE types vLLM 0.32's get_rope builds (model_executor/layers/rotary_embedding/__init__.py);
# any other raises "Unknown RoPE scaling type" when the model loads.
ROPE_TYPES = (
    "default", "bailing_mrope", "proportional", "llama3", "mllama4", "linear", "ntk", "dynamic", "yarn",
    "deepseek_yarn", "deepseek_llama_scaling", "longrope", "openpangu",
)  # fmt: skip


def _rope_parameters(cfg: Mapping[str, Any], source: str = "config.json") -> list[Mapping[str, Any]]:
    """The RoPE parameter sets (one per layer type when nested), as vLLM iterates them; what
    vLLM or transformers refuse to load is refused here with their reason."""
    raw = _get(cfg, "rope_parameters", "rope_scaling")
    if not raw:  # transformers reads an empty or false value as none (rope_scaling or rope_parameters)
        return []
    if not isinstance(raw, Mapping):
        raise PlanError(
            f"{source}:rope_scaling",
            f"{_show(raw)} is not a mapping (transformers cannot read the RoPE parameters of the config)",
            'write it as {"rope_type": ..., "factor": ...}, or remove it',
        )
    if not raw:
        return []
    if all(str(k).endswith("attention") for k in raw) and all(isinstance(v, Mapping) for v in raw.values()):
        params = [v for v in raw.values() if isinstance(v, Mapping) and v]
    else:
        params = [raw]
    for rp in params:
        modern, legacy = rp.get("rope_type"), rp.get("type")
        if modern is not None and legacy is not None and modern != legacy and (legacy, modern) not in _ROPE_ALIASES:
            raise PlanError(
                f"{source}:rope_scaling",
                f"Found conflicts between 'rope_type={modern}' (modern field) and 'type={legacy}' (legacy field): "
                "vLLM refuses the config (patch_rope_parameters)",
                "keep one of them",
            )
        rope_type = _rope_type(rp)
        if rope_type not in ROPE_TYPES and cfg.get("dual_chunk_attention_config") is None:
            raise PlanError(
                f"{source}:rope_scaling.rope_type",
                f"{rope_type!r}: vLLM raises 'Unknown RoPE scaling type {rope_type}' when it loads the model "
                "(get_rope)",
                f"use one of {', '.join(ROPE_TYPES)}",
            )
    return params


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
    params = _rope_parameters(cfg, source)
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


# Legacy (type, rope_type) pairs patch_rope_parameters accepts together.
_ROPE_ALIASES = {("su", "longrope"), ("mrope", "default")}


def _rope_type(rp: Mapping[str, Any]) -> str:
    """The RoPE type as vLLM reads it after ``patch_rope_parameters`` (legacy ``type``
    key, ``su`` -> ``longrope``, ``mrope`` -> ``default``, ``telechat3-yarn`` -> ``yarn``)."""
    rope_type = str(rp.get("rope_type", rp.get("type", "default")))
    return {"su": "longrope", "mrope": "default", "telechat3-yarn": "yarn"}.get(rope_type, rope_type)


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
