"""One value checked and typed as its declaration says, wherever it is written: an inventory
variable (vllm_fleet/inventory/interface.py), a wish of the Ansible filter, or a key of one
``vllm_fleet_models`` entry (vllm_fleet/planning/allocate.py). ``field`` is what the error names
(``vllm_fleet_max_loras``, ``vllm_fleet_models[1] (qwen).max_loras``)."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from typing import Any

from vllm_fleet import schema
from vllm_fleet.errors import PlanError

JSON_EXAMPLE = "{method: ngram, num_speculative_tokens: 3}"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def value(
    field: str,
    kind: str,
    raw: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] = (),
    example: str = "",
) -> Any:
    """``raw`` as a ``kind`` (bool, int, float, json, choice, str) within its bounds or choices."""

    def bad(problem: str, fix: str) -> PlanError:
        return PlanError(field, problem, fix)

    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("true", "yes", "on", "1"):
            return True
        if text in ("false", "no", "off", "0"):
            return False
        raise bad(f"{raw!r} is not true or false", "write true or false")
    if kind in ("int", "float"):
        if isinstance(raw, bool):
            raise bad(f"{raw!r} is a boolean, not a number", "write a number")
        try:
            number = float(raw) if kind == "float" else int(str(raw).strip())
        except (TypeError, ValueError):
            raise bad(f"{raw!r} is not {'a number' if kind == 'float' else 'an integer'}", "write a number") from None
        if not math.isfinite(number):
            raise bad(f"{raw!r} is not a finite number", "write a number")
        if minimum is not None and number < minimum:
            raise bad(f"{number} is below {_num(minimum)}", f"use {_num(minimum)} or more")
        if maximum is not None and number > maximum:
            raise bad(f"{number} is above {_num(maximum)}", f"use {_num(maximum)} or less")
        if choices and _num(number) not in choices:
            raise bad(f"{_num(number)} is not one of {', '.join(choices)}", f"use one of {', '.join(choices)}")
        return number
    if kind == "json":
        # A mapping option (vllm serve takes it as JSON): a YAML mapping, or its JSON text.
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                raise bad(f"{raw!r} is neither a mapping nor JSON", f"e.g. {example}") from None
        if not isinstance(raw, Mapping):
            raise bad(f"must be a mapping, got {raw!r}", f"e.g. {example}")
        return copy.deepcopy(dict(raw))
    if isinstance(raw, list | tuple | Mapping):
        raise bad(f"must be a single value, got a {type(raw).__name__}", "write one value, not a list or a mapping")
    text = str(raw)
    if kind == "choice":
        text = text.strip().lower() if isinstance(raw, bool | str) else text
        if text not in choices:
            raise bad(f"must be one of {list(choices)}, got {raw!r}", f"use {' or '.join(choices)}")
    if "\n" in text or "\r" in text or "\x00" in text:
        raise bad("holds a newline or NUL", "write it on one line")
    return text


def declared(name: str, raw: Any, field: str) -> Any:
    """The declared option ``name`` (vllm_fleet/schema.py) from ``raw``."""
    d = schema.by_name()[name]
    how = d.option
    return value(
        field,
        d.kind,
        raw,
        minimum=how.minimum,
        maximum=how.maximum,
        choices=tuple(str(c) for c in how.choices),
        example=JSON_EXAMPLE if d.kind == "json" else "",
    )
