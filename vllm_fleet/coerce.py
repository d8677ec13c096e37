"""One value checked and typed as its declaration says, wherever it is written: an inventory
variable (vllm_fleet/inventory/interface.py), a wish of the Ansible filter, or a key of one
``vllm_fleet_models`` entry (vllm_fleet/planning/allocate.py). ``field`` is what the error names
(``vllm_fleet_max_loras``, ``vllm_fleet_models[1] (qwen).max_loras``)."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from vllm_fleet import schema
from vllm_fleet.errors import PlanError

JSON_EXAMPLE = "{method: ngram, num_speculative_tokens: 3}"
KINDS = ("bool", "int", "float", "choice", "json", "str")


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


def check_typed(obj: Any, field: Callable[[str], str], kinds: tuple[str, ...] = KINDS) -> None:
    """The declared options an already typed object (``Wishes``, ``Settings``) holds, within
    their declarations: a Python caller that builds one by hand meets the same bounds and
    choices as an inventory. None passes (unset); ``field`` names the option in the error
    (its flag for Settings, its bare name for Wishes). Booleans are not numbers here."""
    for d in schema.declared():
        raw = getattr(obj, d.name, None)
        if raw is None or d.kind not in kinds:
            continue
        how, name = d.option, field(d.name)
        if d.kind in ("int", "float"):
            number = isinstance(raw, int | float) and not isinstance(raw, bool)
            if d.kind == "int" and not isinstance(raw, int):
                number = False
            low, high = how.minimum, how.maximum
            if d.kind == "int" and low == 1 and (not number or raw < 1):
                raise PlanError(name, f"must be a positive integer, got {raw!r}", f"pass {name} 1 or more, or omit it")
            if not number or not math.isfinite(raw) or (low is not None and raw < low):
                span = f"from {_num(low)}" if low is not None else ""
                span += f" to {_num(high)}" if high is not None else ""
                raise PlanError(name, f"must be a number {span}, got {raw!r}".replace("  ", " "), "e.g. the default")
            if high is not None and raw > high:
                raise PlanError(
                    name, f"{raw:,} is above {_num(high)}, the largest the planner accepts", f"use {_num(high)} or less"
                )
            if how.choices and _num(raw) not in {str(c) for c in how.choices}:
                allowed = ", ".join(str(c) for c in how.choices)
                raise PlanError(name, f"must be one of {allowed}, got {raw!r}", f"use one of {allowed}")
        elif d.kind == "bool" and not isinstance(raw, bool):
            raise PlanError(name, f"must be true or false, got {raw!r}", "write true or false")
        elif d.kind == "choice" and str(raw) not in {str(c) for c in how.choices}:
            raise PlanError(name, f"must be one of {list(how.choices)}, got {raw!r}", f"use one of {list(how.choices)}")
        elif d.kind == "json" and not isinstance(raw, Mapping):
            raise PlanError(name, f"must be a mapping, got {raw!r}", f"e.g. {JSON_EXAMPLE}")
