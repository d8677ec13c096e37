"""Reading config.json's values safely: bounds far above any real model and far below what a
typo or a hostile file can put there, and typed getters that name the key they refuse.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from vllm_fleet.errors import PlanError

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
