"""Names the inventory chooses that end up in files on the nodes (the launch's
environment file, the unit's Description, vLLM's argument list): checked before
anything is rendered, so no value can break out of the line it is written on.
"""

from __future__ import annotations

import re

from vllm_fleet.errors import PlanError

SERVED_NAME_MAX = 128
# A letter or digit first (so vLLM's parser never reads the name as an option), then
# letters, digits and . _ - / : (Hub names such as meta-llama/Llama-3.1-8B, tags such as name:v2).
_SERVED_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:/-]{{0,{SERVED_NAME_MAX - 1}}}")


def check_served_name(name: object) -> str:
    """``name`` when it is a valid served model name, else a PlanError that names
    ``vllm_fleet_served_model_name``."""
    if not isinstance(name, str) or not _SERVED_NAME.fullmatch(name):
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        raise PlanError(
            "vllm_fleet_served_model_name",
            f"{shown} is not a served model name",
            f"use at most {SERVED_NAME_MAX} letters, digits and . _ - / : starting with a letter or digit,"
            " e.g. meta-llama/Llama-3.1-8B",
        )
    return name
